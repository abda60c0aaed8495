// edl/mesh/collectives.hpp
// Typed collectives for device code, named as in jax.lax inside shard_map:
//
//   mesh.run([&](Device& dev) {
//     std::vector<float> g = local_grads(dev);
//     psum(dev, g, {"dp", "fsdp"});            // g = sum over the dp x fsdp group
//     float loss = pmean(dev, local_loss, "dp"); // scalars too
//     all_gather(dev, shard, full, "tp");      // full = shards of the tp group, in tp order
//   });
//
// `axes` names the mesh axes the collective runs over: one name ("tp"), a list
// ({"dp", "fsdp"}), or nothing / {} for the whole mesh. The group is the devices that agree
// with the caller on every other axis, ordered row-major over the named axes in mesh order
// (MeshShape::group); a device's position in it is axis_index(dev, axes). An unknown axis
// name is errc::unknown_axis naming it; buffer sizes that do not fit the group are
// errc::shape_mismatch. Buffers are any contiguous range (std::vector, std::span,
// std::array) of a storage type (float, bf16, f16, double, integers); reductions of
// bf16/f16 combine in f32 and round once, in group order, so every member gets the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/mesh/backend.hpp>
#include <edl/mesh/device.hpp>
#include <edl/mesh/mesh_shape.hpp>

namespace edl {

/// The mesh axes a collective runs over; empty means every axis (the whole mesh).
class AxisList {
 public:
  AxisList() = default;
  AxisList(std::initializer_list<std::string_view> names) {
    for (auto n : names) names_.emplace_back(n);
  }
  AxisList(const char* name) : names_{std::string(name)} {}         // NOLINT: "tp" is an AxisList
  AxisList(std::string_view name) : names_{std::string(name)} {}    // NOLINT
  AxisList(const std::string& name) : names_{name} {}               // NOLINT
  AxisList(std::vector<std::string> names) : names_(std::move(names)) {}  // NOLINT

  const std::vector<std::string>& names() const noexcept { return names_; }
  bool empty() const noexcept { return names_.empty(); }

 private:
  std::vector<std::string> names_;
};

namespace detail {

/// The caller's group over `axes`, checking names with `op` as the error's `where`.
inline MeshShape::Group collective_group(const Device& d, const AxisList& axes, const char* op) {
  const MeshShape& shape = d.shape();
  if (axes.empty()) return shape.group(d.id(), std::span<const std::string>(shape.names()));
  for (const auto& a : axes.names()) (void)shape.axis_index(a, op);
  return shape.group(d.id(), std::span<const std::string>(axes.names()));
}

template <class R>
using element_t = std::remove_cv_t<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

template <class R>
concept MutableBuffer = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                        !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>> &&
                        StorageType<element_t<R>>;

template <class R>
concept Buffer = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> && StorageType<element_t<R>>;

template <class T>
concept Scalar = StorageType<T> && !std::ranges::range<T>;

template <MutableBuffer R>
void reduce_in_place(Device& d, R& inout, ReduceOp op, const AxisList& axes, const char* name) {
  using T = element_t<R>;
  const auto g = collective_group(d, axes, name);
  T* p = std::ranges::data(inout);
  d.backend().all_reduce(d, p, p, std::ranges::size(inout), dtype_v<T>, op, g.devices);
}

template <Scalar T>
T reduce_scalar(Device& d, T v, ReduceOp op, const AxisList& axes, const char* name) {
  const auto g = collective_group(d, axes, name);
  d.backend().all_reduce(d, &v, &v, 1, dtype_v<T>, op, g.devices);
  return v;
}

}  // namespace detail

/// inout = op over the group of inout, element by element (jax.lax.psum / pmax / ...).
template <detail::MutableBuffer R>
void all_reduce(Device& d, R&& inout, ReduceOp op, const AxisList& axes = {}) {
  detail::reduce_in_place(d, inout, op, axes, "all_reduce");
}
template <detail::MutableBuffer R>
void psum(Device& d, R&& inout, const AxisList& axes = {}) { detail::reduce_in_place(d, inout, ReduceOp::sum, axes, "psum"); }
template <detail::MutableBuffer R>
void pmean(Device& d, R&& inout, const AxisList& axes = {}) { detail::reduce_in_place(d, inout, ReduceOp::mean, axes, "pmean"); }
template <detail::MutableBuffer R>
void pmax(Device& d, R&& inout, const AxisList& axes = {}) { detail::reduce_in_place(d, inout, ReduceOp::max, axes, "pmax"); }
template <detail::MutableBuffer R>
void pmin(Device& d, R&& inout, const AxisList& axes = {}) { detail::reduce_in_place(d, inout, ReduceOp::min, axes, "pmin"); }

/// Scalar forms: return the reduction of one value per device.
template <detail::Scalar T>
T psum(Device& d, T v, const AxisList& axes = {}) { return detail::reduce_scalar(d, v, ReduceOp::sum, axes, "psum"); }
template <detail::Scalar T>
T pmean(Device& d, T v, const AxisList& axes = {}) { return detail::reduce_scalar(d, v, ReduceOp::mean, axes, "pmean"); }
template <detail::Scalar T>
T pmax(Device& d, T v, const AxisList& axes = {}) { return detail::reduce_scalar(d, v, ReduceOp::max, axes, "pmax"); }
template <detail::Scalar T>
T pmin(Device& d, T v, const AxisList& axes = {}) { return detail::reduce_scalar(d, v, ReduceOp::min, axes, "pmin"); }

/// out = the members' `in` concatenated in group order; out.size() == in.size() * group size
/// (jax.lax.all_gather(x, axes, tiled=True) on a flat buffer).
template <detail::Buffer In, detail::MutableBuffer Out>
void all_gather(Device& d, In&& in, Out&& out, const AxisList& axes = {}) {
  using T = detail::element_t<In>;
  static_assert(std::is_same_v<T, detail::element_t<Out>>, "edl::all_gather: in and out must have the same element type");
  const auto g = detail::collective_group(d, axes, "all_gather");
  const std::size_t n = std::ranges::size(in);
  EDL_CHECK(std::ranges::size(out) == n * static_cast<std::size_t>(g.size()), errc::shape_mismatch, "all_gather",
            "out holds ", std::ranges::size(out), " elements, expected ", n, " x ", g.size(), " devices = ",
            n * static_cast<std::size_t>(g.size()));
  d.backend().all_gather(d, std::ranges::data(in), std::ranges::data(out), n, dtype_v<T>, g.devices);
}

/// Reduces the members' `in` (op, default sum) and keeps this member's chunk: out = chunk
/// `position` of the result; in.size() == out.size() * group size (jax.lax.psum_scatter, tiled).
template <detail::Buffer In, detail::MutableBuffer Out>
void reduce_scatter(Device& d, In&& in, Out&& out, const AxisList& axes = {}, ReduceOp op = ReduceOp::sum) {
  using T = detail::element_t<In>;
  static_assert(std::is_same_v<T, detail::element_t<Out>>, "edl::reduce_scatter: in and out must have the same element type");
  const auto g = detail::collective_group(d, axes, "reduce_scatter");
  const std::size_t m = std::ranges::size(out);
  EDL_CHECK(std::ranges::size(in) == m * static_cast<std::size_t>(g.size()), errc::shape_mismatch, "reduce_scatter",
            "in holds ", std::ranges::size(in), " elements, expected out's ", m, " x ", g.size(), " devices = ",
            m * static_cast<std::size_t>(g.size()));
  d.backend().reduce_scatter(d, std::ranges::data(in), std::ranges::data(out), m, dtype_v<T>, op, g.devices);
}
template <detail::Buffer In, detail::MutableBuffer Out>
void psum_scatter(Device& d, In&& in, Out&& out, const AxisList& axes = {}) {
  reduce_scatter(d, in, out, axes, ReduceOp::sum);
}

/// in and out split into group-size equal chunks; chunk q of out = chunk `position` of
/// member q's in (jax.lax.all_to_all with split_axis = concat_axis = 0, tiled).
template <detail::Buffer In, detail::MutableBuffer Out>
void all_to_all(Device& d, In&& in, Out&& out, const AxisList& axes = {}) {
  using T = detail::element_t<In>;
  static_assert(std::is_same_v<T, detail::element_t<Out>>, "edl::all_to_all: in and out must have the same element type");
  const auto g = detail::collective_group(d, axes, "all_to_all");
  const std::size_t n = std::ranges::size(in), k = static_cast<std::size_t>(g.size());
  EDL_CHECK(std::ranges::size(out) == n, errc::shape_mismatch, "all_to_all", "in holds ", n, " elements but out ",
            std::ranges::size(out));
  EDL_CHECK(n % k == 0, errc::not_divisible, "all_to_all", n, " elements do not split into ", k, " equal chunks");
  d.backend().all_to_all(d, std::ranges::data(in), std::ranges::data(out), n / k, dtype_v<T>, g.devices);
}

/// For each (src, dst) of `pairs` (positions in the group over `axes`), dst's out = src's in;
/// devices that are no destination get zeros (jax.lax.ppermute). in.size() == out.size().
template <detail::Buffer In, detail::MutableBuffer Out>
void ppermute(Device& d, In&& in, Out&& out, const AxisList& axes, const std::vector<PermutePair>& pairs) {
  using T = detail::element_t<In>;
  static_assert(std::is_same_v<T, detail::element_t<Out>>, "edl::ppermute: in and out must have the same element type");
  const auto g = detail::collective_group(d, axes, "ppermute");
  const std::size_t n = std::ranges::size(in);
  EDL_CHECK(std::ranges::size(out) == n, errc::shape_mismatch, "ppermute", "in holds ", n, " elements but out ",
            std::ranges::size(out));
  d.backend().ppermute(d, std::ranges::data(in), std::ranges::data(out), n, dtype_v<T>, pairs, g.devices);
}

/// Pairs (i, i + shift) for a group of n: a ring shift (wrap) or a shift that drops the ends.
inline std::vector<PermutePair> shift_pairs(std::int64_t n, std::int64_t shift, bool wrap = true) {
  std::vector<PermutePair> p;
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t j = i + shift;
    if (wrap) j = ((j % n) + n) % n;
    else if (j < 0 || j >= n) continue;
    p.emplace_back(i, j);
  }
  return p;
}

/// inout on every member = inout of the member at position `root` of the group.
template <detail::MutableBuffer R>
void broadcast(Device& d, R&& inout, std::int64_t root, const AxisList& axes = {}) {
  using T = detail::element_t<R>;
  const auto g = detail::collective_group(d, axes, "broadcast");
  T* p = std::ranges::data(inout);
  d.backend().broadcast(d, p, p, std::ranges::size(inout), dtype_v<T>, root, g.devices);
}

/// Returns once every member of the group has reached it.
inline void barrier(Device& d, const AxisList& axes = {}) {
  const auto g = detail::collective_group(d, axes, "barrier");
  d.backend().barrier(d, g.devices);
}

/// The caller's position in its group over `axes`: its coordinate for one axis
/// (jax.lax.axis_index), row-major over several, its device id for the whole mesh.
inline std::int64_t axis_index(const Device& d, const AxisList& axes) {
  if (axes.names().size() == 1) return d.axis_index(axes.names()[0]);
  return detail::collective_group(d, axes, "axis_index").position;
}

/// Devices in the caller's group over `axes` (jax.lax.psum(1, axes)).
inline std::int64_t axis_size(const Device& d, const AxisList& axes = {}) {
  if (axes.names().size() == 1) return d.axis_size(axes.names()[0]);
  std::int64_t n = 1;
  if (axes.empty()) return d.shape().size();
  for (const auto& a : axes.names()) n *= d.shape().sizes()[d.shape().axis_index(a, "axis_size")];
  return n;
}

}  // namespace edl
