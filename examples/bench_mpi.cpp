// Collectives on MPI ranks: edl's MPI backend next to the MPI library's own collective in the
// same run (raw MPI_Allreduce / MPI_Allgather / MPI_Reduce_scatter_block on the same bytes).
//
//   mpirun -np 2 edl_bench_mpi [--bytes 1M] [--repeat R]
//
// One JSON line per (op, impl) on rank 0: op, ranks, bytes, impl ("edl" | "mpi"), us, gbps
// (bus bandwidth as nccl-tests defines it: all_reduce x 2(n-1)/n, all_gather and
// reduce_scatter x (n-1)/n; bytes = each rank's buffer for all_reduce, the gathered output for
// all_gather, the input for reduce_scatter), and ratio = edl / mpi on the edl line.
#include <edl/edl.hpp>
#include <edl/mesh/backends/mpi.hpp>

#include <chrono>
#include <cstdio>
#include <string>

using namespace edl;

namespace {

std::size_t parse_bytes(std::string s) {
  std::size_t mul = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) mul = 1024, s.pop_back();
  else if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) mul = 1 << 20, s.pop_back();
  else if (!s.empty() && (s.back() == 'G' || s.back() == 'g')) mul = 1 << 30, s.pop_back();
  return static_cast<std::size_t>(std::stoull(s)) * mul;
}

template <class F>
double time_us(int repeat, F&& f) {  // median-free: total over repeat calls after one warm-up
  f();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < repeat; ++i) f();
  MPI_Barrier(MPI_COMM_WORLD);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / repeat;
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Session session(argc, argv);
  std::string bytes_s = "1M";
  int repeat = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--bytes") bytes_s = argv[i + 1];
    if (std::string(argv[i]) == "--repeat") repeat = std::atoi(argv[i + 1]);
  }
  try {
    const std::size_t bytes = parse_bytes(bytes_s);
    const int n = session.size();
    if (repeat <= 0) repeat = static_cast<int>(std::clamp<std::size_t>((256u << 20) / std::max<std::size_t>(bytes, 1), 5, 1000));
    auto mesh = create_mesh({1, 1, n, 1});
    mpi::attach(mesh, session, 1);
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> a(count, 1.0f), b(count, 0.0f);
    const double busbw_ar = 2.0 * (n - 1) / n, busbw_ag = static_cast<double>(n - 1) / n;
    struct Row { const char* op; double edl_us, mpi_us, factor; };
    std::vector<Row> rows;
    {  // all_reduce: each rank's buffer is `bytes`
      double e = 0, m = 0;
      mesh.run([&](Device& dev) {
        e = time_us(repeat, [&] { psum(dev, std::span<float>(a), {"tp"}); });
      });
      m = time_us(repeat, [&] { MPI_Allreduce(MPI_IN_PLACE, a.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
      rows.push_back({"all_reduce", e, m, busbw_ar});
    }
    {  // all_gather: the gathered output is `bytes`
      const std::size_t part = count / static_cast<std::size_t>(n);
      double e = 0, m = 0;
      mesh.run([&](Device& dev) {
        e = time_us(repeat, [&] { all_gather(dev, std::span<const float>(a.data(), part), std::span<float>(b.data(), part * n), {"tp"}); });
      });
      m = time_us(repeat, [&] {
        MPI_Allgather(a.data(), static_cast<int>(part), MPI_FLOAT, b.data(), static_cast<int>(part), MPI_FLOAT, MPI_COMM_WORLD);
      });
      rows.push_back({"all_gather", e, m, busbw_ag});
    }
    {  // reduce_scatter: the input is `bytes`
      const std::size_t part = count / static_cast<std::size_t>(n);
      double e = 0, m = 0;
      mesh.run([&](Device& dev) {
        e = time_us(repeat, [&] { reduce_scatter(dev, std::span<const float>(a.data(), part * n), std::span<float>(b.data(), part), {"tp"}); });
      });
      m = time_us(repeat, [&] {
        MPI_Reduce_scatter_block(a.data(), b.data(), static_cast<int>(part), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      });
      rows.push_back({"reduce_scatter", e, m, busbw_ag});
    }
    if (session.rank() == 0)
      for (const auto& r : rows) {
        const double ge = static_cast<double>(bytes) / (r.edl_us * 1e3) * r.factor;
        const double gm = static_cast<double>(bytes) / (r.mpi_us * 1e3) * r.factor;
        std::printf("{\"op\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"impl\":\"edl\",\"us\":%.1f,\"gbps\":%.4g,\"ratio\":%.3f}\n",
                    r.op, n, bytes, r.edl_us, ge, r.mpi_us / r.edl_us);
        std::printf("{\"op\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"impl\":\"mpi\",\"us\":%.1f,\"gbps\":%.4g}\n", r.op, n,
                    bytes, r.mpi_us, gm);
      }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edl_bench_mpi (rank %d): %s\n", session.rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
