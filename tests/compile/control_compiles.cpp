// The correct use of everything the failing files misuse: this must compile cleanly.
#include <edl/mesh/all.hpp>
#include <edl/tensor/all.hpp>
int main() {
  auto mesh = edl::create_mesh({1, 1, 2, 1});
  xt::xtensor<float, 2> x = xt::zeros<float>({4, 4});
  auto s = edl::shard<edl::P<"tp", edl::none>>(x, mesh);
  return static_cast<int>(edl::Mesh<"dp", "tp">::axis_index<"tp">()) + static_cast<int>(s.rank()) - 3;
}
