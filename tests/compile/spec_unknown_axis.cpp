// "model" is not an axis of Mesh<"dp", "fsdp", "tp", "sp">.
#include <edl/mesh/all.hpp>
#include <edl/tensor/all.hpp>
int main() {
  auto mesh = edl::create_mesh({1, 1, 2, 1});
  xt::xtensor<float, 2> x = xt::zeros<float>({4, 4});
  auto s = edl::shard<edl::P<"model", edl::none>>(x, mesh);
}
