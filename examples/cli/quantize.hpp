// examples/cli/quantize.hpp: `edl quantize` writes a model folder whose Linears are quantized.
//
//   edl quantize --model DIR --method q8_0|q4_0|nf4 --out DIR [--pattern REGEX]
//
// --pattern is nn::QuantizationConfig's regex over weight paths (default: every Linear of the
// decoder layers). The folder (docs/quantization.md) loads in every command that takes
// --model; tokenizer, generation and run files are copied beside it. Prints one JSON object.
#pragma once

#include <filesystem>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include <edl/models/llama/pretrained.hpp>
#include <edl/nn/quantize.hpp>
#include "args.hpp"

namespace edl::cli {

inline int cmd_quantize(Args& args) {
  namespace fs = std::filesystem;
  const std::string dir = args.required("--model"), out = args.required("--out");
  nn::QuantizationConfig q;
  q.method = quant::parse_format(args.required("--method"), "edl quantize --method");
  q.pattern = args.str("--pattern", q.pattern);
  args.finish();
  EDL_CLI_USAGE_CHECK(q.method != quant::Format::none, errc::invalid_argument, "edl quantize --method",
                      "expected q8_0, q4_0 or nf4, found none");
  EDL_CLI_USAGE_CHECK(fs::weakly_canonical(dir) != fs::weakly_canonical(out), errc::invalid_argument,
                      "edl quantize --out " + out, "must differ from --model (the source folder stays as it is)");
  auto model = models::from_pretrained<>(dir);
  const std::int64_t before = nn::storage_bytes(model);
  const std::int64_t n = nn::quantize(model, q);
  EDL_CHECK(n > 0, errc::invalid_argument, "edl quantize --pattern " + q.pattern, "matches no unquantized Linear of ", dir);
  const auto files = models::save_pretrained(out, model);
  // The tokenizer, generation defaults and a run's arguments (state.json: edl eval's defaults)
  // travel with the weights.
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                        "generation_config.json", "vocab.json", "merges.txt", "state.json"})
    if (fs::exists(fs::path(dir) / f)) fs::copy_file(fs::path(dir) / f, fs::path(out) / f, fs::copy_options::overwrite_existing);
  nlohmann::ordered_json j;
  j["out"] = out;
  j["method"] = quant::format_name(q.method);
  j["pattern"] = q.pattern;
  j["quantized_linears"] = n;
  j["bytes_before"] = before;
  j["bytes_after"] = nn::storage_bytes(model);
  j["files"] = files;
  std::cout << j.dump() << "\n";
  return 0;
}

inline Command quantize_command() {
  return {.name = "quantize",
          .group = "models",
          .summary = "write a model folder whose Linears are quantized (q8_0, q4_0 or nf4)",
          .synopsis = "--model DIR --method q8_0|q4_0|nf4 --out DIR [--pattern REGEX]",
          .flags = {text_flag("--model", "DIR", "the source HF folder").required(),
                    text_flag("--method", "", "the quantization format").one_of({"q8_0", "q4_0", "nf4"}).required(),
                    text_flag("--out", "DIR", "the quantized folder written (not --model)").required(),
                    text_flag("--pattern", "REGEX", "the weight paths quantized")
                        .defaults("every Linear of the decoder layers")},
          .examples = {"edl quantize --model ckpt --method q4_0 --out ckpt-q4_0"},
          .run = cmd_quantize};
}

}  // namespace edl::cli
