// edl/mesh/backends/mpi.hpp
// The collective backend for meshes spread over MPI ranks (Open MPI, MPICH): `ranks x local`
// devices, each rank running `local` devices as threads, as the simulated backend does.
//
//   edl::mpi::Session mpi(argc, argv);                    // MPI_Init_thread(MULTIPLE) ... Finalize
//   auto mesh = edl::create_mesh({1, 2, 2, 1});           // 4 devices
//   edl::mpi::attach(mesh, mpi, /*local_devices=*/2);     // run with: mpirun -np 2 prog
//   mesh.run([&](edl::Device& dev) { ... psum(dev, buf, {"tp"}) ... });   // dev.id() on this rank
//
// Device order: device d lives on rank d / local and is that rank's local device d % local,
// so with local = 1 device d is rank d; the mesh's row-major device ids (MeshShape::coords)
// therefore put the LAST mesh axes within a rank: on 2 ranks x 2 local devices of
// (dp=2, tp=2), tp pairs share a rank and dp crosses ranks.
//
// Same numbers as the simulated mesh, bit for bit: reductions are computed the way the
// simulated backend computes them — each member owns a contiguous 1/n of the elements,
// receives that part from every member and folds it in group order (position 0, 1, ...) with
// the same widening and rounding (detail::sim::reduce_range), then the parts are gathered.
// This is a reduce-scatter + all-gather, the bandwidth of a ring all-reduce, built from
// point-to-point messages so that the order of the fold is ours and not the MPI library's.
//
// Requirements and failure behaviour (docs/distributed.md):
//   - MPI_THREAD_MULTIPLE (every device thread sends and receives); checked at Session start.
//   - Two devices see the collectives they share in the same order (true of SPMD programs).
//   - Every wait polls with a deadline (EDL_MPI_TIMEOUT seconds, default 120): a rank that
//     died or hangs makes the others fail with errc::collective naming the device, the op and
//     the peer they wait for, instead of hanging. A device that throws releases the other
//     devices of its rank at once; other ranks learn of it through the deadline (or through
//     mpirun, which ends the job when a rank exits with an error).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <edl/mesh/backends/simulated.hpp>
#include <edl/mesh/mesh.hpp>

namespace edl::mpi {

/// MPI_Init_thread with MPI_THREAD_MULTIPLE on construction, MPI_Finalize on destruction.
class Session {
 public:
  Session(int& argc, char**& argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
      owns_ = true;
      EDL_CHECK(provided >= MPI_THREAD_MULTIPLE, errc::unsupported, "mpi",
                "the MPI library provides thread level ", provided, ", edl needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
                ")");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    if (owns_) MPI_Finalize();
  }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  MPI_Comm comm() const noexcept { return MPI_COMM_WORLD; }

 private:
  bool owns_ = false;
  int rank_ = 0, size_ = 1;
};

namespace mpi_detail {

inline double timeout_seconds() {
  if (const char* s = std::getenv("EDL_MPI_TIMEOUT")) {
    const double v = std::atof(s);
    if (v > 0) return v;
  }
  return 120.0;
}

}  // namespace mpi_detail

class MpiBackend final : public CollectiveBackend {
 public:
  /// `local` devices per rank; the mesh must have exactly ranks x local devices (checked here,
  /// before any work, with a message saying how to launch).
  MpiBackend(std::weak_ptr<MeshContext> ctx, MPI_Comm comm, int local) : ctx_(std::move(ctx)), local_(local) {
    MPI_Comm_dup(comm, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &ranks_);
    auto c = ctx_.lock();
    EDL_CHECK(c != nullptr, errc::invalid_argument, "mpi", "the mesh no longer exists");
    EDL_CHECK(local >= 1, errc::invalid_argument, "mpi", "local devices per rank must be >= 1, found ", local);
    EDL_CHECK(c->shape.size() == static_cast<std::int64_t>(ranks_) * local, errc::shape_mismatch, "mpi",
              "the mesh ", c->shape.axes_str(), " has ", c->shape.size(), " devices but the launch gives ", ranks_,
              " ranks x ", local, " local devices = ", static_cast<std::int64_t>(ranks_) * local,
              "; launch with mpirun -np ", c->shape.size() / std::max(1, local), " or change the mesh");
    // Every rank must agree on the mesh: compare the shapes' sizes before any work.
    std::vector<long long> mine(c->shape.sizes().begin(), c->shape.sizes().end());
    mine.push_back(local);
    std::vector<long long> all(mine.size() * static_cast<std::size_t>(ranks_));
    MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_LONG_LONG, all.data(), static_cast<int>(mine.size()),
                  MPI_LONG_LONG, comm_);
    for (int r = 0; r < ranks_; ++r)
      for (std::size_t i = 0; i < mine.size(); ++i)
        EDL_CHECK(all[static_cast<std::size_t>(r) * mine.size() + i] == mine[i], errc::shape_mismatch, "mpi",
                  "rank ", r, " uses a different mesh or local device count than rank ", rank_,
                  " (launch inconsistency): every rank must build the same mesh");
    timeout_ = mpi_detail::timeout_seconds();
  }
  ~MpiBackend() override { MPI_Comm_free(&comm_); }

  std::string_view name() const noexcept override { return "mpi"; }
  /// The same ranks and local devices on a duplicate of this backend's communicator.
  std::shared_ptr<CollectiveBackend> twin(std::weak_ptr<MeshContext> ctx) const override {
    return std::make_shared<MpiBackend>(std::move(ctx), comm_, local_);
  }
  int rank() const noexcept { return rank_; }
  int ranks() const noexcept { return ranks_; }
  int local_devices() const noexcept { return local_; }
  /// The devices this rank runs: [first_device, first_device + local_devices).
  std::int64_t first_device() const noexcept { return static_cast<std::int64_t>(rank_) * local_; }
  bool is_local(std::int64_t device) const noexcept override { return device / local_ == rank_; }
  int processes() const noexcept override { return ranks_; }

  void sum_over_processes(void* buf, std::size_t count, DType dtype) override {
    auto reduce = [&](void* p, MPI_Datatype t) {
      // Large buffers go in pieces: MPI counts are int.
      const std::size_t esize = dtype_size(dtype == DType::bf16 || dtype == DType::f16 ? DType::f32 : dtype);
      constexpr std::size_t kPiece = std::size_t{1} << 28;
      for (std::size_t off = 0; off < count; off += kPiece) {
        const int n = static_cast<int>(std::min(kPiece, count - off));
        MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(p) + off * esize, n, t, MPI_SUM, comm_);
      }
    };
    switch (dtype) {
      case DType::f32: reduce(buf, MPI_FLOAT); break;
      case DType::f64: reduce(buf, MPI_DOUBLE); break;
      case DType::i64: reduce(buf, MPI_INT64_T); break;
      case DType::i32: reduce(buf, MPI_INT32_T); break;
      case DType::bf16:
      case DType::f16: {
        std::vector<float> w(count);
        for (std::size_t i = 0; i < count; ++i)
          w[i] = dtype == DType::bf16 ? to_f32(static_cast<const bf16*>(buf)[i]) : to_f32(static_cast<const f16*>(buf)[i]);
        reduce(w.data(), MPI_FLOAT);
        for (std::size_t i = 0; i < count; ++i) {
          if (dtype == DType::bf16) static_cast<bf16*>(buf)[i] = from_f32<bf16>(w[i]);
          else static_cast<f16*>(buf)[i] = from_f32<f16>(w[i]);
        }
        break;
      }
      default:
        throw Error(errc::unsupported, "mpi", std::string("sum_over_processes: dtype ") + std::string(dtype_name(dtype)) +
                                                  " is not supported");
    }
  }

  void run(const std::function<void(Device&)>& body) override {
    auto ctx = ctx_.lock();
    EDL_CHECK(ctx != nullptr, errc::invalid_argument, "mesh.run", "the mesh of this backend no longer exists");
    aborted_ = false;
    first_error_ = nullptr;
    first_device_ = -1;
    std::vector<std::thread> threads;
    for (int i = 0; i < local_; ++i) {
      const std::int64_t d = first_device() + i;
      threads.emplace_back([this, d, &ctx, &body] {
        exec::set_flush_denormals();
        try {
          Device dev(d, ctx->shape, ctx->memory, *this, ctx.get());
          body(dev);
        } catch (...) {
          std::lock_guard<std::mutex> lk(mu_);
          if (!first_error_) {
            first_error_ = std::current_exception();
            first_device_ = d;
          }
          aborted_ = true;
        }
      });
    }
    for (auto& t : threads) t.join();
    if (first_error_) {
      try {
        std::rethrow_exception(first_error_);
      } catch (const Error& e) {
        throw Error(e.code(), "device " + std::to_string(first_device_) + " " + ctx->shape.describe(first_device_) +
                                  " on rank " + std::to_string(rank_),
                    e.what());
      } catch (const std::exception& e) {
        throw Error(errc::device_failure, "device " + std::to_string(first_device_) + " on rank " + std::to_string(rank_),
                    std::string("threw: ") + e.what());
      }
    }
  }

  void all_reduce(Device& self, const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                  std::span<const std::int64_t> group) override {
    const std::size_t n = group.size(), es = dtype_size(dtype), p = position(self, group);
    std::vector<std::size_t> lo(n + 1);
    for (std::size_t q = 0; q <= n; ++q) lo[q] = count * q / n;
    const auto* src = static_cast<const std::byte*>(in);
    auto* dst = static_cast<std::byte*>(out);
    if (count * es * n <= kSmallBytes) {
      // Small: one exchange of whole buffers, then every member folds all of them in group
      // order (latency dominates here; same fold, so the same bits).
      auto parts = uninitialized(count * es * n);
      std::vector<const std::byte*> ins(n);
      Exchange x(*this, self, "all_reduce");
      for (std::size_t q = 0; q < n; ++q) {
        if (q == p) {
          ins[q] = src;
          continue;
        }
        ins[q] = parts.get() + q * count * es;
        x.send(group[q], src, count * es);
        x.recv(group[q], parts.get() + q * count * es, count * es);
      }
      x.wait();
      fold(ins.data(), n, count, dst, dtype, op);
      return;
    }
    // Phase 1: member q receives elements [lo[q], lo[q+1]) of every member and folds them in
    // group order; this member's own part is read in place. The incoming parts are staged a
    // chunk at a time (kStageBytes over the peers), so a large gradient is never copied whole;
    // each element still folds the same values in the same order.
    const std::size_t mine = lo[p + 1] - lo[p], step = stage_elements(es, n);
    auto parts = uninitialized(std::min(mine, step) * es * n);
    std::vector<const std::byte*> ins(n);
    std::size_t chunks = 0;
    for (std::size_t q = 0; q < n; ++q) chunks = std::max(chunks, (lo[q + 1] - lo[q] + step - 1) / step);
    for (std::size_t k = 0; k < chunks; ++k) {
      const std::size_t c0 = k * step, m = mine > c0 ? std::min(step, mine - c0) : 0;
      Exchange x(*this, self, "all_reduce");
      for (std::size_t q = 0; q < n; ++q) {
        if (q == p) {
          ins[q] = src + (lo[p] + c0) * es;
          continue;
        }
        const std::size_t theirs = lo[q + 1] - lo[q];
        if (theirs > c0) x.send(group[q], src + (lo[q] + c0) * es, std::min(step, theirs - c0) * es);
        ins[q] = parts.get() + q * m * es;
        if (m > 0) x.recv(group[q], parts.get() + q * m * es, m * es);
      }
      // Every send of this chunk is done; `out` (which may be `in`) is written only in this
      // member's own part, which no later chunk sends.
      x.wait();
      if (m > 0) fold(ins.data(), n, m, dst + (lo[p] + c0) * es, dtype, op);
    }
    // Phase 2: everyone gathers every member's reduced part.
    Exchange y(*this, self, "all_reduce");
    for (std::size_t q = 0; q < n; ++q) {
      if (q == p) continue;
      y.send(group[q], dst + lo[p] * es, mine * es);
      y.recv(group[q], dst + lo[q] * es, (lo[q + 1] - lo[q]) * es);
    }
    y.wait();
  }

  void all_gather(Device& self, const void* in, void* out, std::size_t count, DType dtype,
                  std::span<const std::int64_t> group) override {
    const std::size_t n = group.size(), bytes = count * dtype_size(dtype), p = position(self, group);
    Exchange x(*this, self, "all_gather");
    for (std::size_t q = 0; q < n; ++q) {
      if (q == p) continue;
      x.send(group[q], in, bytes);
      x.recv(group[q], static_cast<std::byte*>(out) + q * bytes, bytes);
    }
    x.wait();
    std::memmove(static_cast<std::byte*>(out) + p * bytes, in, bytes);
  }

  void reduce_scatter(Device& self, const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                      std::span<const std::int64_t> group) override {
    const std::size_t n = group.size(), es = dtype_size(dtype), p = position(self, group);
    const auto* src = static_cast<const std::byte*>(in);
    auto* dst = static_cast<std::byte*>(out);
    // Staged a chunk at a time, as all_reduce's first phase: the same folds, no whole copy.
    const std::size_t step = stage_elements(es, n);
    auto parts = uninitialized(std::min(count, step) * es * n);
    std::vector<const std::byte*> ins(n);
    for (std::size_t c0 = 0; c0 < count; c0 += step) {
      const std::size_t m = std::min(step, count - c0);
      Exchange x(*this, self, "reduce_scatter");
      for (std::size_t q = 0; q < n; ++q) {
        if (q == p) {
          ins[q] = src + (p * count + c0) * es;
          continue;
        }
        ins[q] = parts.get() + q * m * es;
        x.send(group[q], src + (q * count + c0) * es, m * es);
        x.recv(group[q], parts.get() + q * m * es, m * es);
      }
      x.wait();
      fold(ins.data(), n, m, dst + c0 * es, dtype, op);
    }
  }

  void all_to_all(Device& self, const void* in, void* out, std::size_t count, DType dtype,
                  std::span<const std::int64_t> group) override {
    const std::size_t n = group.size(), bytes = count * dtype_size(dtype), p = position(self, group);
    auto result = uninitialized(bytes * n);
    Exchange x(*this, self, "all_to_all");
    for (std::size_t q = 0; q < n; ++q) {
      if (q == p) {
        std::memcpy(result.get() + q * bytes, static_cast<const std::byte*>(in) + p * bytes, bytes);
        continue;
      }
      x.send(group[q], static_cast<const std::byte*>(in) + q * bytes, bytes);
      x.recv(group[q], result.get() + q * bytes, bytes);
    }
    x.wait();
    std::memcpy(out, result.get(), bytes * n);
  }

  void ppermute(Device& self, const void* in, void* out, std::size_t count, DType dtype,
                std::span<const PermutePair> pairs, std::span<const std::int64_t> group) override {
    const std::size_t bytes = count * dtype_size(dtype);
    const auto p = static_cast<std::int64_t>(position(self, group));
    std::vector<std::byte> result(bytes, std::byte{0});
    Exchange x(*this, self, "ppermute");
    for (const auto& [src, dst] : pairs) {
      EDL_CHECK(src >= 0 && dst >= 0 && src < static_cast<std::int64_t>(group.size()) &&
                    dst < static_cast<std::int64_t>(group.size()),
                errc::invalid_argument, "ppermute", "pair (", src, ", ", dst, ") is outside the group of ", group.size());
      if (src == p && dst == p) std::memcpy(result.data(), in, bytes);
      else if (src == p) x.send(group[static_cast<std::size_t>(dst)], in, bytes);
      else if (dst == p) x.recv(group[static_cast<std::size_t>(src)], result.data(), bytes);
    }
    x.wait();
    std::memcpy(out, result.data(), bytes);
  }

  void broadcast(Device& self, const void* in, void* out, std::size_t count, DType dtype, std::int64_t root,
                 std::span<const std::int64_t> group) override {
    const std::size_t bytes = count * dtype_size(dtype), p = position(self, group);
    EDL_CHECK(root >= 0 && root < static_cast<std::int64_t>(group.size()), errc::invalid_argument, "broadcast",
              "root ", root, " is outside the group of ", group.size());
    Exchange x(*this, self, "broadcast");
    if (static_cast<std::int64_t>(p) == root) {
      for (std::size_t q = 0; q < group.size(); ++q)
        if (q != p) x.send(group[q], in, bytes);
      x.wait();
      std::memmove(out, in, bytes);
    } else {
      x.recv(group[static_cast<std::size_t>(root)], out, bytes);
      x.wait();
    }
  }

  void barrier(Device& self, std::span<const std::int64_t> group) override {
    const std::size_t p = position(self, group);
    char token = 0;
    std::vector<char> sink(group.size());
    Exchange x(*this, self, "barrier");
    for (std::size_t q = 0; q < group.size(); ++q) {
      if (q == p) continue;
      x.send(group[q], &token, 1);
      x.recv(group[q], &sink[q], 1);
    }
    x.wait();
  }

 private:
  // Non-blocking sends and receives of one device in one collective, waited on together with
  // a deadline. Messages between devices s and d use tag s_local * local + d_local on this
  // backend's communicator, so the streams between device pairs never mix, and MPI's
  // non-overtaking rule keeps each stream in program order.
  class Exchange {
   public:
    Exchange(MpiBackend& b, Device& self, const char* op) : b_(b), self_(self), op_(op) {}
    ~Exchange() {
      for (auto& r : reqs_)
        if (r != MPI_REQUEST_NULL) {
          MPI_Cancel(&r);
          MPI_Request_free(&r);
        }
    }
    void send(std::int64_t to, const void* data, std::size_t bytes) { post(to, const_cast<void*>(data), bytes, true); }
    void recv(std::int64_t from, void* data, std::size_t bytes) { post(from, data, bytes, false); }
    void wait() {
      const auto start = std::chrono::steady_clock::now();
      const auto deadline = start + std::chrono::duration<double>(b_.timeout_);
      const auto spin_until = start + std::chrono::milliseconds(5);
      unsigned spins = 0;
      for (;;) {
        int done = 0;
        MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &done, MPI_STATUSES_IGNORE);
        if (done) return;
        if (b_.aborted_.load())
          edl::detail::raise(errc::device_failure, self_.describe(),
                        edl::detail::concat(op_, ": stopped because another device of this rank failed"));
        if (std::chrono::steady_clock::now() > deadline) {
          std::string peers;  // each silent peer once (a message may travel in several requests)
          std::vector<std::int64_t> named;
          for (std::size_t i = 0; i < reqs_.size(); ++i)
            if (reqs_[i] != MPI_REQUEST_NULL && std::find(named.begin(), named.end(), peer_[i]) == named.end()) {
              named.push_back(peer_[i]);
              peers += (peers.empty() ? "" : ", ") + std::to_string(peer_[i]);
            }
          edl::detail::raise(errc::collective, self_.describe(),
                        edl::detail::concat(op_, ": no answer from device(s) ", peers, " within ", b_.timeout_,
                                       " s (EDL_MPI_TIMEOUT): a rank died, hangs, or called other collectives"));
        }
        // Busy-poll for the first few milliseconds, as MPI libraries do (small collectives
        // finish in microseconds, and yielding to other processes costs a time slice), then
        // sleep briefly between polls so a long wait, or more ranks than cores, does not
        // burn a core.
        if (++spins % 256 == 0 && std::chrono::steady_clock::now() > spin_until)
          std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }

   private:
    void post(std::int64_t peer, void* data, std::size_t bytes, bool is_send) {
      const int peer_rank = static_cast<int>(peer / b_.local_);
      const std::int64_t s = is_send ? self_.id() : peer, d = is_send ? peer : self_.id();
      const int tag = static_cast<int>((s % b_.local_) * b_.local_ + (d % b_.local_));
      constexpr std::size_t kMax = std::size_t{1} << 30;  // MPI counts are int: send in 1 GiB pieces
      auto* p = static_cast<std::byte*>(data);
      do {
        const std::size_t piece = std::min(bytes, kMax);
        MPI_Request r;
        if (is_send) MPI_Isend(p, static_cast<int>(piece), MPI_BYTE, peer_rank, tag, b_.comm_, &r);
        else MPI_Irecv(p, static_cast<int>(piece), MPI_BYTE, peer_rank, tag, b_.comm_, &r);
        reqs_.push_back(r);
        peer_.push_back(peer);
        p += piece;
        bytes -= piece;
      } while (bytes > 0);
    }
    MpiBackend& b_;
    Device& self_;
    const char* op_;
    std::vector<MPI_Request> reqs_;
    std::vector<std::int64_t> peer_;
  };

  static std::size_t position(const Device& self, std::span<const std::int64_t> group) {
    for (std::size_t q = 0; q < group.size(); ++q)
      if (group[q] == self.id()) return q;
    edl::detail::raise(errc::collective, self.describe(), "this device is not a member of the group it calls");
  }

  // out[i] = op over q = 0..n-1 (in group order) of ins[q][i], as the simulated backend folds
  // (every block is read before it is written, so out may be one of the inputs).
  static void fold(const std::byte* const* ins, std::size_t n, std::size_t count, std::byte* out, DType dtype,
                   ReduceOp op) {
    if (count == 0) return;
    std::byte* outs[1] = {out};
    edl::detail::sim::dispatch_reduce(dtype, "mpi reduction", [&]<class T, class Acc>() {
      edl::detail::sim::reduce_range<T, Acc>(ins, n, 0, count, outs, 1, 0, op);
    });
  }

  static constexpr std::size_t kSmallBytes = 64 * 1024;  // all_reduce: one exchange below this
  // Incoming parts of a reduction are staged this many bytes at a time (over all peers).
  static constexpr std::size_t kStageBytes = std::size_t{4} << 20;
  /// Elements per chunk of a staged reduction over `n` members.
  static std::size_t stage_elements(std::size_t element_bytes, std::size_t n) {
    return std::max<std::size_t>(1, kStageBytes / element_bytes / std::max<std::size_t>(n - 1, 1));
  }

  // Receive buffers are written before they are read: no zero fill (it costs as much as the copy).
  static std::unique_ptr<std::byte[]> uninitialized(std::size_t bytes) {
    return std::make_unique_for_overwrite<std::byte[]>(std::max<std::size_t>(bytes, 1));
  }

  std::weak_ptr<MeshContext> ctx_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int local_ = 1, rank_ = 0, ranks_ = 1;
  double timeout_ = 120.0;
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::exception_ptr first_error_;
  std::int64_t first_device_ = -1;
};

/// Puts `mesh` on MPI: this rank runs devices [rank * local, (rank + 1) * local).
template <class MeshT>
std::shared_ptr<MpiBackend> attach(const MeshT& mesh, const Session& session, int local_devices = 1) {
  auto b = std::make_shared<MpiBackend>(std::weak_ptr<MeshContext>(mesh.context()), session.comm(), local_devices);
  mesh.set_backend(b);
  return b;
}

}  // namespace edl::mpi
