// examples/cli/inspect.hpp: `edl inspect` lists the tensors of a safetensors checkpoint.
//
//   edl inspect --path model.safetensors        (or: edl inspect model.safetensors)
//   edl inspect --path ckpt_dir                 model.safetensors or model.safetensors.index.json
//
// Prints one JSON object: {"path", "files": [...], "index" (sharded only), "metadata",
// "tensors": [{"name", "dtype", "shape", "bytes", "file"}], "num_tensors", "total_params",
// "total_bytes", and, when the folder has a config.json, "config" (the file as is) and
// "config_check": {"ok", ...}: for Llama-family configs, the config validated (an invalid one
// gives ok false and the error naming the field) and the parameters it implies vs the
// checkpoint (missing, unexpected and mismatched tensors); any other or no model_type gives ok
// false saying so. A config.json that is no JSON object, or gives a key twice, and a file that
// breaks the safetensors rules are errors on stderr naming the file (exit 1).
#pragma once

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include <edl/io/json_config.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/fused_checkpoint.hpp>
#include "args.hpp"

namespace edl::cli {

inline int cmd_inspect(Args& args) {
  namespace fs = std::filesystem;
  const auto& pos = args.positional();
  const bool flag = args.has("--path");
  EDL_CLI_USAGE_CHECK(pos.size() <= 1, errc::invalid_argument, "edl inspect", "expected one checkpoint path, found ",
                      pos.size());
  EDL_CLI_USAGE_CHECK(!(flag && !pos.empty()), errc::invalid_argument, "edl inspect",
                      "give the checkpoint either as --path or as an argument, not both");
  const std::string path = flag ? args.required("--path") : (pos.empty() ? std::string() : pos[0]);
  args.finish();
  EDL_CLI_USAGE_CHECK(!path.empty(), errc::invalid_argument, "edl inspect",
                      "missing checkpoint: edl inspect --path FILE.safetensors|DIR (or edl inspect FILE)");
  std::error_code ec;
  EDL_CHECK(fs::exists(path, ec), errc::io, path, "no such file or folder");

  const auto ckpt = io::ShardedCheckpoint::open(path);
  nlohmann::ordered_json out;
  out["path"] = path;
  out["files"] = ckpt.files();
  if (!ckpt.index_path().empty()) {
    out["index"] = ckpt.index_path();
    out["index_metadata"] = ckpt.index_metadata();
  }
  // The safetensors __metadata__ of the first file (shards of one save share it).
  {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    if (!ckpt.names().empty())
      for (const auto& [k, v] : ckpt.shard_of(ckpt.names().front()).metadata()) m[k] = v;
    out["metadata"] = m;
  }
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  std::int64_t params = 0;
  const bool sharded = ckpt.files().size() > 1;
  for (const auto& name : ckpt.names()) {
    const auto& info = ckpt.info(name);
    nlohmann::ordered_json t;
    t["name"] = name;
    t["dtype"] = std::string(dtype_name(info.dtype));
    t["shape"] = info.shape;
    t["bytes"] = info.nbytes();
    if (sharded) t["file"] = fs::path(ckpt.file_of(name)).filename().string();
    tensors.push_back(std::move(t));
    params += info.numel();
  }
  out["num_tensors"] = ckpt.names().size();
  out["total_params"] = params;
  out["total_bytes"] = ckpt.total_bytes();
  out["tensors"] = std::move(tensors);

  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  const fs::path config_path = dir / "config.json";
  if (fs::exists(config_path, ec)) {
    const auto cfg_json = io::JsonConfig::from_file(config_path.string());
    out["config"] = cfg_json.json();
    nlohmann::ordered_json check;
    const auto& mt_json = cfg_json.json().contains("model_type") ? cfg_json.json()["model_type"] : nlohmann::ordered_json();
    const std::string mt = mt_json.is_string() ? mt_json.get<std::string>() : std::string();
    const char* known[] = {"llama", "mistral", "qwen2", "qwen3", "phi3", "mixtral", "qwen2_moe", "qwen3_moe"};
    if (std::find(std::begin(known), std::end(known), mt) == std::end(known)) {
      // A config edl cannot check is not reported valid: say why.
      check["ok"] = false;
      check["error"] = mt_json.is_null() ? std::string("config.json has no model_type")
                                         : "model_type " + mt_json.dump() +
                                               " is not one edl reads (llama, mistral, qwen2, qwen3, phi3, mixtral, "
                                               "qwen2_moe, qwen3_moe)";
      out["config_check"] = check;
    } else {
      try {
        const auto cfg = models::LlamaConfig::from_json(cfg_json.json(), config_path.string());
        nlohmann::ordered_json missing = nlohmann::ordered_json::array(), mismatched = nlohmann::ordered_json::array(),
                               unexpected = nlohmann::ordered_json::array();
        std::set<std::string> expected;
        // Against edl's parameter names; a Phi-3 folder's fused tensors are seen as their parts, a
        // Gemma 3 multimodal folder's text tensors without their prefix.
        const auto check_against = [&](const auto& ck) {
          for (const auto& [name, shape] : cfg.parameter_shapes()) {
            expected.insert(name);
            if (!ck.contains(name)) missing.push_back(name);
            else if (ck.info(name).shape != shape)
              mismatched.push_back({{"name", name}, {"expected", shape}, {"found", ck.info(name).shape}});
          }
          for (const auto& name : ck.names())
            if (!expected.count(name)) unexpected.push_back(name);
        };
        if (cfg.checkpoint_names_differ()) {  // Phi-3's fused tensors, Gemma 3 multimodal's prefixes
          std::vector<std::string> names;
          for (const auto& [name, shape] : cfg.parameter_shapes()) names.push_back(name);
          check_against(models::FusedCheckpointView<io::ShardedCheckpoint>(ckpt, cfg, names));
        } else {
          check_against(ckpt);
        }
        check["ok"] = missing.empty() && mismatched.empty() && unexpected.empty();
        check["parameter_count"] = cfg.parameter_count();
        check["missing"] = missing;
        check["unexpected"] = unexpected;
        check["shape_mismatch"] = mismatched;
      } catch (const Error& e) {
        check["ok"] = false;
        check["error"] = e.what();
      }
      out["config_check"] = check;
    }
  }
  std::cout << out.dump() << "\n";
  return 0;
}

inline Command inspect_command() {
  return {.name = "inspect",
          .group = "models",
          .summary = "validate a safetensors checkpoint and list its tensors (and its config check)",
          .synopsis = "FILE.safetensors|DIR   (or --path FILE.safetensors|DIR)",
          .flags = {text_flag("--path", "FILE|DIR", "a .safetensors file, or a folder with model.safetensors or its index")},
          .positional = "PATH",
          .positional_help = "the checkpoint, as --path",
          .examples = {"edl inspect ckpt/model.safetensors", "edl inspect --path ckpt"},
          .run = cmd_inspect};
}

}  // namespace edl::cli
