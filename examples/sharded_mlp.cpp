// A SwiGLU MLP (Llama's feed-forward block) run data- and tensor-parallel on a simulated mesh,
// checked against the same MLP on one device. It shows the Megatron pattern edl's models use:
// gate/up column-parallel (each tp rank owns F/tp rows of W), down row-parallel (each rank owns
// F/tp columns), one psum over tp at the end; the batch is split over dp.
//
//   edl_example_sharded_mlp [dp tp]     (default 2 2)     prints one JSON object
#include <edl/edl.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

using namespace edl;

namespace {

xt::xtensor<float, 2> random_matrix(Key key, std::size_t rows, std::size_t cols, float std) {
  xt::xtensor<float, 2> m = xt::xtensor<float, 2>::from_shape({rows, cols});
  fill_normal(key, 0, std::span<float>(m.data(), m.size()), 0.0f, std);
  return m;
}

// y = down(silu(gate x) * up x) for x [N, C], gate/up [F, C], down [C, F], all row-major.
void mlp(const float* x, const float* wg, const float* wu, const float* wd, float* y, std::int64_t N, std::int64_t C,
         std::int64_t F) {
  std::vector<float> g(static_cast<std::size_t>(N * F)), u(g.size());
  kernels::matmul_nt(x, wg, g.data(), N, F, C);
  kernels::matmul_nt(x, wu, u.data(), N, F, C);
  kernels::silu_mul(g.data(), u.data(), g.data(), N * F);
  kernels::matmul_nt(g.data(), wd, y, N, C, F);
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t dp = argc > 2 ? std::atoll(argv[1]) : 2, tp = argc > 2 ? std::atoll(argv[2]) : 2;
  const std::int64_t N = 256, C = 288, F = 768;  // tokens, hidden, intermediate (the tiny config's MLP)
  try {
    auto mesh = create_mesh({dp, 1, tp, 1});
    const Key key = Key::from_seed(0);
    const auto x = random_matrix(fold_in(key, 0), N, C, 1.0f);
    const auto wg = random_matrix(fold_in(key, 1), F, C, 0.02f), wu = random_matrix(fold_in(key, 2), F, C, 0.02f);
    const auto wd = random_matrix(fold_in(key, 3), C, F, 0.02f);

    // One device.
    xt::xtensor<float, 2> y_ref = xt::zeros<float>({N, C});
    mlp(x.data(), wg.data(), wu.data(), wd.data(), y_ref.data(), N, C, F);

    // The mesh: x by rows over dp; gate/up by rows over tp; down by columns over tp.
    auto xs = shard<P<"dp", none>>(x, mesh, "x");
    auto gs = shard<P<"tp", none>>(wg, mesh, "mlp.gate_proj.weight");
    auto us = shard<P<"tp", none>>(wu, mesh, "mlp.up_proj.weight");
    auto ds = shard<P<none, "tp">>(wd, mesh, "mlp.down_proj.weight");
    const auto t0 = std::chrono::steady_clock::now();
    auto ys = shard_map<P<"dp", none>>(mesh, {N, C}, [&](Device& dev, xt::xtensor<float, 2>& y) {
      const auto id = dev.id();
      const std::int64_t n = N / dp, f = F / tp;
      mlp(xs.local(id).data(), gs.local(id).data(), us.local(id).data(), ds.local(id).data(), y.data(), n, C, f);
      psum(dev, std::span<float>(y.data(), y.size()), {"tp"});  // the row-parallel reduction
    });
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const auto y = gather(ys);
    float max_diff = 0, max_ref = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(y.data()[i] - y_ref.data()[i]));
      max_ref = std::max(max_ref, std::abs(y_ref.data()[i]));
    }
    const bool ok = max_diff <= 1e-5f * std::max(1.0f, max_ref);
    std::printf("{\"example\":\"sharded_mlp\",\"mesh\":\"%s\",\"devices\":%lld,\"tokens\":%lld,\"hidden\":%lld,"
                "\"intermediate\":%lld,\"max_abs_diff\":%.3g,\"max_abs_ref\":%.3g,\"weight_bytes_per_device\":%lld,"
                "\"weight_bytes_total\":%lld,\"ms\":%.2f,\"matches_one_device\":%s}\n",
                mesh.shape().axes_str().c_str(), static_cast<long long>(mesh.size()), static_cast<long long>(N),
                static_cast<long long>(C), static_cast<long long>(F), max_diff, max_ref,
                static_cast<long long>(gs.local_bytes() + us.local_bytes() + ds.local_bytes()),
                static_cast<long long>(3 * F * C * sizeof(float)), ms, ok ? "true" : "false");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharded_mlp: %s\n", e.what());
    return 1;
  }
}
