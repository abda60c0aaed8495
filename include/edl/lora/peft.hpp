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
// A model whose checkpoints fuse some Linears (Phi-3: q, k, v rows in self_attn.qkv_proj,
// gate, up in mlp.gate_up_proj; the model says so with fused_weight(path)) has PEFT adapters
// on the fused modules: one lora_A [r, in] shared by the parts and a lora_B whose rows are the
// parts' rows. edl adapts each part as a Linear of its own: loading gives every part the
// fused A and its rows of B (the same product, so the same outputs; target_modules' qkv_proj
// selects q_proj, k_proj and v_proj), and saving writes the fused form back when every
// fused module's parts are adapted with equal A's (as loaded), else each part under its own
// name (edl reads both; PEFT's Phi-3 reads only the fused form). Training moves the parts'
// A's apart, so a trained Phi-3 adapter is saved per part; merge it (edl merge-lora) to use
// it elsewhere.
//
// save_adapter writes a sibling temporary folder and renames it into place, so a save that
// dies midway leaves the previous adapter folder whole. load_adapter checks everything
// before the model changes: the config (unsupported settings named), every expected tensor
// present with shape [r, in] / [out, r], no tensor the model has no place for.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
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

namespace detail {

/// The last component of a module path ("model.layers.0.self_attn.qkv_proj" -> "qkv_proj").
inline std::string short_name(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

/// Linear `path`'s place in a fused module of `m`'s checkpoints (module path, first row, rows), or none.
struct FusedPart {
  std::string module;
  std::int64_t row0 = 0, rows = 0;
};
template <class M>
std::optional<FusedPart> fused_part(const M& m, const std::string& path) {
  if constexpr (requires { m.fused_weight(path); }) {
    if (const auto s = m.fused_weight(path)) {
      const std::string& t = s->tensor;  // "<module>.weight"
      return FusedPart{t.substr(0, t.size() - std::string_view(".weight").size()), s->row0, s->rows};
    }
  }
  return std::nullopt;
}

/// Where adapter tensor `name` ("<path>.lora_A.weight" or "...lora_B.weight") of Linear `path`
/// is in PEFT file `f`: under its own key, or (a part of a fused module, when the file has no
/// tensor of the part's own name) the module's A whole, its B's rows from row0.
struct AdapterSource {
  std::string key;
  std::int64_t row0 = 0, rows = -1;  // rows -1: the whole tensor; else a B's rows of the fused B
};
template <class M, class File>
AdapterSource adapter_source(const M& m, const File& f, const std::string& path, std::string_view name) {
  AdapterSource s{kPeftPrefix + std::string(name)};
  if (f.contains(s.key)) return s;
  if (const auto part = fused_part(m, path)) {
    const bool is_b = name.ends_with("lora_B.weight");
    s.key = kPeftPrefix + part->module + (is_b ? ".lora_B.weight" : ".lora_A.weight");
    if (is_b) s.row0 = part->row0, s.rows = part->rows;
  }
  return s;
}

/// target_modules naming fused modules (qkv_proj) select their parts (q_proj, k_proj, v_proj).
template <class M>
void select_fused_parts(M& m, LoraConfig& cfg) {
  if (!cfg.target_regex.empty()) return;
  std::vector<std::string> add, fused_names;
  m.visit_linears("", [&](const std::string& path, auto&) {
    const auto part = fused_part(m, path);
    if (!part) return;
    for (const std::string& t : cfg.target_modules)
      if (t == part->module || t == short_name(part->module)) {
        add.push_back(t == part->module ? path : short_name(path));
        fused_names.push_back(t);
      }
  });
  auto& t = cfg.target_modules;
  t.erase(std::remove_if(t.begin(), t.end(),
                         [&](const std::string& n) { return std::count(fused_names.begin(), fused_names.end(), n) > 0; }),
          t.end());
  for (const std::string& n : add)
    if (std::find(t.begin(), t.end(), n) == t.end()) t.push_back(n);
}

/// Writes `m`'s adapters of fused modules in the fused form (one A, B rows in the parts' order)
/// when every fused module's parts are all adapted with equal A's; target_modules then names
/// the fused modules. Otherwise nothing changes (each part keeps its own name).
template <class M>
void fuse_adapter_tensors(M& m, std::vector<AdapterTensor>& tensors, LoraConfig& cfg) {
  std::map<std::string, std::vector<std::pair<std::int64_t, std::string>>> groups;  // module -> (row0, part)
  m.visit_linears("", [&](const std::string& path, auto&) {
    if (const auto part = fused_part(m, path)) groups[part->module].emplace_back(part->row0, path);
  });
  if (groups.empty() || !cfg.target_regex.empty()) return;
  std::map<std::string, std::size_t> at;
  for (std::size_t i = 0; i < tensors.size(); ++i) at[tensors[i].name] = i;
  const auto has = [&](const std::string& part) { return at.count(part + ".lora_A.weight") > 0; };
  const auto A = [&](const std::string& part) -> const AdapterTensor& { return tensors[at.at(part + ".lora_A.weight")]; };
  for (auto& [module, parts] : groups) {
    std::sort(parts.begin(), parts.end());
    const std::size_t adapted = static_cast<std::size_t>(
        std::count_if(parts.begin(), parts.end(), [&](const auto& p) { return has(p.second); }));
    if (adapted == 0) continue;
    if (adapted != parts.size()) return;
    for (const auto& p : parts)
      if (A(p.second).shape != A(parts[0].second).shape || A(p.second).values != A(parts[0].second).values) return;
  }
  std::vector<AdapterTensor> out;
  std::set<std::string> written, part_names, module_names;
  std::map<std::string, std::string> module_of;
  for (const auto& [module, parts] : groups)
    for (const auto& p : parts) module_of[p.second] = module;
  for (const AdapterTensor& t : tensors) {
    const std::string path = t.name.substr(0, t.name.size() - std::string_view(".lora_A.weight").size());
    const auto it = module_of.find(path);
    if (it == module_of.end()) {
      out.push_back(t);
      continue;
    }
    const std::string& module = it->second;
    part_names.insert(short_name(path));
    module_names.insert(short_name(module));
    if (!written.insert(module).second) continue;
    const auto& parts = groups.at(module);
    AdapterTensor a = A(parts[0].second), b;
    a.name = module + ".lora_A.weight";
    b.name = module + ".lora_B.weight";
    b.shape = {0, a.shape[0]};
    for (const auto& p : parts) {
      const AdapterTensor& pb = tensors[at.at(p.second + ".lora_B.weight")];
      b.shape[0] += pb.shape[0];
      b.values.insert(b.values.end(), pb.values.begin(), pb.values.end());
    }
    out.push_back(std::move(a));
    out.push_back(std::move(b));
  }
  tensors = std::move(out);
  auto& tm = cfg.target_modules;
  if (tm.size() == 1 && tm[0] == "all-linear") return;
  tm.erase(std::remove_if(tm.begin(), tm.end(), [&](const std::string& n) { return part_names.count(n) > 0; }), tm.end());
  for (const std::string& n : module_names)
    if (std::find(tm.begin(), tm.end(), n) == tm.end()) tm.push_back(n);
}

}  // namespace detail

/// Whether `dir` holds a PEFT adapter (adapter_config.json).
inline bool is_adapter_folder(const std::filesystem::path& dir) {
  return std::filesystem::is_regular_file(dir / kAdapterConfigFile);
}

/// Writes adapter_config.json and adapter_model.safetensors of `m`'s adapters into the existing
/// folder `dir` (a checkpoint writes them into its own temporary folder).
template <class M>
void write_adapter_files(const std::filesystem::path& dir, M& m, const std::string& base_model) {
  LoraConfig cfg = config_of(m);
  std::vector<AdapterTensor> tensors = split_lora_params(m);
  detail::fuse_adapter_tensors(m, tensors, cfg);
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
  std::map<std::string, std::int64_t> fused_rows;  // a fused B -> rows its parts take
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    if (!lin.lora) return;
    lin.lora->visit_params(path, [&](std::string_view name, auto& p) {
      const detail::AdapterSource src = detail::adapter_source(m, f, path, name);
      const std::string& key = src.key;
      expected.insert(key);
      EDL_CHECK(f.contains(key), errc::format, file, "tensor \"", key, "\" is missing (the config targets ", path, ")");
      auto shape = f.info(key).shape;
      if (src.rows >= 0) {  // the part's rows of a fused B
        EDL_CHECK(shape.size() == 2 && shape[0] >= src.row0 + src.rows, errc::shape_mismatch, file, "tensor \"", key,
                  "\" has shape ", ::edl::detail::shape_str(shape), ", but ", path, " takes its rows ", src.row0, "..",
                  src.row0 + src.rows - 1);
        shape[0] = src.rows;
        fused_rows[key] += src.rows;
      }
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
  for (const auto& [key, rows] : fused_rows)
    EDL_CHECK(rows == f.info(key).shape[0], errc::shape_mismatch, file, "tensor \"", key, "\" has ",
              f.info(key).shape[0], " rows, but the modules fused in it take ", rows);
  for (const std::string& n : f.names())
    EDL_CHECK(expected.count(n) > 0, errc::unsupported, file, "tensor \"", n,
              "\" has no place in the model (adapter_config.json's target_modules do not select it, or it is not a "
              "LoRA A/B weight of a decoder Linear)");
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    if (!lin.lora) return;
    lin.lora->visit_params(path, [&](std::string_view name, auto& p) {
      using T = typename std::remove_cvref_t<decltype(p)>::value_type;
      const detail::AdapterSource src = detail::adapter_source(m, f, path, name);
      const std::span<T> out(p.data(), p.value.size());
      if (src.rows < 0) {
        f.template read_into<T>(src.key, out);
      } else {
        const auto& full = f.info(src.key).shape;
        const std::vector<std::int64_t> offset{src.row0, 0}, block{src.rows, full[1]};
        f.template read_block<T>(src.key, full, offset, block, out);
      }
    });
  });
}

/// Applies the adapter of PEFT folder `dir` to `m` (which has none yet) and loads its weights.
/// On any error the model is left without adapters. Returns the adapter's config.
template <class M>
LoraConfig load_adapter(const std::filesystem::path& dir, M& m) {
  LoraConfig cfg = read_adapter_config(dir);
  detail::select_fused_parts(m, cfg);
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
