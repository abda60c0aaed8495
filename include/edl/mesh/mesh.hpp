// edl/mesh/mesh.hpp
// Mesh<"dp", "fsdp", "tp", "sp">: a device mesh whose axis names are part of its type, so a
// PartitionSpec naming an axis the mesh lacks is a compile error where both types are known.
// Sizes are run-time values (at most one -1, inferred from the device count).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include <edl/core/fixed_string.hpp>
#include <edl/mesh/memory.hpp>
#include <edl/mesh/mesh_shape.hpp>

namespace edl {

class CollectiveBackend;  // mesh/backend.hpp

/// What every copy of a Mesh shares: the topology, the per-device memory accounting and
/// the backend that runs devices and moves bytes between them. Tensors keep a pointer to
/// it so their shards are accounted on the right mesh for as long as they live.
struct MeshContext {
  MeshShape shape;
  MemoryTracker memory;
  std::shared_ptr<CollectiveBackend> backend;  // set by the mesh backend layer
  explicit MeshContext(MeshShape s) : shape(std::move(s)), memory(shape.size()) {}
};

template <Name... Axes>
class Mesh {
 public:
  static constexpr std::size_t rank = sizeof...(Axes);
  static_assert(rank > 0, "edl::Mesh: a mesh needs at least one axis");
  static constexpr std::array<Name, rank> axis_names{Axes...};

  template <Name A>
  static constexpr bool has_axis = ((A == Axes) || ...);

  template <Name A>
  static constexpr std::size_t axis_index() {
    static_assert(has_axis<A>, "edl::Mesh: this axis name is not one of the mesh's axes");
    std::size_t i = 0;
    for (; i < rank; ++i)
      if (axis_names[i] == A) break;
    return i;
  }

  /// sizes: one per axis; one may be -1 and is inferred from `devices`.
  explicit Mesh(std::array<std::int64_t, rank> sizes, std::int64_t devices = -1)
      : ctx_(std::make_shared<MeshContext>(
            MeshShape(names_vector(), std::vector<std::int64_t>(sizes.begin(), sizes.end()), devices))) {}

  const MeshShape& shape() const noexcept { return ctx_->shape; }
  std::int64_t size() const noexcept { return ctx_->shape.size(); }
  template <Name A>
  std::int64_t axis_size() const { return ctx_->shape.sizes()[axis_index<A>()]; }
  std::int64_t axis_size(std::string_view name) const { return ctx_->shape.axis_size(name); }
  MemoryTracker& memory() const noexcept { return ctx_->memory; }
  const std::shared_ptr<MeshContext>& context() const noexcept { return ctx_; }

 private:
  static std::vector<std::string> names_vector() {
    std::vector<std::string> v;
    for (const auto& n : axis_names) v.emplace_back(n.view());
    return v;
  }
  std::shared_ptr<MeshContext> ctx_;
};

/// The axes EasyDeL meshes use: data, fully-sharded data, tensor and sequence parallel.
using DefaultMesh = Mesh<"dp", "fsdp", "tp", "sp">;

/// EasyDeL's create_mesh(axis_dims): DefaultMesh with one size per axis, -1 inferred.
inline DefaultMesh create_mesh(std::array<std::int64_t, 4> dims, std::int64_t devices = -1) {
  return DefaultMesh(dims, devices);
}

}  // namespace edl
