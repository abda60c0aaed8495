// examples/cli/adapter_flags.hpp: --adapter DIR and --merge-adapter, shared by every command
// that runs a model (logits, loss, eval, generate, bench decode, bench serve).
//
//   --adapter DIR      a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors)
//                      applied unmerged: every product adds scale * B (A x)
//   --merge-adapter    fold it into the weights at load instead (W += scale * B A): decode runs
//                      at the base's speed; a quantized Linear it touches becomes float
//
// A --model folder that is itself an adapter (adapter_config.json and no config.json, as a LoRA
// run's checkpoint-<step>/ or adapter/) loads its base from base_model_name_or_path.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/lora/apply.hpp>
#include <edl/lora/peft.hpp>
#include "args.hpp"

namespace edl::cli {

/// --adapter and --merge-adapter, as the flag table of each of those commands declares them.
inline std::vector<Flag> declare_adapter_flags() {
  return {text_flag("--adapter", "DIR",
                    "a PEFT LoRA adapter folder, applied unmerged (a --model that is an adapter folder loads its base)"),
          switch_flag("--merge-adapter", "fold the adapter into the weights at load: decode at the base's speed")};
}

struct AdapterFlags {
  std::string model;    // the base model folder (or a preset name, for benchmarks)
  std::string adapter;  // empty: none
  bool merge = false;
};

/// Reads --adapter / --merge-adapter for the model `model_flag` names; an adapter folder
/// given as the model resolves to its base.
inline AdapterFlags adapter_flags(Args& args, const std::string& model, const std::string& command) {
  namespace fs = std::filesystem;
  AdapterFlags f;
  f.model = model;
  if (args.has("--adapter")) f.adapter = args.required("--adapter");
  f.merge = args.has("--merge-adapter");
  if (f.adapter.empty() && lora::is_adapter_folder(model) && !fs::exists(fs::path(model) / "config.json")) {
    const auto j = lora::read_adapter_json(model);
    EDL_CHECK(j.is_object() && j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string(),
              errc::invalid_argument, model + "/" + lora::kAdapterConfigFile,
              "is an adapter without base_model_name_or_path: pass the base as --model and this folder as --adapter");
    f.adapter = model;
    f.model = j["base_model_name_or_path"].get<std::string>();
  }
  EDL_CLI_USAGE_CHECK(!f.merge || !f.adapter.empty(), errc::invalid_argument, "edl " + command + " --merge-adapter",
                      "needs --adapter DIR");
  return f;
}

/// Applies the adapter of `f` to `model` (unmerged, or merged with --merge-adapter).
template <class Model>
void apply_adapter(Model& model, const AdapterFlags& f) {
  if (f.adapter.empty()) return;
  lora::load_adapter(f.adapter, model);
  if (f.merge) lora::merge_lora(model);
}

}  // namespace edl::cli
