// Consumer of an installed edl: includes the umbrella header and runs a little of it.
#include <edl/edl.hpp>

#include <cstdio>

int main() {
  const edl::f16 h(0.1f);
  const float back = h.to_float();
  std::printf("edl consumer ok: f16(0.1) = %.6f\n", back);
  return back > 0.0999f && back < 0.1001f ? 0 : 1;
}
