// The example of README.md: shard a weight over a 4-device mesh, all-reduce inside a
// shard_map-style body, gather it back. CI builds and runs it.
#include <edl/edl.hpp>
#include <cstdio>
using namespace edl;

int main() {
  auto mesh = create_mesh({1, 2, 2, 1});                  // dp=1, fsdp=2, tp=2, sp=1: 4 devices
  Key key = Key::from_seed(42);
  xt::xtensor<float, 2> w = xt::zeros<float>({8, 6});
  fill_normal(key, 0, std::span<float>(w.data(), w.size()), 0.0f, 0.02f);
  auto ws = shard<P<"fsdp", "tp">>(w, mesh);              // each device holds a 4x3 block
  std::printf("device 3 holds %zu x %zu\n", ws.local(3).shape(0), ws.local(3).shape(1));
  mesh.run([&](Device& dev) {                              // one body per simulated device
    auto local = ws.local(dev.id());
    std::vector<float> sum(local.begin(), local.end());
    psum(dev, std::span<float>(sum), {"fsdp"});            // all-reduce over the fsdp axis
  });
  auto back = gather(ws);                                  // equals w exactly
  std::printf("round trip exact: %d\n", back == w);
  return back == w ? 0 : 1;
}
