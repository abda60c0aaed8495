// edl/mesh/device.hpp
// One device of a mesh, as device code sees it inside mesh.run(body): its id, its
// coordinates, and the backend its collectives go through. The JAX analogue is the
// implicit device of a shard_map body, where lax.axis_index("tp") gives its coordinate.
//
// A Device is made by the backend for the duration of one run(); device code receives it
// by reference and passes it on to the collectives (mesh/collectives.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <edl/mesh/backend.hpp>
#include <edl/mesh/memory.hpp>
#include <edl/mesh/mesh_shape.hpp>

namespace edl {

struct MeshContext;  // mesh/mesh.hpp

class Device {
 public:
  Device(std::int64_t id, const MeshShape& shape, MemoryTracker& memory, CollectiveBackend& backend,
         MeshContext* context = nullptr)
      : id_(id), coords_(shape.coords(id)), shape_(&shape), memory_(&memory), backend_(&backend), ctx_(context) {}

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  /// Row-major device number over the mesh axes (MeshShape::coords).
  std::int64_t id() const noexcept { return id_; }
  /// One coordinate per mesh axis, in mesh order.
  const std::vector<std::int64_t>& coords() const noexcept { return coords_; }
  const MeshShape& shape() const noexcept { return *shape_; }
  /// Devices in the mesh.
  std::int64_t mesh_size() const noexcept { return shape_->size(); }

  /// This device's coordinate on a named axis (jax.lax.axis_index); unknown names throw
  /// errc::unknown_axis naming the axis and the mesh's axes.
  std::int64_t axis_index(std::string_view axis) const { return coords_[shape_->axis_index(axis, "axis_index")]; }
  /// Size of a named axis (jax.lax.psum(1, axis)).
  std::int64_t axis_size(std::string_view axis) const { return shape_->sizes()[shape_->axis_index(axis, "axis_size")]; }

  CollectiveBackend& backend() const noexcept { return *backend_; }
  MemoryTracker& memory() const noexcept { return *memory_; }
  /// The mesh this device belongs to (null for devices made outside a Mesh).
  MeshContext* context() const noexcept { return ctx_; }

  /// "device 3 (dp=1, tp=1)", for messages.
  std::string describe() const {
    const std::string c = shape_->describe(id_);
    return "device " + std::to_string(id_) + (c == "()" ? std::string() : " " + c);
  }

 private:
  std::int64_t id_;
  std::vector<std::int64_t> coords_;
  const MeshShape* shape_;
  MemoryTracker* memory_;
  CollectiveBackend* backend_;
  MeshContext* ctx_;
};

}  // namespace edl
