// edl/tensor/shard_map.hpp
// shard_map with a sharded result: every device computes its own block of the output from its
// local blocks of the inputs (captured by the body), with collectives where the math needs
// them — JAX's shard_map(f, mesh, in_specs, out_specs) with the in_specs carried by the inputs.
//
//   // y = x W^T, x: P<"dp", none> [N, C], W column-parallel P<"tp", none> [F, C] -> y: P<"dp", "tp">
//   auto y = shard_map<P<"dp", "tp">>(mesh, {N, F}, [&](Device& dev, xt::xtensor<float, 2>& y_local) {
//     const auto& xl = x.local(dev.id());  const auto& wl = w.local(dev.id());
//     kernels::matmul_nt(xl.data(), wl.data(), y_local.data(), xl.shape(0), wl.shape(0), xl.shape(1));
//   });
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>

#include <edl/mesh/device.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/tensor/sharded_tensor.hpp>

namespace edl {

/// Allocates the output (zeros, laid out by OutSpec over `out_shape`), runs
/// body(Device&, local output block) on every device concurrently, and returns the output.
template <PartitionSpecType OutSpec, class T = float, Name... Axes, class F>
  requires std::is_invocable_v<F&, Device&, xt::xtensor<T, OutSpec::rank>&>
ShardedTensor<T, OutSpec> shard_map(const Mesh<Axes...>& mesh, const std::array<std::int64_t, OutSpec::rank>& out_shape,
                                    F&& body) {
  auto out = zeros_sharded<OutSpec, T>(out_shape, mesh, "shard_map output");
  mesh.run([&](Device& dev) { body(dev, out.local(dev.id())); });
  return out;
}

}  // namespace edl
