// examples/cli/mesh_flag.hpp: the `--mesh dp=1,fsdp=2,ep=1,tp=2,sp=1` flag of the model commands
// (edl logits, edl loss, edl bench train), and run_on_mesh: where these commands hand a model
// to the library's models::run_on_mesh.
//
// Syntax: comma-separated name=size items, any subset of dp, fsdp, ep, tp, sp in any order; axes
// not named have size 1. An unknown axis name, an axis named twice, an empty item, a size that
// is not a positive integer is an edl::Error (invalid_argument; a UsageError, exit code 2)
// whose where() is the flag.
// The result is the edl::MeshDims {dp, fsdp, ep, tp, sp} that edl::create_mesh takes.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <thread>
#include <cstdlib>
#include <memory>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/nn/loss.hpp>
#include <edl/nn/module.hpp>
#include <edl/mesh/launch.hpp>
#include <edl/models/llama/sharded.hpp>
#include "args.hpp"


namespace edl::cli {

using MeshDims = ::edl::MeshDims;  // dp, fsdp, ep, tp, sp
inline constexpr MeshDims kOneDevice = {1, 1, 1, 1, 1};

inline const std::array<const char*, 5>& mesh_axis_names() {
  static const std::array<const char*, 5> n = {"dp", "fsdp", "ep", "tp", "sp"};
  return n;
}

/// Parses "dp=1,fsdp=2,tp=2,sp=1" (any subset, any order; unnamed axes are 1). One size may be
/// -1: the devices left over of device_count() (one per process or MPI rank, or EDL_DEVICES).
inline MeshDims parse_mesh(const std::string& text, const std::string& flag = "--mesh") {
  MeshDims dims = kOneDevice;
  std::array<bool, 5> seen = {false, false, false, false, false};
  EDL_CLI_USAGE_CHECK(!text.empty(), errc::invalid_argument, flag,
                      "expected name=size items such as dp=1,fsdp=2,tp=2,sp=1, found an empty value");
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    EDL_CLI_USAGE_CHECK(!item.empty(), errc::invalid_argument, flag, "empty item in \"", text,
                        "\": expected name=size items separated by commas");
    const std::size_t eq = item.find('=');
    EDL_CLI_USAGE_CHECK(eq != std::string::npos, errc::invalid_argument, flag, "item \"", item,
                        "\" is not name=size (axes: dp, fsdp, ep, tp, sp)");
    const std::string name = item.substr(0, eq), value = item.substr(eq + 1);
    int axis = -1;
    for (int a = 0; a < 5; ++a)
      if (name == mesh_axis_names()[static_cast<std::size_t>(a)]) axis = a;
    EDL_CLI_USAGE_CHECK(axis >= 0, errc::invalid_argument, flag, "unknown mesh axis \"", name,
                        "\", expected one of dp, fsdp, ep, tp, sp");
    EDL_CLI_USAGE_CHECK(!seen[static_cast<std::size_t>(axis)], errc::invalid_argument, flag, "axis ", name,
                        " is given twice in \"", text, "\"");
    seen[static_cast<std::size_t>(axis)] = true;
    std::size_t pos = 0;
    long long v = 0;
    bool ok = !value.empty() && value.find_first_not_of("+-0123456789") == std::string::npos;
    if (ok) {
      try {
        v = std::stoll(value, &pos);
      } catch (...) {
        ok = false;
      }
    }
    EDL_CLI_USAGE_CHECK(ok && pos == value.size(), errc::invalid_argument, flag, "size of axis ", name,
                        " must be a positive integer or -1, found \"", value, "\"");
    EDL_CLI_USAGE_CHECK(v > 0 || v == -1, errc::invalid_argument, flag, "size of axis ", name,
                        " must be a positive integer or -1, found ", v);
    dims[static_cast<std::size_t>(axis)] = v;
  }
  try {  // infer_mesh_dims's errors name the flag; on the command line they are usage errors
    return infer_mesh_dims(dims, -1, flag, errc::invalid_argument);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.code(), e.where(), e.message());
  }
}

/// "dp=1,fsdp=2,tp=2,sp=1" ("dp=1,fsdp=1,ep=2,tp=1,sp=1": ep is named when it is not 1).
inline std::string mesh_str(const MeshDims& d) {
  std::string s;
  for (std::size_t a = 0; a < 5; ++a)
    if (a != 2 || d[a] != 1) s += (s.empty() ? "" : ",") + std::string(mesh_axis_names()[a]) + "=" + std::to_string(d[a]);
  return s;
}

/// {"dp": 1, "fsdp": 2, "ep": 1, "tp": 2, "sp": 1}
inline nlohmann::ordered_json mesh_json(const MeshDims& d) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (std::size_t a = 0; a < 5; ++a) j[mesh_axis_names()[a]] = d[a];
  return j;
}

/// The --mesh flag of a command's table; `help` says what the mesh runs.
inline Flag declare_mesh_flag(std::string help = "the device mesh the model runs on: any of dp, fsdp, ep, tp, sp with their sizes") {
  return text_flag("--mesh", "dp=1,fsdp=1,tp=1,sp=1", std::move(help)).defaults("one device");
}

/// Reads --mesh (default: one device).
inline MeshDims mesh_flag(Args& args) {
  const std::string s = args.str("--mesh", "");
  if (!args.has("--mesh")) return kOneDevice;
  return parse_mesh(s, "--mesh");
}

/// THE call site of model execution for edl logits / loss / bench train: the mesh of `dims`
/// (spread over the ranks of an mpirun launch; invalid sizes fail before any work) and
/// models::run_on_mesh on it, one device or many.
template <class Model>
nn::LossMetrics run_on_mesh(const MeshDims& dims, Model& model, models::MeshOp op, const std::int64_t* ids,
                            const nn::TokenLayout& layout, const std::int64_t* labels = nullptr,
                            float* logits_out = nullptr, std::string_view remat = {}) {
  models::MeshRun r;
  r.op = op;
  r.ids = ids;
  r.layout = layout;
  r.labels = labels;
  r.logits_out = logits_out;
  r.remat = remat;
  return models::run_on_mesh(model, launch_mesh(dims, "--mesh"), r);
}

}  // namespace edl::cli
