// edl/tensor/shard_layout.hpp
// Where each device's block of a sharded tensor sits in the global tensor.
//
// JAX's rule: dimension i with axes (a1, a2) is cut into k = size(a1) * size(a2) blocks; a
// device takes block  coord(a1) * size(a2) + coord(a2)  (major axis first). Axes a spec does
// not name replicate: every device along them holds the same block. So on a (dp=2, tp=2) mesh,
// P<"tp", none> over an (8, 6) tensor gives devices (dp=*, tp=0) rows 0-3 and (dp=*, tp=1)
// rows 4-7.
//
// A dimension of n that k does not divide is cut as JAX, GSPMD and torch.chunk cut it: blocks
// of ceil(n / k), the last ones shorter (or empty: 5 rows over 4 devices are 2, 2, 1, 0). A
// device's block (local_shape(d)) is its real part of the tensor, nothing more, so saving,
// loading and the optimizer see no padding; block_shape() is the largest block, the unit a
// collective moves (each device's part padded to it with zeros, see pad_to_block).
//
// A placed layout (placed_on(axis, index)) lives only on the devices whose coordinate on
// `axis` is `index`; the others hold an empty block. This is how one expert of a
// mixture-of-experts layer sits on its expert-parallel rank: expert j of E on ep = j / (E / ep),
// split within those devices by its spec as any tensor (a stacked [E, ...] tensor split over
// "ep" on dimension 0 puts the same bytes on the same devices).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <edl/core/block_rows.hpp>
#include <edl/mesh/mesh_shape.hpp>
#include <edl/tensor/partition_spec.hpp>

namespace edl {

class ShardLayout {
 public:
  ShardLayout() = default;
  /// Validates `spec` against the mesh and `global_shape`; `where` names the tensor in errors.
  ShardLayout(MeshShape mesh, SpecValue spec, std::vector<std::int64_t> global_shape, std::string_view where = "tensor")
      : mesh_(std::move(mesh)), spec_(std::move(spec)), global_(std::move(global_shape)) {
    spec_.validate(mesh_, global_, where);
    local_.resize(global_.size());
    for (std::size_t i = 0; i < global_.size(); ++i) {
      const std::int64_t k = spec_.splits(i, mesh_);
      local_[i] = (global_[i] + k - 1) / k;
      even_ = even_ && global_[i] % k == 0;
    }
  }

  /// This layout restricted to the devices whose coordinate on `axis` is `index`; the spec may
  /// not name `axis` (the tensor is whole along it).
  ShardLayout placed_on(std::string_view axis, std::int64_t index) const {
    ShardLayout l = *this;
    const std::size_t a = mesh_.axis_index(axis, "ShardLayout::placed_on");
    for (const auto& d : spec_.dims)
      for (const auto& n : d)
        EDL_CHECK(n != axis, errc::invalid_argument, "ShardLayout::placed_on", "the spec ", spec_.str(),
                  " splits over \"", axis, "\", so the tensor cannot be placed on one of its coordinates");
    EDL_CHECK(index >= 0 && index < mesh_.sizes()[a], errc::invalid_argument, "ShardLayout::placed_on", "index ",
              index, " is outside axis \"", axis, "\" of size ", mesh_.sizes()[a]);
    l.place_axis_ = static_cast<std::int64_t>(a);
    l.place_index_ = index;
    return l;
  }
  /// Whether device d holds a block (always, unless the layout is placed).
  bool holds(std::int64_t d) const {
    return place_axis_ < 0 || mesh_.coords(d)[static_cast<std::size_t>(place_axis_)] == place_index_;
  }
  bool is_placed() const noexcept { return place_axis_ >= 0; }
  /// Device d's block: its part of the tensor (block_shape() where the split is even, shorter
  /// at the end of an uneven dimension), or zeros where it holds none.
  std::vector<std::int64_t> local_shape(std::int64_t d) const {
    std::vector<std::int64_t> s(local_.size(), 0);
    if (!holds(d)) return s;
    for (std::size_t i = 0; i < s.size(); ++i)
      s[i] = std::clamp<std::int64_t>(global_[i] - block_index(d, i) * local_[i], 0, local_[i]);
    return s;
  }
  /// Elements of device d's block.
  std::int64_t local_elements(std::int64_t d) const {
    std::int64_t n = 1;
    for (auto v : local_shape(d)) n *= v;
    return n;
  }

  const MeshShape& mesh() const noexcept { return mesh_; }
  const SpecValue& spec() const noexcept { return spec_; }
  std::size_t rank() const noexcept { return global_.size(); }
  const std::vector<std::int64_t>& global_shape() const noexcept { return global_; }
  /// The largest block (every block, where each dimension divides by its axes): ceil(n / k)
  /// per dimension. Collectives move blocks of this shape; memory plans count it.
  const std::vector<std::int64_t>& block_shape() const noexcept { return local_; }
  std::int64_t block_elements() const noexcept {
    std::int64_t n = 1;
    for (auto v : local_) n *= v;
    return n;
  }
  /// Whether every dimension divides by its axes (all blocks have block_shape()).
  bool even() const noexcept { return even_; }

  /// Block index of device `d` along dimension `dim` (0 when the dimension is replicated).
  std::int64_t block_index(std::int64_t d, std::size_t dim) const {
    const auto c = mesh_.coords(d);
    std::int64_t b = 0;
    for (const auto& a : spec_.dims[dim]) {
      const std::size_t ax = mesh_.axis_index(a);
      b = b * mesh_.sizes()[ax] + c[ax];
    }
    return b;
  }
  /// Offset of device `d`'s block in the global tensor.
  std::vector<std::int64_t> offset(std::int64_t d) const {
    std::vector<std::int64_t> o(rank());
    for (std::size_t i = 0; i < rank(); ++i) o[i] = block_index(d, i) * local_[i];
    return o;
  }
  /// The lowest device id holding each distinct block: gather reads these and nothing else.
  std::vector<std::int64_t> block_owners() const {
    std::vector<std::int64_t> owners;
    std::vector<std::vector<std::int64_t>> seen;
    for (std::int64_t d = 0; d < mesh_.size(); ++d) {
      if (!holds(d)) continue;
      auto o = offset(d);
      bool dup = false;
      for (const auto& s : seen) dup = dup || s == o;
      if (!dup) {
        seen.push_back(std::move(o));
        owners.push_back(d);
      }
    }
    return owners;
  }

  friend bool operator==(const ShardLayout& a, const ShardLayout& b) {
    return a.mesh_ == b.mesh_ && a.spec_ == b.spec_ && a.global_ == b.global_ && a.place_axis_ == b.place_axis_ &&
           a.place_index_ == b.place_index_;
  }

 private:
  MeshShape mesh_;
  SpecValue spec_;
  std::vector<std::int64_t> global_, local_;  // local_: the largest block, ceil(n / k)
  bool even_ = true;
  std::int64_t place_axis_ = -1, place_index_ = 0;  // placed_on: the axis (-1: none) and its coordinate
};

namespace detail {

/// Copies a block of `shape` (row-major, contiguous) to the front of `out` and zeros the rest:
/// the equal-size part a device gives a collective whose blocks are uneven (the tail zeros
/// pad it to the largest block and add nothing to a sum).
template <class T>
void pad_to_block(std::span<const T> block, std::span<T> out) {
  std::copy(block.begin(), block.end(), out.begin());
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(block.size()), out.end(), T{});
}

/// Copies the block at `offset` of extent `block` between a row-major global buffer of shape
/// `global` and a contiguous block buffer; innermost rows move with memcpy.
template <class T>
void copy_block(T* global_data, std::span<const std::int64_t> global, std::span<const std::int64_t> offset,
                std::span<const std::int64_t> block, T* block_data, bool global_to_block) {
  for (auto e : block)
    if (e == 0) return;  // an empty block (past the end of an uneven dimension)
  for_each_block_row(global, offset, block, [&](std::int64_t g, std::int64_t b, std::int64_t row) {
    T* gp = global_data + g;
    T* bp = block_data + b;
    if (global_to_block) std::memcpy(bp, gp, static_cast<std::size_t>(row) * sizeof(T));
    else std::memcpy(gp, bp, static_cast<std::size_t>(row) * sizeof(T));
  });
}

}  // namespace detail
}  // namespace edl
