// edl/lora/peft.hpp
// PEFT adapter folders, both directions:
//
//   adapter_config.json          peft_type LORA, r, lora_alpha, lora_dropout, target_modules,
//                                bias "none", use_rslora, base_model_name_or_path
//   adapter_model.safetensors    base_model.model.<path>.lora_A.weight [r, in]
//                                base_model.model.<path>.lora_B.weight [out, r]
//
//   lora::save_adapter("out/adapter", model, "path/to/base");
//   lora::LoraConfig c = lora::load_adapter("out/adapter", model);   // applies it, then loads
//
// save_adapter writes a sibling temporary folder and renames it into place, so a save that
// dies midway leaves the previous adapter folder whole. load_adapter checks everything
// before the model changes: the config (unsupported settings named), every expected tensor
// present with shape [r, in] / [out, r], no tensor the model has no place for.
#pragma once

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/io/atomic_file.hpp>
#include <edl/io/json.hpp>
#include <edl/io/mmap.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/lora/apply.hpp>
#include <edl/lora/config.hpp>

namespace edl::lora {

inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";
inline constexpr const char* kPeftPrefix = "base_model.model.";

/// Whether `dir` holds a PEFT adapter (adapter_config.json).
inline bool is_adapter_folder(const std::filesystem::path& dir) {
  return std::filesystem::is_regular_file(dir / kAdapterConfigFile);
}

/// Writes adapter_config.json and adapter_model.safetensors of `m`'s adapters into the existing
/// folder `dir` (a checkpoint writes them into its own temporary folder).
template <class M>
void write_adapter_files(const std::filesystem::path& dir, M& m, const std::string& base_model) {
  const LoraConfig cfg = config_of(m);
  const std::vector<AdapterTensor> tensors = split_lora_params(m);
  io::TensorList list;
  for (const AdapterTensor& t : tensors) list.emplace_back(kPeftPrefix + t.name, io::TensorRef(t.values, t.shape));
  io::save_safetensors((dir / kAdapterWeightsFile).string(), list, {{"format", "pt"}});
  io::write_file_atomic((dir / kAdapterConfigFile).string(), to_peft_json(cfg, base_model).dump(2) + "\n");
}

/// Saves `m`'s adapters as a PEFT folder `dir`, atomically (a temporary sibling renamed into place).
template <class M>
void save_adapter(const std::filesystem::path& dir, M& m, const std::string& base_model) {
  namespace fs = std::filesystem;
  const fs::path final_path = fs::absolute(dir).lexically_normal();
  const fs::path tmp = final_path.parent_path() / ("." + final_path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  try {
    write_adapter_files(tmp, m, base_model);
    if (fs::exists(final_path)) fs::remove_all(final_path);
    fs::rename(tmp, final_path);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

/// adapter_config.json of adapter folder `dir`, parsed (errors: missing, not JSON).
inline nlohmann::json read_adapter_json(const std::filesystem::path& dir) {
  const std::filesystem::path p = dir / kAdapterConfigFile;
  EDL_CHECK(std::filesystem::is_regular_file(p), errc::io, dir.string(),
            "not a PEFT adapter folder: adapter_config.json is missing");
  return io::parse_json<nlohmann::json>(io::read_text_file(p.string()), p.string());
}

/// The LoraConfig of adapter folder `dir` (adapter_config.json), refusing what edl does not support.
inline LoraConfig read_adapter_config(const std::filesystem::path& dir) {
  return from_peft_json(read_adapter_json(dir), (dir / kAdapterConfigFile).string());
}

/// Loads the adapter tensors of `dir` into `m`'s adapters (which must exist with the folder's
/// config: a checkpoint resumed into a model the trainer already adapted).
template <class M>
void load_adapter_weights(const std::filesystem::path& dir, M& m) {
  const std::string file = (dir / kAdapterWeightsFile).string();
  EDL_CHECK(std::filesystem::is_regular_file(file), errc::io, dir.string(), "adapter_model.safetensors is missing");
  const auto f = io::SafeTensorsFile::open(file);
  std::set<std::string> expected;
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    if (!lin.lora) return;
    lin.lora->visit_params(path, [&](std::string_view name, auto& p) {
      const std::string key = kPeftPrefix + std::string(name);
      expected.insert(key);
      EDL_CHECK(f.contains(key), errc::format, file, "tensor \"", key, "\" is missing (the config targets ", path, ")");
      const auto& shape = f.info(key).shape;
      const auto want = p.shape();
      if (!std::equal(shape.begin(), shape.end(), want.begin(), want.end())) {
        const bool is_a = name.ends_with("lora_A.weight");
        const std::int64_t file_r = shape.size() == 2 ? (is_a ? shape[0] : shape[1]) : -1;
        EDL_CHECK(file_r == lin.lora->rank(), errc::shape_mismatch, file, "tensor \"", key, "\" has rank r = ", file_r,
                  " (shape ", ::edl::detail::shape_str(shape), "), adapter_config.json says r = ", lin.lora->rank());
        ::edl::detail::raise(errc::shape_mismatch, file,
                             ::edl::detail::concat("tensor \"", key, "\" has shape ", ::edl::detail::shape_str(shape),
                                                   ", expected ", ::edl::detail::shape_str(want)));
      }
    });
  });
  for (const std::string& n : f.names())
    EDL_CHECK(expected.count(n) > 0, errc::unsupported, file, "tensor \"", n,
              "\" has no place in the model (adapter_config.json's target_modules do not select it, or it is not a "
              "LoRA A/B weight of a decoder Linear)");
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    if (!lin.lora) return;
    lin.lora->visit_params(path, [&](std::string_view name, auto& p) {
      using T = typename std::remove_cvref_t<decltype(p)>::value_type;
      f.template read_into<T>(kPeftPrefix + std::string(name), std::span<T>(p.data(), p.value.size()));
    });
  });
}

/// Applies the adapter of PEFT folder `dir` to `m` (which has none yet) and loads its weights.
/// On any error the model is left without adapters. Returns the adapter's config.
template <class M>
LoraConfig load_adapter(const std::filesystem::path& dir, M& m) {
  const LoraConfig cfg = read_adapter_config(dir);
  EDL_CHECK(!lora_is_enabled(m), errc::invalid_argument, dir.string(), "the model already has LoRA adapters");
  apply_lora(m, cfg, (dir / kAdapterConfigFile).string());
  try {
    load_adapter_weights(dir, m);
  } catch (...) {
    unwrap_lora(m);
    throw;
  }
  return cfg;
}

}  // namespace edl::lora
