// A rank-1 spec for a rank-2 tensor.
#include <edl/mesh/all.hpp>
#include <edl/tensor/all.hpp>
int main() {
  auto mesh = edl::create_mesh({1, 1, 2, 1});
  xt::xtensor<float, 2> x = xt::zeros<float>({4, 4});
  auto s = edl::shard<edl::P<"tp">>(x, mesh);
}
