// edl/mesh/backends/simulated.hpp
// SimulatedBackend: every device of the mesh is a thread of this process and collectives
// meet in shared memory. It is the default backend of every Mesh (make_simulated_backend).
//
// Threads. run() starts one std::thread per device, not a TBB task: a collective is a
// blocking rendezvous that returns only when every member of its group has arrived, so all
// devices must be live at the same time. TBB tasks give no such guarantee (with 2 worker
// threads, 2 device tasks would block in a collective forever waiting for a third that is
// never scheduled). Plain threads are always scheduled, so 16 devices on 2 cores work; they
// simply take turns. Kernels called inside a device body still use the shared TBB pool
// (core/exec.hpp), so devices and kernels share the cores instead of oversubscribing them.
// Every device thread flushes denormals, as TBB workers do.
//
// Rendezvous. A call is identified by (group, n), n counting the calls this device has made
// on that group: every member of a group makes the same sequence of calls (SPMD), so the
// k-th call of each member meets in one shared *slot*. The first arrival records the call's
// signature (op, dtype, counts, reduce op, root, pairs); a later member whose call differs
// fails the slot with errc::collective naming the op and the difference. Each call runs in
// two steps separated by a barrier:
//   A: once all members have posted their buffers, each member reads the others' inputs.
//      Reductions: member p combines the elements of its 1/n range of the result in group
//      order (position 0, 1, 2, ...), widening bf16/f16 to f32 and rounding once, and
//      writes that range into every member's output; so the result is bit-identical on
//      every member whatever the thread timing, and the work is spread over the devices.
//      Data movement: each member copies from the others' inputs into its own output.
//   B: a barrier: once every member has finished A, no buffer is read or written any more,
//      so each member may return and reuse its buffers. In-place use (in == out) is safe:
//      a reduction reads a block of every input before writing it to the outputs and no
//      other member touches that range; data movement posts a private copy of an input
//      that overlaps its output.
//
// Failure. If a device body throws, its error is recorded and the rendezvous is aborted:
// every device waiting to enter a collective (or entering one later) throws, so run()
// never hangs, and run() rethrows the first error as an edl::Error whose `where` names the
// device ("device 3 (dp=1, tp=1)"), keeping the code of an edl::Error (device_failure for
// any other exception). If every live device waits in a collective that can never
// complete (mismatched groups, a member that returned early), that deadlock is reported
// as errc::collective listing what each device waits for.
//
// Traffic. Each call adds to traffic(): bytes each device sends, per set of mesh axes the
// group spans (axes of size 1 do not count), under the bandwidth-optimal (ring) algorithm
// that bus bandwidth assumes (docs/mesh.md): all_reduce 2(n-1)/n S, all_gather and
// reduce_scatter and all_to_all (n-1)/n S with S the larger buffer, broadcast S from the
// root, ppermute S from each source whose destination is another position.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/mesh/backend.hpp>
#include <edl/mesh/device.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/mesh/mesh_shape.hpp>

namespace edl {

namespace detail::sim {

enum class Op { all_reduce, all_gather, reduce_scatter, all_to_all, ppermute, broadcast, barrier };

constexpr const char* op_name(Op op) noexcept {
  switch (op) {
    case Op::all_reduce: return "all_reduce";
    case Op::all_gather: return "all_gather";
    case Op::reduce_scatter: return "reduce_scatter";
    case Op::all_to_all: return "all_to_all";
    case Op::ppermute: return "ppermute";
    case Op::broadcast: return "broadcast";
    case Op::barrier: return "barrier";
  }
  return "?";
}

template <class T, class Acc>
inline Acc widen(T v) noexcept {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) return v.to_float();
  else return static_cast<Acc>(v);
}
template <class T, class Acc>
inline T narrow(Acc v) noexcept {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}

/// One block of m elements (m a constant for full blocks, so that -O2's cheap vectoriser
/// takes the loops): acc = op over q = 0..n-1 (in this order) of ins[q][b + j], then written
/// to every output in `outs` (all read before any write, so an output may be an input).
template <class T, class Acc, std::size_t M>
inline void reduce_block(const std::byte* const* ins, std::size_t n, std::size_t b, std::size_t m,
                         std::byte* const* outs, std::size_t nout, std::size_t out_offset, ReduceOp op, Acc* acc) {
  if constexpr (M != 0) m = M;
  const T* x0 = reinterpret_cast<const T*>(ins[0]) + b;
  for (std::size_t j = 0; j < m; ++j) acc[j] = widen<T, Acc>(x0[j]);
  for (std::size_t q = 1; q < n; ++q) {
    const T* x = reinterpret_cast<const T*>(ins[q]) + b;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::mean:
        for (std::size_t j = 0; j < m; ++j) acc[j] += widen<T, Acc>(x[j]);
        break;
      case ReduceOp::max:
        for (std::size_t j = 0; j < m; ++j) {
          const Acc v = widen<T, Acc>(x[j]);
          acc[j] = (acc[j] > v || acc[j] != acc[j]) ? acc[j] : v;
        }
        break;
      case ReduceOp::min:
        for (std::size_t j = 0; j < m; ++j) {
          const Acc v = widen<T, Acc>(x[j]);
          acc[j] = (acc[j] < v || acc[j] != acc[j]) ? acc[j] : v;
        }
        break;
    }
  }
  if (op == ReduceOp::mean) {
    const Acc k = static_cast<Acc>(n);
    for (std::size_t j = 0; j < m; ++j) acc[j] = acc[j] / k;
  }
  for (std::size_t o = 0; o < nout; ++o) {
    T* y = reinterpret_cast<T*>(outs[o]) + (b - out_offset);
    for (std::size_t j = 0; j < m; ++j) y[j] = narrow<T, Acc>(acc[j]);
  }
}

/// For i in [lo, hi): r[i] = op over q = 0..n-1 (in this order) of ins[q][i], stored at
/// outs[o][i - out_offset] for every o. Blocks keep the per-element order q = 0, 1, ...
/// max/min propagate NaN (as jax.lax.max). mean divides the sum by n once, at the end.
template <class T, class Acc>
void reduce_range(const std::byte* const* ins, std::size_t n, std::size_t lo, std::size_t hi,
                  std::byte* const* outs, std::size_t nout, std::size_t out_offset, ReduceOp op) {
  constexpr std::size_t B = 512;
  alignas(64) Acc acc[B];
  std::size_t b = lo;
  for (; b + B <= hi; b += B) reduce_block<T, Acc, B>(ins, n, b, B, outs, nout, out_offset, op, acc);
  if (b < hi) reduce_block<T, Acc, 0>(ins, n, b, hi - b, outs, nout, out_offset, op, acc);
}

/// Calls f.template operator()<T, Acc>() for the storage type of `d` and its accumulator.
template <class F>
void dispatch_reduce(DType d, const char* where, F&& f) {
  switch (d) {
    case DType::f32: return f.template operator()<float, float>();
    case DType::f64: return f.template operator()<double, double>();
    case DType::bf16: return f.template operator()<bf16, float>();
    case DType::f16: return f.template operator()<f16, float>();
    case DType::i8: return f.template operator()<std::int8_t, std::int64_t>();
    case DType::u8: return f.template operator()<std::uint8_t, std::int64_t>();
    case DType::i16: return f.template operator()<std::int16_t, std::int64_t>();
    case DType::i32: return f.template operator()<std::int32_t, std::int64_t>();
    case DType::i64: return f.template operator()<std::int64_t, std::int64_t>();
    case DType::boolean: break;
  }
  raise(errc::unsupported, where, concat("cannot reduce elements of dtype ", dtype_name(d)));
}

inline bool overlaps(const void* a, std::size_t na, const void* b, std::size_t nb) noexcept {
  const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return na && nb && pa < pb + nb && pb < pa + na;
}

/// One collective call of one group: its signature, the members' buffers and the barriers.
struct Slot {
  Op op = Op::barrier;
  DType dtype = DType::f32;
  std::size_t count = 0;
  ReduceOp rop = ReduceOp::sum;
  std::int64_t root = 0;
  std::vector<PermutePair> pairs;
  std::int64_t opener = 0;  // device that arrived first (its call defines the signature)
  std::uint64_t seq = 0;
  std::size_t n = 0;
  std::vector<const std::byte*> in;  // by group position
  std::vector<std::byte*> out;
  std::size_t arrived = 0, finished_a = 0;
  std::string error;  // a mismatch: every member throws errc::collective with it
  std::condition_variable cv;
};

}  // namespace detail::sim

class SimulatedBackend final : public CollectiveBackend {
 public:
  explicit SimulatedBackend(std::weak_ptr<MeshContext> ctx) : ctx_(std::move(ctx)) {}

  std::string_view name() const noexcept override { return "simulated"; }

  void run(const std::function<void(Device&)>& body) override {
    EDL_CHECK(current_backend() != this, errc::unsupported, "mesh.run",
              "run() was called from inside a device body of the same mesh; nested runs are not supported");
    std::shared_ptr<MeshContext> ctx = ctx_.lock();
    EDL_CHECK(ctx != nullptr, errc::invalid_argument, "mesh.run", "the mesh of this backend no longer exists");
    std::lock_guard<std::mutex> run_lock(run_mu_);
    const std::int64_t n = ctx->shape.size();
    reset(static_cast<std::size_t>(n));

    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(n));
    try {
      for (std::int64_t d = 0; d < n; ++d)
        threads.emplace_back([this, d, &ctx, &body] { device_main(d, *ctx, body); });
    } catch (...) {  // could not start a thread: release the ones that did, then report
      {
        std::lock_guard<std::mutex> lk(mu_);
        record_error_locked(static_cast<std::int64_t>(threads.size()), std::current_exception());
        for (std::size_t d = threads.size(); d < finished_.size(); ++d) finished_[d] = true;
      }
      for (auto& t : threads) t.join();
      rethrow_first(ctx->shape);
    }
    for (auto& t : threads) t.join();
    slots_.clear();
    if (first_error_) rethrow_first(ctx->shape);
  }

  void all_reduce(Device& self, const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                  std::span<const std::int64_t> group) override {
    Call c{detail::sim::Op::all_reduce, dtype, count, op, 0, {}};
    reduction(self, c, in, out, group);
  }

  void reduce_scatter(Device& self, const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                      std::span<const std::int64_t> group) override {
    Call c{detail::sim::Op::reduce_scatter, dtype, count, op, 0, {}};
    reduction(self, c, in, out, group);
  }

  void all_gather(Device& self, const void* in, void* out, std::size_t count, DType dtype,
                  std::span<const std::int64_t> group) override {
    const std::size_t es = dtype_size(dtype), chunk = count * es, n = group.size();
    Call c{detail::sim::Op::all_gather, dtype, count, ReduceOp::sum, 0, {}};
    movement(self, c, in, chunk, out, chunk * n, group, [&](const detail::sim::Slot& s, std::size_t p) {
      auto* o = static_cast<std::byte*>(out);
      for (std::size_t q = 0; q < s.n; ++q) copy(o + q * chunk, s.in[q], chunk);
      (void)p;
    });
  }

  void all_to_all(Device& self, const void* in, void* out, std::size_t count, DType dtype,
                  std::span<const std::int64_t> group) override {
    const std::size_t es = dtype_size(dtype), chunk = count * es, n = group.size();
    Call c{detail::sim::Op::all_to_all, dtype, count, ReduceOp::sum, 0, {}};
    movement(self, c, in, chunk * n, out, chunk * n, group, [&](const detail::sim::Slot& s, std::size_t p) {
      auto* o = static_cast<std::byte*>(out);
      for (std::size_t q = 0; q < s.n; ++q) copy(o + q * chunk, s.in[q] + p * chunk, chunk);
    });
  }

  void ppermute(Device& self, const void* in, void* out, std::size_t count, DType dtype,
                std::span<const PermutePair> pairs, std::span<const std::int64_t> group) override {
    const std::size_t bytes = count * dtype_size(dtype);
    const auto n = static_cast<std::int64_t>(group.size());
    std::vector<bool> src_seen(group.size()), dst_seen(group.size());
    for (const auto& [s, d] : pairs) {
      EDL_CHECK(s >= 0 && s < n && d >= 0 && d < n, errc::invalid_argument, "ppermute", "pair (", s, ", ", d,
                ") is outside the group of ", n, " devices");
      EDL_CHECK(!src_seen[s], errc::invalid_argument, "ppermute", "position ", s, " is the source of two pairs");
      EDL_CHECK(!dst_seen[d], errc::invalid_argument, "ppermute", "position ", d, " is the destination of two pairs");
      src_seen[s] = dst_seen[d] = true;
    }
    Call c{detail::sim::Op::ppermute, dtype, count, ReduceOp::sum, 0, std::vector<PermutePair>(pairs.begin(), pairs.end())};
    movement(self, c, in, bytes, out, bytes, group, [&](const detail::sim::Slot& s, std::size_t p) {
      auto* o = static_cast<std::byte*>(out);
      for (const auto& [src, dst] : s.pairs)
        if (dst == static_cast<std::int64_t>(p)) return copy(o, s.in[src], bytes);
      std::memset(o, 0, bytes);
    });
  }

  void broadcast(Device& self, const void* in, void* out, std::size_t count, DType dtype, std::int64_t root,
                 std::span<const std::int64_t> group) override {
    const std::size_t bytes = count * dtype_size(dtype);
    EDL_CHECK(root >= 0 && root < static_cast<std::int64_t>(group.size()), errc::invalid_argument, "broadcast",
              "root position ", root, " is outside the group of ", group.size(), " devices");
    Call c{detail::sim::Op::broadcast, dtype, count, ReduceOp::sum, root, {}};
    movement(self, c, in, bytes, out, bytes, group, [&](const detail::sim::Slot& s, std::size_t) {
      copy(static_cast<std::byte*>(out), s.in[static_cast<std::size_t>(s.root)], bytes);
    });
  }

  void barrier(Device& self, std::span<const std::int64_t> group) override {
    Call c{detail::sim::Op::barrier, DType::u8, 0, ReduceOp::sum, 0, {}};
    movement(self, c, nullptr, 0, nullptr, 0, group, [](const detail::sim::Slot&, std::size_t) {});
  }

  /// Bytes sent by each device, per set of axes ("dp,tp"), since the last reset_traffic().
  std::map<std::string, std::vector<std::int64_t>> traffic() const {
    std::lock_guard<std::mutex> lk(mu_);
    return traffic_;
  }
  void reset_traffic() {
    std::lock_guard<std::mutex> lk(mu_);
    traffic_.clear();
  }

 private:
  using Slot = detail::sim::Slot;
  using Op = detail::sim::Op;
  using Key = std::pair<std::vector<std::int64_t>, std::uint64_t>;

  struct Call {
    Op op;
    DType dtype;
    std::size_t count;
    ReduceOp rop;
    std::int64_t root;
    std::vector<PermutePair> pairs;
  };

  static const SimulatedBackend*& current_backend() {
    static thread_local const SimulatedBackend* b = nullptr;
    return b;
  }

  static void copy(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept {
    if (dst != src && bytes) std::memmove(dst, src, bytes);
  }

  void reset(std::size_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    devices_ = n;
    seq_.assign(n, {});
    finished_.assign(n, false);
    waiting_.assign(n, nullptr);
    slots_.clear();
    aborted_ = false;
    first_error_ = nullptr;
    first_device_ = -1;
  }

  void device_main(std::int64_t d, MeshContext& ctx, const std::function<void(Device&)>& body) {
    exec::set_flush_denormals();
    current_backend() = this;
    try {
      Device dev(d, ctx.shape, ctx.memory, *this, &ctx);
      body(dev);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      record_error_locked(d, std::current_exception());
    }
    current_backend() = nullptr;
    std::lock_guard<std::mutex> lk(mu_);
    finished_[static_cast<std::size_t>(d)] = true;
    if (auto msg = deadlock_locked()) {
      // Report it on the lowest waiting device (there is one, or deadlock_locked returns none).
      std::int64_t w = 0;
      while (!waiting_[static_cast<std::size_t>(w)]) ++w;
      record_error_locked(w, std::make_exception_ptr(Error(errc::collective, "collective", *msg)));
    }
  }

  /// Records the first failure and wakes every waiter; later callers see aborted_.
  void record_error_locked(std::int64_t d, std::exception_ptr e) {
    if (!first_error_) {
      first_error_ = std::move(e);
      first_device_ = d;
    }
    aborted_ = true;
    for (auto& [k, s] : slots_) s->cv.notify_all();
  }

  [[noreturn]] void rethrow_first(const MeshShape& shape) {
    const std::int64_t d = first_device_;
    std::string who = "device " + std::to_string(d);
    if (d >= 0 && d < shape.size() && shape.describe(d) != "()") who += " " + shape.describe(d);
    try {
      std::rethrow_exception(first_error_);
    } catch (const Error& e) {
      std::string what = e.what();
      if (!what.empty() && what[0] == '[') {  // drop the "[edl.name.id] " prefix; the code is kept
        const auto close = what.find("] ");
        if (close != std::string::npos) what.erase(0, close + 2);
      }
      throw Error(e.code(), who, what);
    } catch (const std::exception& e) {
      throw Error(errc::device_failure, who, std::string("threw: ") + e.what());
    } catch (...) {
      throw Error(errc::device_failure, who, "threw an exception that is not a std::exception");
    }
  }

  static std::string group_str(std::span<const std::int64_t> g) { return detail::shape_str(g); }

  /// If every device is either finished or waiting for a slot that can never fill, describes it.
  std::optional<std::string> deadlock_locked() const {
    std::size_t stuck = 0, done = 0;
    for (std::size_t d = 0; d < devices_; ++d) {
      if (finished_[d]) ++done;
      else if (waiting_[d] && waiting_[d]->arrived < waiting_[d]->n && waiting_[d]->error.empty()) ++stuck;
    }
    if (stuck == 0 || stuck + done != devices_ || aborted_) return std::nullopt;
    std::string msg = "no device can make progress:";
    for (std::size_t d = 0; d < devices_; ++d) {
      if (const Slot* s = waiting_[d]) {
        msg += detail::concat(" device ", d, " waits in ", detail::sim::op_name(s->op), " (call #", s->seq,
                              " on group ", slot_group(*s), ", ", s->arrived, " of ", s->n, " arrived);");
      }
    }
    std::string gone;
    for (std::size_t d = 0; d < devices_; ++d)
      if (finished_[d]) gone += (gone.empty() ? "" : ", ") + std::to_string(d);
    if (!gone.empty()) msg += " device(s) " + gone + " returned;";
    msg += " every member of a group must make the same collective calls in the same order";
    return msg;
  }

  std::string slot_group(const Slot& s) const {
    for (const auto& [k, v] : slots_)
      if (v.get() == &s) return group_str(k.first);
    return "?";
  }

  /// Axis names the group spans ("dp,tp"), for traffic accounting.
  static std::string axes_of(const MeshShape& shape, std::span<const std::int64_t> group) {
    std::string s;
    const auto c0 = shape.coords(group[0]);
    for (std::size_t i = 0; i < shape.rank(); ++i) {
      bool varies = false;
      for (std::int64_t d : group)
        if (shape.coords(d)[i] != c0[i]) { varies = true; break; }
      if (varies) s += (s.empty() ? "" : ",") + shape.names()[i];
    }
    return s;
  }

  std::int64_t sent_bytes(const Call& c, std::size_t n, std::size_t p) const {
    const auto S = static_cast<double>(c.count * dtype_size(c.dtype));
    const double k = static_cast<double>(n - 1) / static_cast<double>(n);
    switch (c.op) {
      case Op::all_reduce: return static_cast<std::int64_t>(2 * k * S);
      case Op::all_gather: case Op::reduce_scatter: case Op::all_to_all:
        return static_cast<std::int64_t>(k * S * static_cast<double>(n));
      case Op::broadcast: return static_cast<std::int64_t>(p == static_cast<std::size_t>(c.root) ? S : 0);
      case Op::ppermute:
        for (const auto& [s, d] : c.pairs)
          if (s == static_cast<std::int64_t>(p) && d != s) return static_cast<std::int64_t>(S);
        return 0;
      case Op::barrier: return 0;
    }
    return 0;
  }

  std::size_t position_of(const Device& self, std::span<const std::int64_t> group, const char* op) const {
    EDL_CHECK(!group.empty(), errc::invalid_argument, op, "the device group is empty");
    for (std::size_t i = 0; i < group.size(); ++i)
      if (group[i] == self.id()) return i;
    detail::raise(errc::invalid_argument, op,
                  detail::concat(self.describe(), " is not a member of group ", group_str(group)));
  }

  std::string mismatch(const Slot& s, const Call& c, std::int64_t self) const {
    const char* op = detail::sim::op_name(s.op);
    (void)op;
    auto head = [&](const char* what) {
      return detail::concat("call #", s.seq, " on group ", slot_group(s), ": device ", self, " passes ", what);
    };
    if (s.op != c.op)
      return detail::concat("call #", s.seq, " on group ", slot_group(s), ": device ", s.opener, " calls ", op,
                            " but device ", self, " calls ", detail::sim::op_name(c.op));
    if (s.dtype != c.dtype)
      return head("dtype ") + detail::concat(dtype_name(c.dtype), " but device ", s.opener, " passed ", dtype_name(s.dtype));
    if (s.count != c.count)
      return head("count ") + detail::concat(c.count, " but device ", s.opener, " passed ", s.count);
    if (s.rop != c.rop)
      return head("reduce op ") + detail::concat(reduce_op_name(c.rop), " but device ", s.opener, " passed ",
                                                 reduce_op_name(s.rop));
    if (s.root != c.root)
      return head("root ") + detail::concat(c.root, " but device ", s.opener, " passed ", s.root);
    if (s.pairs != c.pairs) return head("different pairs") + detail::concat(" than device ", s.opener);
    return {};
  }

  /// Joins (or opens) this call's slot, posts the buffers and waits until every member has.
  /// Throws on a mismatch, an abort or a deadlock; never after the slot filled up.
  std::shared_ptr<Slot> arrive(Device& self, const Call& c, std::span<const std::int64_t> group, std::size_t pos,
                               const void* in, void* out) {
    const char* opn = detail::sim::op_name(c.op);
    std::unique_lock<std::mutex> lk(mu_);
    if (aborted_) throw_aborted(self, opn);
    const auto d = static_cast<std::size_t>(self.id());
    std::vector<std::int64_t> g(group.begin(), group.end());
    const std::uint64_t seq = seq_[d][g]++;
    Key key{std::move(g), seq};
    auto it = slots_.find(key);
    if (it == slots_.end()) {
      auto s = std::make_shared<Slot>();
      s->op = c.op;
      s->dtype = c.dtype;
      s->count = c.count;
      s->rop = c.rop;
      s->root = c.root;
      s->pairs = c.pairs;
      s->opener = self.id();
      s->seq = seq;
      s->n = group.size();
      s->in.assign(s->n, nullptr);
      s->out.assign(s->n, nullptr);
      it = slots_.emplace(std::move(key), std::move(s)).first;
    } else if (it->second->error.empty()) {
      const std::string m = mismatch(*it->second, c, self.id());
      if (!m.empty()) {
        it->second->error = m;
        it->second->cv.notify_all();
      }
    }
    std::shared_ptr<Slot> s = it->second;
    if (!s->error.empty()) throw Error(errc::collective, opn, s->error);
    s->in[pos] = static_cast<const std::byte*>(in);
    s->out[pos] = static_cast<std::byte*>(out);
    if (auto ctx = ctx_.lock()) {
      auto& t = traffic_[axes_of(ctx->shape, group)];
      if (t.size() < devices_) t.resize(devices_, 0);
      t[d] += sent_bytes(c, s->n, pos);
    }
    if (++s->arrived == s->n) {
      s->cv.notify_all();
      return s;
    }
    waiting_[d] = s.get();
    if (auto msg = deadlock_locked()) {
      waiting_[d] = nullptr;
      Error e(errc::collective, opn, *msg);
      record_error_locked(self.id(), std::make_exception_ptr(e));
      throw e;
    }
    s->cv.wait(lk, [&] { return s->arrived == s->n || aborted_ || !s->error.empty(); });
    waiting_[d] = nullptr;
    if (s->arrived == s->n) return s;  // filled: the others read our buffers, so we must go on
    if (!s->error.empty()) throw Error(errc::collective, opn, s->error);
    throw_aborted(self, opn);
  }

  [[noreturn]] void throw_aborted(const Device& self, const char* op) const {
    detail::raise(errc::device_failure, op,
                  detail::concat(self.describe(), " stopped waiting because device ", first_device_, " failed"));
  }

  /// Phase barrier after A: every member has stopped reading inputs. Not abortable (see arrive).
  void finish_phase_a(Slot& s) {
    std::unique_lock<std::mutex> lk(mu_);
    if (++s.finished_a == s.n) {
      s.cv.notify_all();
      for (auto it = slots_.begin(); it != slots_.end(); ++it)
        if (it->second.get() == &s) {
          slots_.erase(it);
          break;
        }
      return;
    }
    s.cv.wait(lk, [&] { return s.finished_a == s.n; });
  }

  /// all_reduce and reduce_scatter. Phase A: member p combines its range of the result
  /// (all_reduce: the p-th 1/n of the elements; reduce_scatter: chunk p) and writes it to
  /// every output that needs it. Only member p reads or writes that range of any buffer, and
  /// it reads a block of all inputs before writing the block, so in == out is safe. A
  /// reduce_scatter output that overlaps its input elsewhere than chunk p gets a private
  /// buffer, copied out after the phase barrier.
  void reduction(Device& self, const Call& c, const void* in, void* out, std::span<const std::int64_t> group) {
    const char* opn = detail::sim::op_name(c.op);
    const std::size_t pos = position_of(self, group, opn), n = group.size(), es = dtype_size(c.dtype);
    const bool scatter = c.op == Op::reduce_scatter;
    const std::size_t total = scatter ? c.count * n : c.count;  // elements of the full result
    detail::sim::dispatch_reduce(c.dtype, opn, [] <class T, class Acc>() {});  // rejects bool early
    if (n == 1) {
      copy(static_cast<std::byte*>(out), static_cast<const std::byte*>(in), c.count * es);
      return;
    }
    std::unique_ptr<std::byte[]> own;
    std::byte* target = static_cast<std::byte*>(out);
    if (scatter && detail::sim::overlaps(in, total * es, out, c.count * es) &&
        out != static_cast<const std::byte*>(in) + pos * c.count * es) {
      own.reset(new std::byte[c.count * es]);
      target = own.get();
    }
    auto s = arrive(self, c, group, pos, in, target);
    const std::size_t lo = scatter ? pos * c.count : total * pos / n;
    const std::size_t hi = scatter ? lo + c.count : total * (pos + 1) / n;
    detail::sim::dispatch_reduce(c.dtype, opn, [&]<class T, class Acc>() {
      if (scatter)
        detail::sim::reduce_range<T, Acc>(s->in.data(), n, lo, hi, &target, 1, lo, c.rop);
      else
        detail::sim::reduce_range<T, Acc>(s->in.data(), n, lo, hi, s->out.data(), n, 0, c.rop);
    });
    finish_phase_a(*s);
    if (own) copy(static_cast<std::byte*>(out), own.get(), c.count * es);
  }

  /// Data movement: posts the input (a private copy if it overlaps the output), runs `fill`
  /// (writes this member's output from the posted inputs) and waits until all have read.
  template <class Fill>
  void movement(Device& self, const Call& c, const void* in, std::size_t in_bytes, void* out, std::size_t out_bytes,
                std::span<const std::int64_t> group, Fill&& fill) {
    const char* opn = detail::sim::op_name(c.op);
    const std::size_t pos = position_of(self, group, opn);
    // Others read our input while we write our output: if the two overlap, post a copy.
    // (broadcast with in == out is safe: the root copies onto itself, nobody reads the rest.)
    std::unique_ptr<std::byte[]> own;
    if (group.size() > 1 && detail::sim::overlaps(in, in_bytes, out, out_bytes) &&
        !(c.op == Op::broadcast && in == out)) {
      own.reset(new std::byte[in_bytes]);
      std::memcpy(own.get(), in, in_bytes);
      in = own.get();
    }
    if (group.size() == 1) {
      Slot s;
      s.n = 1;
      s.root = c.root;
      s.pairs = c.pairs;
      s.in.assign(1, static_cast<const std::byte*>(in));
      fill(s, 0);
      return;
    }
    auto s = arrive(self, c, group, pos, in, out);
    fill(*s, pos);
    finish_phase_a(*s);
  }

  std::weak_ptr<MeshContext> ctx_;
  std::mutex run_mu_;
  mutable std::mutex mu_;
  std::size_t devices_ = 0;
  std::vector<std::map<std::vector<std::int64_t>, std::uint64_t>> seq_;  // per device, per group
  std::vector<bool> finished_;
  std::vector<const Slot*> waiting_;  // the slot each device waits to fill, or null
  std::map<Key, std::shared_ptr<Slot>> slots_;
  std::map<std::string, std::vector<std::int64_t>> traffic_;
  bool aborted_ = false;
  std::exception_ptr first_error_;
  std::int64_t first_device_ = -1;
};

inline std::shared_ptr<CollectiveBackend> make_simulated_backend(std::shared_ptr<MeshContext> ctx) {
  return std::make_shared<SimulatedBackend>(std::weak_ptr<MeshContext>(ctx));
}

}  // namespace edl
