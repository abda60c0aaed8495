// A program that includes only the amalgamated header must compile and run.
#include <edl/edl.hpp>

#include <cstdio>

int main() {
  const edl::bf16 x(1.5f);
  const edl::Key k = edl::fold_in(edl::Key::from_seed(7), 3);
  if (x.to_float() != 1.5f || edl::uniform_at(k, 0) < 0.0f) return 1;
  std::puts("single include ok");
  return 0;
}
