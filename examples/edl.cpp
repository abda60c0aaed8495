// The `edl` command-line tool. Each subcommand prints JSON so other programs can parse it.
#include <edl/edl.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>
#include <xsimd/xsimd.hpp>

namespace {

int cmd_info() {
  nlohmann::json j;
  j["version"] = EDL_VERSION_STRING;
  j["xsimd_arch"] = xsimd::default_arch::name();
  j["tbb_threads"] = edl::exec::num_threads();
#if defined(__clang__)
  j["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  j["compiler"] = std::string("gcc ") + __VERSION__;
#endif
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  try {
    if (cmd == "info") return cmd_info();
    std::fprintf(stderr, "usage: edl info\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edl %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
