// examples/cli/convert.hpp: `edl convert` writes a model as a llama.cpp GGUF file (docs/gguf.md).
//
//   edl convert --model DIR --out FILE.gguf [--type f32|f16|q8_0|q4_0] [--tokenizer DIR] [--name NAME]
//               [--embeddings f32|f16|q8_0|q4_0]
//
// DIR is an HF folder (config.json + safetensors, quantized or not). The vocabulary comes from
// --tokenizer DIR's tokenizer.json (default: the model folder's, when it has one); without one
// the file holds a placeholder vocabulary, enough for llama.cpp to run on token ids. --type
// defaults to f32; --embeddings sets the type of token_embd and output (default: q8_0 in q8_0
// and q4_0 files, as llama.cpp's, else --type). Prints {"out", "type", "tensors", "bytes"}.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include <edl/io/gguf.hpp>
#include <edl/models/llama/gguf.hpp>
#include <edl/models/llama/pretrained.hpp>
#include "args.hpp"

namespace edl::cli {

inline int cmd_convert(Args& args) {
  namespace fs = std::filesystem;
  const std::string dir = args.required("--model"), out = args.required("--out");
  models::GgufSaveOptions opt;
  opt.type = args.str("--type", opt.type);
  opt.name = args.str("--name", "");
  opt.embeddings = args.str("--embeddings", "");
  const std::string tok = args.str("--tokenizer", "");
  args.finish();
  if (!tok.empty()) opt.tokenizer_dir = tok;
  else if (fs::exists(fs::path(dir) / "tokenizer.json")) opt.tokenizer_dir = dir;
  const auto model = models::from_pretrained<>(dir);
  models::save_gguf(out, model, opt);
  const auto f = io::GgufFile::open(out);  // counts what was written, and checks it reads back
  nlohmann::ordered_json j;
  j["out"] = out;
  j["type"] = opt.type;
  j["tensors"] = f.tensors().size();
  j["bytes"] = static_cast<std::uint64_t>(fs::file_size(out));
  std::cout << j.dump() << "\n";
  return 0;
}

inline Command convert_command() {
  return {.name = "convert",
          .group = "models",
          .summary = "write a model as a llama.cpp GGUF file",
          .synopsis = "--model DIR --out FILE.gguf [--type f32|f16|q8_0|q4_0] [--tokenizer DIR] [--name NAME] [flags]",
          .flags = {text_flag("--model", "DIR", "an HF folder (config.json + safetensors, quantized or not)").required(),
                    text_flag("--out", "FILE.gguf", "the GGUF file written").required(),
                    text_flag("--type", "", "storage of the 2-D weights").one_of({"f32", "f16", "q8_0", "q4_0"}).defaults("f32"),
                    text_flag("--name", "NAME", "general.name of the file").defaults("the file name"),
                    text_flag("--embeddings", "", "storage of token_embd and output")
                        .one_of({"f32", "f16", "q8_0", "q4_0"})
                        .defaults("q8_0 in q8_0 and q4_0 files, else --type"),
                    text_flag("--tokenizer", "DIR", "the folder whose tokenizer.json gives the vocabulary")
                        .defaults("the model folder's, else a placeholder")},
          .examples = {"edl convert --model ckpt --out model-q8_0.gguf --type q8_0"},
          .run = cmd_convert};
}

}  // namespace edl::cli
