// edl/tensor/sharded_tensor.hpp
// A tensor split over a device mesh: one xtensor block per device, laid out by ShardLayout.
//
//   auto mesh = create_mesh({1, 2, 2, 1});                       // fsdp=2, tp=2
//   ShardedTensor<float, P<"fsdp", "tp">> w = shard<P<"fsdp", "tp">>(full, mesh);
//   w.local(3)                                                    // device 3's (4, 3) block
//   xt::xtensor<float, 2> back = gather(w);                       // == full
//
// Each device owns a copy of its block (replicas are real copies, as on real devices), and
// the bytes are counted in the mesh's per-device MemoryTracker for as long as they live. On a
// mesh spread over several processes (MPI) a process stores only the blocks of the devices it
// runs; the others' are empty there (has_block(d) is false), so memory per process falls as
// the mesh grows.
// ShardedTensor<T, Spec> carries its spec in its type; ShardedArray<T> is the run-time form
// (rank and spec from data, e.g. partition rules over a checkpoint).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include <edl/core/dtype.hpp>
#include <edl/core/exec.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/tensor/partition_spec.hpp>
#include <edl/tensor/shard_layout.hpp>

namespace edl {

/// Whether this process stores device d's blocks: it runs the device (always, on a mesh in one
/// process).
inline bool stored_here(const MeshContext* ctx, std::int64_t device) noexcept {
  return !ctx || !ctx->backend || ctx->backend->is_local(device);
}

/// Storage and accounting shared by the typed and run-time sharded tensors.
template <class T, class Local>
class BasicShardedTensor {
 public:
  using value_type = T;
  using local_type = Local;

  BasicShardedTensor() = default;
  /// Takes one block per device (each of layout.local_shape(d); empty for a device another
  /// process runs) and starts accounting them.
  BasicShardedTensor(std::shared_ptr<MeshContext> ctx, ShardLayout layout, std::vector<Local> locals)
      : ctx_(std::move(ctx)), layout_(std::move(layout)), locals_(std::move(locals)) {
    EDL_CHECK(static_cast<std::int64_t>(locals_.size()) == layout_.mesh().size(), errc::shape_mismatch,
              "ShardedTensor", "expected one block per device (", layout_.mesh().size(), "), found ", locals_.size());
    for (std::size_t d = 0; d < locals_.size(); ++d) {
      std::vector<std::int64_t> s(locals_[d].shape().begin(), locals_[d].shape().end());
      const auto want = layout_.local_shape(static_cast<std::int64_t>(d));
      if (locals_[d].size() == 0 && !stored_here(ctx_.get(), static_cast<std::int64_t>(d))) continue;
      EDL_CHECK(s == want, errc::shape_mismatch, "ShardedTensor", "device ", d, "'s block has shape ",
                detail::shape_str(s), ", expected ", detail::shape_str(want), " for spec ", layout_.spec().str(),
                layout_.holds(static_cast<std::int64_t>(d)) ? "" : " (the tensor is placed on other devices)");
    }
    account(+1);
  }
  BasicShardedTensor(const BasicShardedTensor& o) : ctx_(o.ctx_), layout_(o.layout_), locals_(o.locals_) { account(+1); }
  BasicShardedTensor(BasicShardedTensor&& o) noexcept
      : ctx_(std::move(o.ctx_)), layout_(std::move(o.layout_)), locals_(std::move(o.locals_)) {
    o.locals_.clear();
  }
  BasicShardedTensor& operator=(BasicShardedTensor o) noexcept {
    swap(o);
    return *this;
  }
  ~BasicShardedTensor() { account(-1); }
  void swap(BasicShardedTensor& o) noexcept {
    std::swap(ctx_, o.ctx_);
    std::swap(layout_, o.layout_);
    std::swap(locals_, o.locals_);
  }

  const ShardLayout& layout() const noexcept { return layout_; }
  const SpecValue& spec() const noexcept { return layout_.spec(); }
  const MeshShape& mesh_shape() const noexcept { return layout_.mesh(); }
  const std::shared_ptr<MeshContext>& context() const noexcept { return ctx_; }
  std::size_t rank() const noexcept { return layout_.rank(); }
  const std::vector<std::int64_t>& global_shape() const noexcept { return layout_.global_shape(); }
  /// The largest block's shape (every block's, where the dimensions divide evenly).
  const std::vector<std::int64_t>& block_shape() const noexcept { return layout_.block_shape(); }
  std::int64_t num_devices() const noexcept { return static_cast<std::int64_t>(locals_.size()); }
  /// Whether this process stores device d's block (false for the devices of other processes;
  /// their local(d) is empty here).
  bool has_block(std::int64_t device) const { return stored_here(ctx_.get(), checked(device)); }
  /// Bytes the largest block holds (each device's, where the dimensions divide evenly).
  std::int64_t local_bytes() const noexcept { return layout_.block_elements() * static_cast<std::int64_t>(sizeof(T)); }

  Local& local(std::int64_t device) { return locals_.at(static_cast<std::size_t>(checked(device))); }
  const Local& local(std::int64_t device) const { return locals_.at(static_cast<std::size_t>(checked(device))); }
  std::span<T> local_span(std::int64_t device) {
    auto& l = local(device);
    return {l.data(), l.size()};
  }
  std::span<const T> local_span(std::int64_t device) const {
    const auto& l = local(device);
    return {l.data(), l.size()};
  }

 private:
  std::int64_t checked(std::int64_t d) const {
    EDL_CHECK(d >= 0 && d < num_devices(), errc::invalid_argument, "ShardedTensor::local",
              "device ", d, " is outside the mesh of ", num_devices(), " devices");
    return d;
  }
  void account(int sign) noexcept {
    if (!ctx_) return;
    for (std::size_t d = 0; d < locals_.size(); ++d) {
      const auto bytes = static_cast<std::int64_t>(locals_[d].size() * sizeof(T));
      if (sign > 0) ctx_->memory.allocate(static_cast<std::int64_t>(d), bytes);
      else ctx_->memory.release(static_cast<std::int64_t>(d), bytes);
    }
  }

  std::shared_ptr<MeshContext> ctx_;
  ShardLayout layout_;
  std::vector<Local> locals_;
};


/// A sharded tensor whose PartitionSpec (and so rank) is part of its type.
template <class T, PartitionSpecType Spec>
class ShardedTensor : public BasicShardedTensor<T, xt::xtensor<T, Spec::rank>> {
  using Base = BasicShardedTensor<T, xt::xtensor<T, Spec::rank>>;

 public:
  using spec_type = Spec;
  static constexpr std::size_t static_rank = Spec::rank;
  using Base::Base;
  ShardedTensor() = default;
  explicit ShardedTensor(Base&& b) : Base(std::move(b)) {}
};

/// A sharded tensor whose rank and spec are known at run time.
template <class T>
using ShardedArray = BasicShardedTensor<T, xt::xarray<T>>;

namespace detail {

template <class S>
struct is_std_array : std::false_type {};
template <class V, std::size_t N>
struct is_std_array<std::array<V, N>> : std::true_type {};

template <class Local>
Local make_local(const std::vector<std::int64_t>& shape) {
  if constexpr (is_std_array<typename Local::shape_type>::value) {
    typename Local::shape_type s;
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<std::size_t>(shape[i]);
    return Local(s);
  } else {
    std::vector<std::size_t> s(shape.begin(), shape.end());
    return Local::from_shape(s);
  }
}

/// An empty block of the layout's rank (a device another process runs).
template <class Local>
Local empty_block(const ShardLayout& layout) {
  return make_local<Local>(std::vector<std::int64_t>(layout.rank(), 0));
}

/// One block per device: device d's block of `global` where this process stores it, else empty.
template <class Local, class T>
std::vector<Local> split_blocks(const ShardLayout& layout, const T* global, const MeshContext* ctx) {
  std::vector<Local> locals;
  locals.reserve(static_cast<std::size_t>(layout.mesh().size()));
  const auto& gs = layout.global_shape();
  for (std::int64_t d = 0; d < layout.mesh().size(); ++d) {
    if (!stored_here(ctx, d)) {
      locals.push_back(empty_block<Local>(layout));
      continue;
    }
    Local l = make_local<Local>(layout.local_shape(d));
    if (l.size() > 0)
      copy_block<T>(const_cast<T*>(global), gs, layout.offset(d), layout.local_shape(d), l.data(), true);
    locals.push_back(std::move(l));
  }
  return locals;
}

template <class T, class Local, class Global>
void join_blocks(const BasicShardedTensor<T, Local>& t, Global& out) {
  const auto& layout = t.layout();
  if (out.size() == 0) return;
  // A mesh over several processes: each copies the blocks its devices own, zeros elsewhere,
  // and the sum over processes completes the tensor exactly (every element comes from one
  // owner). Every process must gather the same tensors in the same order.
  CollectiveBackend* be = t.context() ? t.context()->backend.get() : nullptr;
  const bool multi = be && be->processes() > 1;
  if (multi) std::fill(out.begin(), out.end(), T{});
  for (std::int64_t d : layout.block_owners())
    if (!multi || be->is_local(d))
      copy_block<T>(out.data(), layout.global_shape(), layout.offset(d), layout.local_shape(d),
                    const_cast<T*>(t.local(d).data()), false);
  if (multi) {
    if constexpr (requires { dtype_of<T>::value; }) be->sum_over_processes(out.data(), out.size(), dtype_of<T>::value);
    else throw Error(errc::unsupported, "gather", "gathering over processes takes f32, f64, bf16 or f16 tensors");
  }
}

template <class E>
std::vector<std::int64_t> shape_of(const E& e) {
  return std::vector<std::int64_t>(e.shape().begin(), e.shape().end());
}

}  // namespace detail

/// Splits `global` over `mesh` by the type's spec. The spec's rank must equal the tensor's and
/// its axes must be the mesh's (both checked at compile time); each dimension must divide by
/// its axes' sizes (checked at run time).
template <PartitionSpecType Spec, class T, std::size_t N, Name... Axes>
ShardedTensor<T, Spec> shard(const xt::xtensor<T, N>& global, const Mesh<Axes...>& mesh,
                             std::string_view where = "tensor") {
  static_assert(Spec::rank == N, "edl::shard: the PartitionSpec's rank differs from the tensor's rank");
  static_assert(Spec::template fits_axes<Axes...>(), "edl::shard: the PartitionSpec names an axis that is not an axis of the mesh");
  ShardLayout layout(mesh.shape(), Spec::value(), detail::shape_of(global), where);
  auto locals = detail::split_blocks<xt::xtensor<T, N>>(layout, global.data(), mesh.context().get());
  return ShardedTensor<T, Spec>(mesh.context(), std::move(layout), std::move(locals));
}

/// Run-time form: the spec is a value (from partition rules); errors name `where`.
template <class T, Name... Axes>
ShardedArray<T> shard(const xt::xarray<T>& global, const SpecValue& spec, const Mesh<Axes...>& mesh,
                      std::string_view where = "tensor") {
  ShardLayout layout(mesh.shape(), spec, detail::shape_of(global), where);
  auto locals = detail::split_blocks<xt::xarray<T>>(layout, global.data(), mesh.context().get());
  return ShardedArray<T>(mesh.context(), std::move(layout), std::move(locals));
}

/// A sharded tensor of `layout` on the mesh of `ctx` whose element at global row-major index i
/// is value(i), written straight into the blocks this process stores: fill(first, out) sets
/// out[j] = value(first + j) in f32, called once per contiguous row of a block. With a
/// counter-based value (edl::fill_normal) the blocks equal the blocks of the whole tensor,
/// whatever the mesh, without any process holding the whole tensor.
template <class T, class Fill>
ShardedArray<T> sharded_from_index(const ShardLayout& layout, std::shared_ptr<MeshContext> ctx, Fill&& fill) {
  const auto& gs = layout.global_shape();
  const std::size_t rank = gs.size();
  std::vector<std::int64_t> stride(rank, 1);
  for (std::size_t i = rank; i-- > 1;) stride[i - 1] = stride[i] * gs[i];
  std::vector<xt::xarray<T>> locals;
  for (std::int64_t d = 0; d < layout.mesh().size(); ++d) {
    if (!stored_here(ctx.get(), d)) {
      locals.push_back(detail::empty_block<xt::xarray<T>>(layout));
      continue;
    }
    const auto shape = layout.local_shape(d);
    auto block = detail::make_local<xt::xarray<T>>(shape);
    const std::int64_t width = rank ? shape.back() : 1;
    const std::int64_t rows = width > 0 ? static_cast<std::int64_t>(block.size()) / width : 0;
    const auto origin = layout.offset(d);
    T* out = block.data();
    exec::parallel_for(0, rows, std::max<std::int64_t>(1, (1 << 14) / std::max<std::int64_t>(width, 1)),
                       [&](std::ptrdiff_t r0, std::ptrdiff_t r1) {
                         std::vector<float> row(static_cast<std::size_t>(width));
                         for (std::ptrdiff_t r = r0; r < r1; ++r) {
                           // the row's global index: block row r's leading indices plus the origin
                           std::int64_t first = rank ? origin[rank - 1] : 0, rest = r;
                           for (std::size_t i = rank - 1; rank > 1 && i-- > 0;) {
                             first += (origin[i] + rest % shape[i]) * stride[i];
                             rest /= shape[i];
                           }
                           fill(static_cast<std::uint64_t>(first), std::span<float>(row));
                           for (std::int64_t j = 0; j < width; ++j) out[r * width + j] = from_f32<T>(row[static_cast<std::size_t>(j)]);
                         }
                       });
    locals.push_back(std::move(block));
  }
  return ShardedArray<T>(std::move(ctx), layout, std::move(locals));
}

/// A sharded tensor of zeros with the given global shape.
template <PartitionSpecType Spec, class T, Name... Axes>
ShardedTensor<T, Spec> zeros_sharded(const std::array<std::int64_t, Spec::rank>& global_shape,
                                     const Mesh<Axes...>& mesh, std::string_view where = "tensor") {
  static_assert(Spec::template fits_axes<Axes...>(), "edl::zeros_sharded: the PartitionSpec names an axis that is not an axis of the mesh");
  ShardLayout layout(mesh.shape(), Spec::value(), std::vector<std::int64_t>(global_shape.begin(), global_shape.end()), where);
  std::vector<xt::xtensor<T, Spec::rank>> locals;
  for (std::int64_t d = 0; d < mesh.size(); ++d) {
    if (!stored_here(mesh.context().get(), d)) {
      locals.push_back(detail::empty_block<xt::xtensor<T, Spec::rank>>(layout));
      continue;
    }
    auto l = detail::make_local<xt::xtensor<T, Spec::rank>>(layout.local_shape(d));
    l.fill(T{});
    locals.push_back(std::move(l));
  }
  return ShardedTensor<T, Spec>(mesh.context(), std::move(layout), std::move(locals));
}

/// A sharded tensor of zeros laid out by `layout` (a placed layout included) on the mesh of
/// `ctx`: the blocks this process stores, each of its device's shape.
template <class T>
ShardedArray<T> zeros_sharded(const ShardLayout& layout, std::shared_ptr<MeshContext> ctx) {
  std::vector<xt::xarray<T>> locals;
  for (std::int64_t d = 0; d < layout.mesh().size(); ++d) {
    auto l = stored_here(ctx.get(), d) ? detail::make_local<xt::xarray<T>>(layout.local_shape(d))
                                       : detail::empty_block<xt::xarray<T>>(layout);
    l.fill(T{});
    locals.push_back(std::move(l));
  }
  return ShardedArray<T>(std::move(ctx), layout, std::move(locals));
}

/// Reassembles the global tensor (reads one replica of each block).
template <class T, class Spec>
xt::xtensor<T, Spec::rank> gather(const ShardedTensor<T, Spec>& t) {
  auto out = detail::make_local<xt::xtensor<T, Spec::rank>>(t.global_shape());
  detail::join_blocks(t, out);
  return out;
}
template <class T>
xt::xarray<T> gather(const ShardedArray<T>& t) {
  auto out = detail::make_local<xt::xarray<T>>(t.global_shape());
  detail::join_blocks(t, out);
  return out;
}

/// `global` split by `layout` (a placed layout included) on the mesh of `ctx`.
template <class T>
ShardedArray<T> shard(const xt::xarray<T>& global, const ShardLayout& layout, std::shared_ptr<MeshContext> ctx) {
  EDL_CHECK(detail::shape_of(global) == layout.global_shape(), errc::shape_mismatch, "shard", "the tensor has shape ",
            detail::shape_str(detail::shape_of(global)), ", the layout's is ", detail::shape_str(layout.global_shape()));
  auto locals = detail::split_blocks<xt::xarray<T>>(layout, global.data(), ctx.get());
  return ShardedArray<T>(std::move(ctx), layout, std::move(locals));
}

/// The same tensor laid out by another spec (gather then shard: a reference for resharding,
/// and what loading a checkpoint saved on another mesh does).
template <PartitionSpecType To, class T, class From, Name... Axes>
ShardedTensor<T, To> reshard(const ShardedTensor<T, From>& t, const Mesh<Axes...>& mesh) {
  return shard<To>(gather(t), mesh);
}

}  // namespace edl
