// save_only_these_names with a name that is not a checkpoint name ("mlp_out": the layer's
// output is always kept, so it has no name) must not compile.
#include <edl/core/policy.hpp>

int main() {
  using R = edl::remat::save_only_these_names<"attn_out", "mlp_out">;
  return R::saves("attn_out") ? 0 : 1;
}
