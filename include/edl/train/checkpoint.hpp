// edl/train/checkpoint.hpp
// Training checkpoints: everything needed to continue a run with bit-identical losses.
//
//   <save_directory>/checkpoint-<step>/
//     config.json            HF config of the model
//     model.safetensors      parameters by HF name (loadable by HF / from_pretrained)
//     optimizer.safetensors  optimizer slots as "<param path>.<slot>" (F32, 1-D), metadata step_count
//     tokenizer.json         when the run has a tokenizer
//     state.json             step, epoch, position in the data order, data RNG key, optimizer
//                            step count, eval loss, training arguments (written last)
//
// A LoRA run's checkpoint holds adapter_config.json + adapter_model.safetensors (a PEFT adapter
// folder) in place of config.json + model.safetensors: the base never changes, so resuming
// rebuilds it from the run's "model" and loads the adapter and its optimizer slots.
//
// save_state() writes into "<parent>/.checkpoint-<step>.tmp-<pid>", fsyncs every file and the
// folder, then renames the folder to checkpoint-<step> and fsyncs the parent: a crash at any
// point leaves either no checkpoint-<step> or a complete one, and never touches older ones.
//
// Saved by the N processes of one mesh (ProcessGroup, e.g. ranks of mpirun), all of which call
// save_state with the same arguments (the gathered model and optimizer state): the folder is
// "<parent>/.checkpoint-<step>.tmp-<pid of rank 0>"; rank 0 writes config.json,
// model.safetensors and tokenizer.json, every rank r writes the optimizer slots of the
// parameters it is assigned (the i-th parameter path goes to rank i % N) as
//     optimizer-<r+1>-of-<N>.safetensors   (5-digit numbers, as HF weight shards)
// in place of optimizer.safetensors. Then the ranks agree (a collective of the mesh, with the
// backend's deadline): if any rank failed to write its part, every rank throws and none
// commits; otherwise rank 0 writes state.json last, renames the folder into place, and a
// second agreement tells every rank whether the commit happened. A rank that dies makes the
// agreement fail on the others; the temporary folder is never listed as a checkpoint, and
// the next run removes it. load_state reads either layout.
// CheckpointManager lists complete checkpoints (those with state.json), removes leftover
// temporary folders, and keeps the newest `save_total_limit` plus the best by eval loss
// (a pruned folder is first renamed away, then removed).
#pragma once

#include <algorithm>
#include <cstdio>
#include <exception>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/core/rng.hpp>
#include <edl/io/atomic_file.hpp>
#include <edl/io/json_config.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/lora/peft.hpp>
#include <edl/mesh/process_group.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/tokenizer/tokenizer.hpp>
#include <edl/version.hpp>

namespace edl::train {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

/// Where a run stands; saved as state.json.
struct TrainState {
  std::int64_t step = 0;            // optimizer steps done
  std::int64_t epoch = 0;           // epoch of the next batch
  std::int64_t batch_in_epoch = 0;  // index of the next batch in that epoch's order
  Key data_key{};                   // the key the per-epoch orders come from
  std::int64_t optimizer_step_count = 0;
  std::int64_t tokens_seen = 0;     // target tokens trained on
  double elapsed_s = 0.0;           // training time so far (all sessions)
  std::optional<double> eval_loss;  // of an evaluation at this step
  std::optional<double> last_loss;  // training loss of the last step
  bool optimizer_saved = true;      // false: a weights-only checkpoint (SaveStateOptions::save_optimizer)
  ojson training_arguments = nullptr;

  ojson to_json() const {
    ojson j = ojson::object();
    j["step"] = step;
    j["epoch"] = epoch;
    j["batch_in_epoch"] = batch_in_epoch;
    j["data_key"] = {data_key.k0, data_key.k1};
    j["optimizer_step_count"] = optimizer_step_count;
    j["tokens_seen"] = tokens_seen;
    j["elapsed_s"] = elapsed_s;
    j["eval_loss"] = eval_loss ? ojson(*eval_loss) : ojson(nullptr);
    j["last_loss"] = last_loss ? ojson(*last_loss) : ojson(nullptr);
    j["optimizer_saved"] = optimizer_saved;
    j["edl_version"] = EDL_VERSION_STRING;
    j["training_arguments"] = training_arguments;
    return j;
  }
  static TrainState from_json(const ojson& j, const std::string& source) {
    io::JsonConfig c(j, source);
    TrainState s;
    s.step = c.get<std::int64_t>("step");
    s.epoch = c.get<std::int64_t>("epoch");
    s.batch_in_epoch = c.get<std::int64_t>("batch_in_epoch");
    const auto k = c.get<std::vector<std::uint32_t>>("data_key");
    EDL_CHECK(k.size() == 2, errc::format, c.where("data_key"), "expected two 32-bit words, found ", k.size());
    s.data_key = {k[0], k[1]};
    s.optimizer_step_count = c.get<std::int64_t>("optimizer_step_count");
    s.tokens_seen = c.get<std::int64_t>("tokens_seen", 0);
    s.elapsed_s = c.get<double>("elapsed_s", 0.0);
    s.eval_loss = c.optional<double>("eval_loss");
    s.last_loss = c.optional<double>("last_loss");
    s.optimizer_saved = c.get<bool>("optimizer_saved", true);
    s.training_arguments = c.get<ojson>("training_arguments", ojson(nullptr));
    return s;
  }
  static TrainState from_file(const std::string& path) {
    auto c = io::JsonConfig::from_file(path);
    return from_json(c.json(), path);
  }
};

namespace detail {

inline void fsync_path(const std::string& p, bool directory) {
  const int fd = ::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

inline std::optional<std::int64_t> checkpoint_step(const std::string& name) {
  static const std::string prefix = "checkpoint-";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return std::nullopt;
  std::int64_t v = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace detail

/// The base model a run trains from, for adapter_config.json's base_model_name_or_path: the
/// training arguments' "model" (a folder or a preset name), or "edl-model" for a config object.
template <class Json>
std::string base_model_name(const Json& training_arguments) {
  if (training_arguments.is_object() && training_arguments.contains("model") && training_arguments["model"].is_string())
    return training_arguments["model"].template get<std::string>();
  return "edl-model";
}

/// Whether `model` carries LoRA adapters (a model without Linears never does).
template <class Model>
bool has_adapters(Model& model) {
  if constexpr (requires { model.visit_linears("", [](const std::string&, auto&) {}); })
    return lora::lora_is_enabled(model);
  else
    return false;
}

/// Writes config.json + model.safetensors (HF layout, models::save_pretrained) into `dir`,
/// in `dtype` when given (else the parameters' own).
template <class Model>
void save_model_hf(const std::string& dir, Model& model, std::optional<DType> dtype = std::nullopt) {
  models::SavePretrainedOptions o;
  o.dtype = dtype;
  models::save_pretrained(fs::path(dir), model, o);
}

/// Reads every parameter of `model` from dir/model.safetensors (or a sharded index) by HF
/// name (models::load_weights: missing, mis-shaped and unexpected tensors are errors).
template <class Model>
void load_model_weights(const std::string& dir, Model& model) {
  const auto ck = io::ShardedCheckpoint::open(dir);
  models::load_weights(model, ck);
}

/// Hooks for tests: called after each file of a checkpoint is written (throw to simulate a crash).
struct CheckpointHooks {
  std::function<void(const std::string& file)> after_file;
};

/// What a checkpoint holds besides its state.json (the seeds' save_state(float_dtype=...,
/// save_optimizer=...)).
struct SaveStateOptions {
  /// The weights' dtype in model.safetensors (F32, BF16 or F16: a bf16 copy of an f32 run is
  /// half the size); none: the parameters' own. Loading converts back with one rounding.
  std::optional<DType> float_dtype;
  /// false: a weights-only checkpoint (no optimizer files; state.json says
  /// "optimizer_saved": false). Loading it starts the optimizer afresh.
  bool save_optimizer = true;
};

/// The optimizer file of rank `rank` (0-based) of `ranks` saving processes:
/// "optimizer-00001-of-00002.safetensors"; "optimizer.safetensors" for one process.
inline std::string optimizer_file_name(int rank, int ranks) {
  if (ranks <= 1) return "optimizer.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "optimizer-%05d-of-%05d.safetensors", rank + 1, ranks);
  return buf;
}

/// The optimizer's kind and hyper-parameters as JSON (what an optimizer file records).
inline nlohmann::ordered_json optimizer_options_json(const optim::OptimizerOptions& o) {
  nlohmann::ordered_json j;
  j["optimizer"] = optim::optimizer_name(o.kind);
  j["b1"] = o.b1;
  j["b2"] = o.b2;
  j["eps"] = o.eps;
  j["weight_decay"] = o.weight_decay;
  j["momentum"] = o.momentum;
  j["rmsprop_alpha"] = o.rmsprop_alpha;
  j["rmsprop_centered"] = o.rmsprop_centered;
  j["nesterov"] = o.nesterov;
  j["decay_all"] = o.decay_all;
  j["adafactor_eps1"] = o.adafactor_eps1;
  j["adafactor_clip"] = o.adafactor_clip;
  j["adafactor_decay"] = o.adafactor_decay;
  return j;
}

/// The options optimizer_options_json wrote; `where` names the file for errors.
inline optim::OptimizerOptions optimizer_options_from_json(const nlohmann::ordered_json& j, const std::string& where) {
  optim::OptimizerOptions o;
  try {
    o.kind = optim::optimizer_from_name(j.at("optimizer").get<std::string>());
    o.b1 = j.at("b1").get<double>();
    o.b2 = j.at("b2").get<double>();
    o.eps = j.at("eps").get<double>();
    o.weight_decay = j.at("weight_decay").get<double>();
    o.momentum = j.at("momentum").get<double>();
    o.rmsprop_alpha = j.at("rmsprop_alpha").get<double>();
    o.rmsprop_centered = j.at("rmsprop_centered").get<bool>();
    o.nesterov = j.at("nesterov").get<bool>();
    o.decay_all = j.at("decay_all").get<bool>();
    o.adafactor_eps1 = j.at("adafactor_eps1").get<double>();
    o.adafactor_clip = j.at("adafactor_clip").get<double>();
    o.adafactor_decay = j.at("adafactor_decay").get<double>();
  } catch (const std::exception& e) {  // a missing or mistyped field, an unknown optimizer
    ::edl::detail::raise(errc::format, where, ::edl::detail::concat("the optimizer's options: ", e.what()));
  }
  return o;
}

namespace detail {

/// Writes the optimizer slots of the parameters assigned to `rank` of `ranks` (every
/// parameter for one process) to `path`.
inline void save_optimizer_part(const std::string& path, const optim::Optimizer& opt, int rank, int ranks) {
  io::TensorList slots;
  std::map<std::string, std::size_t> index;  // parameter path -> its position in visit order
  opt.visit_state([&](const std::string& p, const std::string& slot, const std::vector<float>& v) {
    const std::size_t i = index.emplace(p, index.size()).first->second;
    if (static_cast<int>(i % static_cast<std::size_t>(ranks)) != rank) return;
    slots.emplace_back(p + "." + slot, io::TensorRef(std::span<const float>(v.data(), v.size()),
                                                     {static_cast<std::int64_t>(v.size())}));
  });
  io::save_safetensors(path, slots,
                       {{"format", "edl"},
                        {"optimizer", optim::optimizer_name(opt.options().kind)},
                        {"step_count", std::to_string(opt.step_count())},
                        {"options", optimizer_options_json(opt.options()).dump()},
                        {"part", std::to_string(rank + 1)},
                        {"parts", std::to_string(ranks)}});
}

/// Sets the slots of optimizer file `file` (named `path` for errors) into `opt`.
inline void load_optimizer_slots(const io::SafeTensorsFile& file, const std::string& path, optim::Optimizer& opt) {
  for (const auto& name : file.names()) {
    const auto dot = name.rfind('.');
    EDL_CHECK(dot != std::string::npos && dot > 0, errc::format, path, "tensor \"", name, "\" is not named <path>.<slot>");
    opt.set_slot(name.substr(0, dot), name.substr(dot + 1), file.read_vector<float>(name));
  }
}

/// Runs `f` on every process, then agrees (ProcessGroup::on_every_rank): if any failed, every
/// process throws and the checkpoint is not committed.
template <class F>
void on_every_rank(const ProcessGroup& pg, const fs::path& checkpoint, const char* what, F&& f) {
  pg.on_every_rank(checkpoint.string(), what, std::forward<F>(f),
                   "; this checkpoint was not committed (the previous one stays the newest)");
}

}  // namespace detail

namespace detail {

/// The atomic, collective commit of checkpoint folder `dir` (see the header comment): rank 0
/// makes the temporary folder and calls `prepare(tmp)`; then every rank calls
/// `write_part(tmp)`; then rank 0 writes `state` as state.json, last, and renames the folder
/// into place. `after(file)` runs the test hooks.
template <class Prepare, class WritePart>
void commit_checkpoint(const std::string& dir, const TrainState& state, const CheckpointHooks& hooks,
                       const ProcessGroup& processes, Prepare&& prepare, WritePart&& write_part) {
  const bool primary = processes.is_primary();
  const fs::path final_path = fs::absolute(fs::path(dir)).lexically_normal();
  const fs::path parent = final_path.parent_path();
  // One folder for all ranks, named after rank 0's process id.
  const fs::path tmp = parent / ("." + final_path.filename().string() + ".tmp-" +
                                 std::to_string(processes.from_primary(static_cast<std::int64_t>(::getpid()))));
  std::error_code ec;
  struct Cleanup {
    fs::path p;
    bool done = false;
    ~Cleanup() {
      if (!done) {
        std::error_code e;
        fs::remove_all(p, e);
      }
    }
  } cleanup{tmp, !primary};  // rank 0 removes an uncommitted folder

  on_every_rank(processes, final_path, "prepare the temporary folder", [&] {
    if (!primary) return;
    fs::create_directories(parent);
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp);
    prepare(tmp);
  });
  on_every_rank(processes, final_path, "write its part", [&] { write_part(tmp); });
  on_every_rank(processes, final_path, "commit", [&] {
    if (!primary) return;
    io::write_file_atomic((tmp / "state.json").string(), state.to_json().dump(2) + "\n");
    if (hooks.after_file) hooks.after_file("state.json");
    fsync_path(tmp.string(), true);

    if (fs::exists(final_path)) {  // same step saved again: move the old one away first
      const fs::path old = parent / ("." + final_path.filename().string() + ".old-" + std::to_string(::getpid()));
      fs::remove_all(old, ec);
      fs::rename(final_path, old);
      fs::remove_all(old, ec);
    }
    fs::rename(tmp, final_path);
    cleanup.done = true;
    fsync_path(parent.string(), true);
  });
}

}  // namespace detail

/// Writes a complete checkpoint to `dir` atomically (see the header comment). An existing
/// `dir` (a re-save of the same step) is replaced. `processes`: the processes of the mesh
/// that save together (every one of them calls this); the default is this process alone.
template <class Model>
void save_state(const std::string& dir, Model& model, const optim::Optimizer& opt, const TrainState& state,
                const tokenizer::Tokenizer* tokenizer = nullptr, const CheckpointHooks& hooks = {},
                const ProcessGroup& processes = {}, const SaveStateOptions& contents = {}) {
  const bool primary = processes.is_primary();
  auto after = [&](const std::string& f) {
    if (hooks.after_file) hooks.after_file(f);
  };
  TrainState s = state;
  s.optimizer_step_count = contents.save_optimizer ? opt.step_count() : 0;
  s.optimizer_saved = contents.save_optimizer;
  detail::commit_checkpoint(dir, s, hooks, processes, [](const fs::path&) {}, [&](const fs::path& tmp) {
    if (primary && has_adapters(model)) {  // LoRA: the adapter alone, as PEFT writes it
      lora::write_adapter_files(tmp, model, base_model_name(state.training_arguments));
      after(lora::kAdapterWeightsFile);
    } else if (primary) {
      save_model_hf(tmp.string(), model, contents.float_dtype);
      after("model.safetensors");
    }
    if (contents.save_optimizer) {
      const std::string opt_file = optimizer_file_name(processes.rank(), processes.size());
      detail::save_optimizer_part((tmp / opt_file).string(), opt, processes.rank(), processes.size());
      after(opt_file);
    }
    if (primary && tokenizer) {
      tokenizer->save(tmp.string());
      after("tokenizer.json");
    }
  });
}

/// The optimizer files of checkpoint folder `dir`: optimizer.safetensors (saved by one
/// process), or all N parts optimizer-<i>-of-<N>.safetensors (saved by N); a missing part is
/// an errc::format error naming it.
inline std::vector<std::string> optimizer_files(const std::string& dir) {
  const fs::path single = fs::path(dir) / optimizer_file_name(0, 1);
  if (fs::exists(single)) return {single.string()};
  int parts = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int i = 0, n = 0;
    char tail[32] = {};
    const std::string name = e.path().filename().string();
    if (std::sscanf(name.c_str(), "optimizer-%5d-of-%5d.%31s", &i, &n, tail) == 3 && std::string(tail) == "safetensors")
      parts = std::max(parts, n);
  }
  EDL_CHECK(parts > 0, errc::format, dir, "no optimizer state: expected optimizer.safetensors or optimizer-<i>-of-<N>.safetensors");
  std::vector<std::string> files;
  for (int r = 0; r < parts; ++r) {
    const fs::path p = fs::path(dir) / optimizer_file_name(r, parts);
    EDL_CHECK(fs::exists(p), errc::format, p.string(), "missing: the checkpoint's optimizer state has ", parts,
              " parts and this one is not there");
    files.push_back(p.string());
  }
  return files;
}

/// Loads the model weights and optimizer state of a checkpoint; returns its state.json. A
/// weights-only checkpoint leaves `opt` as it is (a fresh optimizer starts afresh).
template <class Model>
TrainState load_state(const std::string& dir, Model& model, optim::Optimizer& opt) {
  const std::string state_path = (fs::path(dir) / "state.json").string();
  EDL_CHECK(fs::exists(state_path), errc::io, dir, "not a complete checkpoint: state.json is missing");
  TrainState s = TrainState::from_file(state_path);
  if (lora::is_adapter_folder(dir)) {  // a LoRA run's checkpoint: the model was adapted by the trainer
    EDL_CHECK(has_adapters(model), errc::config, dir,
              "is a LoRA checkpoint (adapter_config.json) but the model has no adapters: resume with the run's "
              "\"lora\" section");
    lora::load_adapter_weights(dir, model);
  } else {
    load_model_weights(dir, model);
  }
  if (!s.optimizer_saved) return s;
  for (const std::string& op : optimizer_files(dir)) detail::load_optimizer_slots(io::SafeTensorsFile::open(op), op, opt);
  opt.set_step_count(s.optimizer_step_count);
  return s;
}

/// Saves an optimizer alone (the seeds' save_optimizer): its slots, step count, kind and
/// hyper-parameters in one safetensors file, written atomically (a failed save leaves the
/// previous file).
inline void save_optimizer(const std::string& path, const optim::Optimizer& opt) {
  detail::save_optimizer_part(path, opt, 0, 1);
}

/// The options and step count an optimizer file records (save_optimizer, a checkpoint's
/// optimizer parts); a file without those records (written before they were) is named.
inline std::pair<optim::OptimizerOptions, std::int64_t> saved_optimizer_options(const io::SafeTensorsFile& file,
                                                                                 const std::string& f) {
  const auto& meta = file.metadata();
  const auto options = meta.find("options"), steps = meta.find("step_count");
  EDL_CHECK(options != meta.end() && steps != meta.end(), errc::format, f,
            "expected an optimizer file with \"options\" and \"step_count\" metadata (save_optimizer, a checkpoint)");
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(options->second);
  } catch (const nlohmann::json::exception& e) {
    ::edl::detail::raise(errc::format, f, ::edl::detail::concat("the \"options\" metadata is not JSON: ", e.what()));
  }
  std::int64_t count = 0;
  try {
    count = std::stoll(steps->second);
  } catch (const std::exception&) {
    ::edl::detail::raise(errc::format, f, ::edl::detail::concat("step_count \"", steps->second, "\" is not an integer"));
  }
  return {optimizer_options_from_json(j, f), count};
}

/// Reads an optimizer back (the seeds' load_optimizer): from a file save_optimizer wrote, or
/// from a checkpoint folder (its optimizer.safetensors, or every rank's part). The optimizer
/// has the saved kind, hyper-parameters, slots and step count, so training continues as if it
/// had never stopped.
inline optim::Optimizer load_optimizer(const std::string& path) {
  const std::vector<std::string> files = fs::is_directory(path) ? optimizer_files(path) : std::vector<std::string>{path};
  std::optional<optim::Optimizer> opt;
  for (const std::string& f : files) {
    auto file = io::SafeTensorsFile::open(f);
    const auto [o, count] = saved_optimizer_options(file, f);
    if (!opt) {
      opt.emplace(o);
      opt->set_step_count(count);
    }
    EDL_CHECK(optimizer_options_json(o) == optimizer_options_json(opt->options()) && count == opt->step_count(),
              errc::format, f, "its optimizer options or step count differ from those of ", files.front());
    detail::load_optimizer_slots(file, f, *opt);
  }
  return std::move(*opt);
}

/// The checkpoint-<step> folders of one run.
class CheckpointManager {
 public:
  explicit CheckpointManager(std::string root, std::optional<std::int64_t> keep_last = std::nullopt)
      : root_(std::move(root)), keep_last_(keep_last) {}

  const std::string& root() const noexcept { return root_; }
  std::string path_for(std::int64_t step) const {
    return (fs::path(root_) / ("checkpoint-" + std::to_string(step))).string();
  }

  /// Complete checkpoints (with state.json), oldest first.
  std::vector<std::pair<std::int64_t, std::string>> list() const {
    std::vector<std::pair<std::int64_t, std::string>> out;
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) return out;
    for (const auto& e : fs::directory_iterator(root_, ec)) {
      if (!e.is_directory()) continue;
      auto step = detail::checkpoint_step(e.path().filename().string());
      if (step && fs::exists(e.path() / "state.json")) out.emplace_back(*step, e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::optional<std::string> latest() const {
    auto l = list();
    if (l.empty()) return std::nullopt;
    return l.back().second;
  }

  /// Removes folders a crashed save left behind (".checkpoint-*.tmp-*", ".checkpoint-*.old-*").
  void remove_temporaries() const {
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) return;
    std::vector<fs::path> stale;
    for (const auto& e : fs::directory_iterator(root_, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(".checkpoint-", 0) == 0 && (n.find(".tmp-") != std::string::npos || n.find(".old-") != std::string::npos))
        stale.push_back(e.path());
    }
    for (const auto& p : stale) fs::remove_all(p, ec);
  }

  /// Saves checkpoint-<step> and prunes. Returns its path.
  /// With several processes every one calls it; rank 0 prunes.
  template <class Model>
  std::string save(Model& model, const optim::Optimizer& opt, const TrainState& state,
                   const tokenizer::Tokenizer* tokenizer = nullptr, const CheckpointHooks& hooks = {},
                   const ProcessGroup& processes = {}) {
    const std::string p = path_for(state.step);
    save_state(p, model, opt, state, tokenizer, hooks, processes);
    if (processes.is_primary()) prune();
    return p;
  }

  /// The checkpoint with the lowest eval_loss in its state.json, if any has one.
  std::optional<std::string> best() const {
    std::optional<std::string> b;
    double bl = std::numeric_limits<double>::infinity();
    for (const auto& [step, path] : list()) {
      try {
        auto s = TrainState::from_file((fs::path(path) / "state.json").string());
        if (s.eval_loss && *s.eval_loss < bl) { bl = *s.eval_loss; b = path; }
      } catch (const Error&) {
      }
    }
    return b;
  }

  /// Keeps the newest keep_last checkpoints and the best; removes the others.
  void prune() const {
    if (!keep_last_) return;
    auto l = list();
    const auto best_path = best();
    const std::size_t keep = static_cast<std::size_t>(std::max<std::int64_t>(*keep_last_, 1));
    for (std::size_t i = 0; i + keep < l.size(); ++i) {
      if (best_path && l[i].second == *best_path) continue;
      const fs::path p = l[i].second;
      const fs::path gone = p.parent_path() / ("." + p.filename().string() + ".old-" + std::to_string(::getpid()));
      std::error_code ec;
      fs::rename(p, gone, ec);  // no longer listed as complete before its files go
      fs::remove_all(ec ? p : gone, ec);
    }
  }

 private:
  std::string root_;
  std::optional<std::int64_t> keep_last_;
};

}  // namespace edl::train
