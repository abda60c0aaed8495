// examples/cli/merge_lora.hpp: `edl merge-lora` folds a LoRA adapter into its base and writes
// a plain HF folder.
//
//   edl merge-lora --model DIR --adapter DIR --out DIR
//
// W += scale * B A for every adapted Linear (lora::merge_lora). A quantized base (a folder
// from edl quantize, or QLoRA's) is dequantized, merged and written in the model's float dtype,
// every Linear of it: the output is a float model that edl quantize can quantize again.
// Tokenizer, generation and run files (state.json: edl eval's defaults) are copied from the
// base. Prints one JSON object.
#pragma once

#include <filesystem>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include <edl/lora/apply.hpp>
#include <edl/lora/peft.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/nn/quantize.hpp>
#include "args.hpp"

namespace edl::cli {

inline int cmd_merge_lora(Args& args) {
  namespace fs = std::filesystem;
  const std::string dir = args.required("--model"), adapter = args.required("--adapter"), out = args.required("--out");
  args.finish();
  EDL_CLI_USAGE_CHECK(fs::weakly_canonical(dir) != fs::weakly_canonical(out), errc::invalid_argument,
                      "edl merge-lora --out " + out, "must differ from --model (the base stays as it is)");
  auto model = models::from_pretrained<>(dir);
  const bool was_quantized = nn::is_quantized(model);
  const lora::LoraConfig c = lora::load_adapter(adapter, model);
  const std::int64_t merged = lora::merge_lora(model);
  const std::int64_t dequantized = nn::dequantize(model);
  const auto files = models::save_pretrained(out, model);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                        "generation_config.json", "vocab.json", "merges.txt", "state.json"})
    if (fs::exists(fs::path(dir) / f)) fs::copy_file(fs::path(dir) / f, fs::path(out) / f, fs::copy_options::overwrite_existing);
  nlohmann::ordered_json j;
  j["out"] = out;
  j["merged_linears"] = merged;
  j["r"] = c.r;
  j["lora_alpha"] = c.lora_alpha;
  j["base_quantized"] = was_quantized;
  j["dequantized_linears"] = dequantized;
  j["files"] = files;
  std::cout << j.dump() << "\n";
  return 0;
}

inline Command merge_lora_command() {
  return {.name = "merge-lora",
          .group = "models",
          .summary = "fold a LoRA adapter into its base and write a plain HF folder",
          .synopsis = "--model DIR --adapter DIR --out DIR",
          .flags = {text_flag("--model", "DIR", "the base model folder (a quantized base is dequantized)").required(),
                    text_flag("--adapter", "DIR", "the PEFT LoRA adapter folder").required(),
                    text_flag("--out", "DIR", "the merged folder written (not --model)").required()},
          .examples = {"edl merge-lora --model base --adapter run/adapter --out merged"},
          .run = cmd_merge_lora};
}

}  // namespace edl::cli
