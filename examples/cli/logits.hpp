// examples/cli/logits.hpp: `edl logits` runs a HF Llama checkpoint on token ids.
//
//   edl logits --model DIR --tokens T.npy --out L.npy [--mesh dp=1,fsdp=1,tp=1,sp=1]
//
// T.npy: int32 or int64 token ids [batch, seq] (1-D = batch 1). Writes float32 logits
// [batch, seq, vocab] to L.npy and prints one JSON line {"out": "L.npy", "shape": [b, s, v]}.
// A token id outside [0, vocab) is an error naming its position (b, s).
#pragma once

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>

#include <edl/core/error.hpp>
#include <edl/io/npy.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/pretrained.hpp>
#include "adapter_flags.hpp"
#include "args.hpp"
#include "mesh_flag.hpp"

namespace edl::cli {

/// Token ids [batch, seq] read from a .npy file.
struct TokenBatch {
  std::vector<std::int64_t> ids;
  std::int64_t batch = 0, seq = 0;
  nn::TokenLayout layout() const { return nn::TokenLayout{batch, seq}; }
};

/// Reads int64 or int32 ids, [batch, seq] or [seq] (batch 1).
inline TokenBatch load_token_ids(const std::string& path, const std::string& flag = "--tokens") {
  xt::xarray<std::int64_t> a;
  try {
    a = io::load_npy<std::int64_t>(path);
  } catch (const Error& e) {
    if (e.code() != errc::dtype_mismatch) throw;
    try {
      const auto b = io::load_npy<std::int32_t>(path);
      a = xt::xarray<std::int64_t>(b);
    } catch (const Error& e2) {
      if (e2.code() != errc::dtype_mismatch) throw;
      ::edl::detail::raise(errc::dtype_mismatch, flag + " " + path, "expected int32 or int64 token ids (.npy '<i4' or '<i8')");
    }
  }
  TokenBatch t;
  EDL_CHECK(a.dimension() == 1 || a.dimension() == 2, errc::shape_mismatch, flag + " " + path,
            "expected token ids [batch, seq] or [seq], found ", a.dimension(), " dimensions ",
            ::edl::detail::shape_str(a.shape()));
  t.batch = a.dimension() == 2 ? static_cast<std::int64_t>(a.shape(0)) : 1;
  t.seq = static_cast<std::int64_t>(a.shape(a.dimension() - 1));
  EDL_CHECK(t.batch > 0 && t.seq > 0, errc::shape_mismatch, flag + " " + path, "no tokens: shape ",
            ::edl::detail::shape_str(a.shape()));
  t.ids.assign(a.begin(), a.end());
  return t;
}

/// Every id in [0, vocab) (or == `allowed`, e.g. -100 for labels); the error names (b, s).
inline void check_ids(const TokenBatch& t, std::int64_t vocab, const std::string& what,
                      std::optional<std::int64_t> allowed = std::nullopt) {
  for (std::int64_t i = 0; i < t.batch * t.seq; ++i) {
    const std::int64_t v = t.ids[static_cast<std::size_t>(i)];
    if ((v >= 0 && v < vocab) || (allowed && v == *allowed)) continue;
    ::edl::detail::raise(errc::invalid_argument, what,
                         ::edl::detail::concat("id ", v, " at position (", i / t.seq, ", ", i % t.seq,
                                               ") is outside [0, ", vocab, ")",
                                               allowed ? ::edl::detail::concat(" and is not ", *allowed) : ""));
  }
}

/// Logits [batch * seq * vocab] of a causal LM, as `edl logits` computes them.
template <class Model>
std::vector<float> compute_logits(Model& model, const TokenBatch& t, const MeshDims& mesh = kOneDevice) {
  check_ids(t, model.config().vocab_size, "--tokens");
  std::vector<float> out(static_cast<std::size_t>(t.batch * t.seq * model.config().vocab_size));
  run_on_mesh(mesh, model, models::MeshOp::logits, t.ids.data(), t.layout(), nullptr, out.data());
  return out;
}

/// edl logits --model DIR --tokens T.npy --out L.npy [--mesh ...] [--adapter DIR [--merge-adapter]]
inline int cmd_logits(Args& args) {
  const AdapterFlags af = adapter_flags(args, args.required("--model"), "logits");
  const std::string tokens = args.required("--tokens"), out = args.required("--out");
  const MeshDims mesh = mesh_flag(args);
  args.finish();
  auto model = models::from_pretrained<>(af.model);
  apply_adapter(model, af);
  const TokenBatch t = load_token_ids(tokens);
  std::vector<float> logits = compute_logits(model, t, mesh);
  const std::vector<std::size_t> shape = {static_cast<std::size_t>(t.batch), static_cast<std::size_t>(t.seq),
                                          static_cast<std::size_t>(model.config().vocab_size)};
  if (launch().is_primary()) io::save_npy(out, xt::adapt(logits, shape));
  nlohmann::ordered_json j;
  j["out"] = out;
  j["shape"] = shape;
  std::cout << j.dump() << "\n";
  return 0;
}

inline Command logits_command() {
  return {.name = "logits",
          .group = "models",
          .summary = "run a model on token ids and write its float32 logits [batch, seq, vocab] as .npy",
          .synopsis = "--model DIR --tokens T.npy --out L.npy [--mesh dp=1,fsdp=1,tp=1,sp=1] [--adapter DIR]",
          .flags = flags({{text_flag("--model", "DIR", "an HF folder (config.json + safetensors) or a .gguf file").required(),
                           text_flag("--tokens", "T.npy", "int32 or int64 token ids [batch, seq] or [seq]").required(),
                           text_flag("--out", "L.npy", "where the logits are written").required(),
                           declare_mesh_flag()},
                          declare_adapter_flags()}),
          .examples = {"edl logits --model ckpt --tokens tokens.npy --out logits.npy",
                       "edl logits --model ckpt --tokens tokens.npy --out logits.npy --mesh fsdp=2,tp=2"},
          .run = cmd_logits};
}

}  // namespace edl::cli
