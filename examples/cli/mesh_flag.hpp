// examples/cli/mesh_flag.hpp: the `--mesh dp=1,fsdp=2,ep=1,tp=2,sp=1` flag of the model commands
// (edl logits, edl loss, edl bench train), and run_on_mesh: the ONE place where these commands
// execute a model, on one device or (once sharded execution lands) on a mesh.
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
#include <edl/models/llama/sharded.hpp>
#include "args.hpp"

#ifdef EDL_WITH_MPI
#include <edl/mesh/backends/mpi.hpp>
#endif

namespace edl::cli {

/// How this process was launched: alone, or as one of the ranks of mpirun. Under mpirun every
/// rank runs the same command; the --mesh devices are spread over the ranks (devices / ranks
/// each, mesh/backends/mpi.hpp gives the order), and only rank 0 prints and writes files.
struct Launch {
  int rank = 0, ranks = 1;
#ifdef EDL_WITH_MPI
  std::unique_ptr<mpi::Session> session;
#endif
};
inline Launch& launch() {
  static Launch l;
  return l;
}
/// Ranks announced by the launcher's environment (Open MPI, MPICH/PMI), 1 when none.
inline int launcher_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  return 1;
}
/// Starts MPI when mpirun launched more than one rank. An edl built without MPI refuses such
/// a launch instead of running the same work N times.
inline void init_launch(int& argc, char**& argv) {
  const int n = launcher_ranks();
  if (n <= 1) return;
#ifdef EDL_WITH_MPI
  launch().session = std::make_unique<mpi::Session>(argc, argv);
  launch().rank = launch().session->rank();
  launch().ranks = launch().session->size();
#else
  (void)argc;
  (void)argv;
  throw Error(errc::unsupported, "edl", "launched on " + std::to_string(n) +
                                           " MPI ranks, but this edl was built without MPI (install libopenmpi-dev and rebuild)");
#endif
}
/// Whether this process prints results and writes output files.
inline bool is_primary() { return launch().rank == 0; }

/// After a command failed on this rank (its error already printed): ends every rank of the
/// launch with `code`. The others may be waiting in a collective for this one, and MPI_Finalize
/// waits for every rank, so returning from main could hang the job. A rank other than 0 first
/// gives rank 0 a moment to print its own view of the failure (often the same error, agreed).
inline void end_launch_after_error(int code) {
#ifdef EDL_WITH_MPI
  if (launch().ranks <= 1 || !launch().session) return;
  std::fflush(stderr);
  if (!is_primary()) std::this_thread::sleep_for(std::chrono::seconds(1));
  MPI_Abort(launch().session->comm(), code);
#else
  (void)code;
#endif
}

using MeshDims = ::edl::MeshDims;  // dp, fsdp, ep, tp, sp
inline constexpr MeshDims kOneDevice = {1, 1, 1, 1, 1};

inline const std::array<const char*, 5>& mesh_axis_names() {
  static const std::array<const char*, 5> n = {"dp", "fsdp", "ep", "tp", "sp"};
  return n;
}

/// Parses "dp=1,fsdp=2,tp=2,sp=1" (any subset, any order; unnamed axes are 1).
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
                        " must be a positive integer, found \"", value, "\"");
    EDL_CLI_USAGE_CHECK(v > 0, errc::invalid_argument, flag, "size of axis ", name, " must be a positive integer, found ", v);
    dims[static_cast<std::size_t>(axis)] = v;
  }
  return dims;
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

/// The mesh of `dims`; under mpirun its devices are spread over the ranks (checked before
/// any work: the device count must be a multiple of the ranks). `source` names where the
/// sizes came from, for the error.
inline DefaultMesh make_mesh(const MeshDims& dims, const std::string& source = "--mesh") {
  DefaultMesh mesh = create_mesh(dims);
  const int ranks = launch().ranks;
  if (ranks > 1) {
    EDL_CHECK(mesh.size() % ranks == 0, errc::invalid_argument, source, "the mesh ", mesh_str(dims), " has ",
              mesh.size(), " devices, which the ", ranks, " MPI ranks of this launch cannot share evenly (give a mesh of ",
              ranks, " x devices-per-rank)");
#ifdef EDL_WITH_MPI
    mpi::attach(mesh, *launch().session, static_cast<int>(mesh.size() / ranks));
#endif
  }
  return mesh;
}

/// What run_on_mesh computes.
enum class MeshOp {
  logits,          // logits_out [tokens, vocab]
  loss,            // the loss only
  loss_and_grads,  // the loss, and every gradient zeroed then accumulated into the model's Param::grad
};

/// THE call site of model execution for edl logits / loss / bench train. One device: the
/// model directly; a larger mesh: models::sharded_* (models/llama/sharded.hpp), which equal
/// one device to f32 rounding. The mesh is built from `dims` first, so invalid sizes fail
/// before any work. (position_ids / attention_mask of `layout` are one-device only for now.)
/// `remat` names the gradient-checkpointing policy of loss_and_grads (remat::runtime_names;
/// "" = the model's own); the sharded path keeps every activation, or with nothing_saveable
/// runs each layer again in its backward.
template <class Model>
nn::LossMetrics run_on_mesh(const MeshDims& dims, Model& model, MeshOp op, const std::int64_t* ids,
                            const nn::TokenLayout& layout, const std::int64_t* labels = nullptr,
                            float* logits_out = nullptr, std::string_view remat = {}) {
  const DefaultMesh mesh = make_mesh(dims);
  EDL_CHECK(remat.empty() || mesh.size() == 1 || remat == "everything_saveable" || remat == "nothing_saveable",
            errc::unsupported, "--remat",
            "on a mesh the sharded step rematerializes whole layers (nothing_saveable) or keeps everything "
            "(everything_saveable); found \"", remat, "\"");
  if (mesh.size() == 1) {
    switch (op) {
      case MeshOp::logits:
        model.logits(ids, layout, logits_out);
        return {};
      case MeshOp::loss:
        return model.loss(ids, layout, labels);
      case MeshOp::loss_and_grads: {
        nn::zero_grad(model);
        if (remat.empty()) return model.forward_backward(ids, layout, labels);
        nn::LossMetrics m;
        EDL_CHECK(remat::dispatch(remat, [&]<class R>() { m = model.template forward_backward<R>(ids, layout, labels); }),
                  errc::invalid_argument, "--remat", "unknown policy \"", remat, "\"");
        return m;
      }
    }
  }
  EDL_CHECK(layout.attention_mask == nullptr && layout.position_ids == nullptr, errc::unsupported, "--mesh",
            "attention masks and position ids run on one device only for now");
  const std::span<const std::int64_t> tokens(ids, static_cast<std::size_t>(layout.tokens()));
  if (op == MeshOp::logits) {
    const auto l = models::sharded_logits(model, mesh, tokens, layout.batch, layout.seq);
    std::copy(l.begin(), l.end(), logits_out);
    return {};
  }
  const std::span<const std::int64_t> lab =
      labels ? std::span<const std::int64_t>(labels, tokens.size()) : std::span<const std::int64_t>();
  auto r = models::sharded_loss_and_grads(model, mesh, tokens, lab, layout.batch, layout.seq, {},
                                          llama_partition_rules(), remat == "nothing_saveable");
  if (op == MeshOp::loss_and_grads) {
    nn::zero_grad(model);
    model.visit_params("", [&](std::string_view path, auto& p) {
      if (p.frozen) return;  // a LoRA base: no gradient
      const auto& g = r.grads.at(std::string(path));
      std::copy(g.begin(), g.end(), p.grad_data());
    });
  }
  return r.metrics;
}

}  // namespace edl::cli
