// examples/cli/loss.hpp: `edl loss` computes HF LlamaForCausalLM's loss, and optionally every
// parameter's gradient.
//
//   edl loss --model DIR --tokens T.npy [--labels Y.npy] [--grads G.safetensors] [--mesh ...]
//            [--adapter DIR [--merge-adapter]]   (adapter_flags.hpp; --grads then holds the adapter's too)
//
// Prints one JSON line {"loss": <mean CE>, "tokens": <number of targets>}. As HF: labels
// default to the tokens, the prediction at s is scored against labels[s + 1], -100 is ignored.
// Y.npy has the shape of T.npy (int32 or int64). With --grads, writes d loss / d parameter for
// every parameter under its HF name (F32 safetensors, metadata {"format": "pt"}, atomic).
#pragma once

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/pretrained.hpp>
#include "args.hpp"
#include "logits.hpp"
#include "mesh_flag.hpp"

namespace edl::cli {

/// The loss `edl loss` prints; with `grads`, every Param::grad holds d loss / d param afterwards
/// (zeroed first). labels: null = the tokens.
template <class Model>
nn::LossMetrics compute_loss(Model& model, const TokenBatch& t, const TokenBatch* labels, bool grads,
                             const MeshDims& mesh = kOneDevice) {
  const std::int64_t V = model.config().vocab_size;
  check_ids(t, V, "--tokens");
  if (labels) {
    EDL_CHECK(labels->batch == t.batch && labels->seq == t.seq, errc::shape_mismatch, "--labels",
              "labels have shape (", labels->batch, ", ", labels->seq, "), the tokens (", t.batch, ", ", t.seq, ")");
    check_ids(*labels, V, "--labels", -100);
  }
  const std::int64_t* l = labels ? labels->ids.data() : nullptr;
  return run_on_mesh(mesh, model, grads ? models::MeshOp::loss_and_grads : models::MeshOp::loss, t.ids.data(), t.layout(), l);
}

/// Writes every parameter's gradient (F32, HF names, HF order) to `path`, atomically.
template <class Model>
void save_grads(const std::string& path, Model& model) {
  io::TensorList list;
  // Parameters that never received a gradient are written as zeros (moving the outer vector
  // keeps each inner buffer in place, so the spans stay valid).
  std::vector<std::vector<float>> zeros;
  model.visit_params("", [&](std::string_view name, auto& p) {
    const float* g = p.has_grad() ? p.grad.data() : zeros.emplace_back(p.value.size(), 0.0f).data();
    list.emplace_back(std::string(name),
                      io::TensorRef(DType::f32, p.shape(),
                                    std::as_bytes(std::span<const float>(g, p.value.size()))));
  });
  std::vector<std::vector<std::byte>> fused;
  if constexpr (requires { model.config().fused_projections(); })
    models::fuse_tensors(model.config(), list, fused);  // Phi-3: the checkpoint's qkv_proj / gate_up_proj
  io::save_safetensors(path, list, {{"format", "pt"}});
}

/// edl loss --model DIR --tokens T.npy [--labels Y.npy] [--grads G.safetensors] [--mesh ...]
inline int cmd_loss(Args& args) {
  const AdapterFlags af = adapter_flags(args, args.required("--model"), "loss");
  const std::string tokens = args.required("--tokens");
  const std::string labels_path = args.has("--labels") ? args.required("--labels") : "";
  const std::string grads_path = args.has("--grads") ? args.required("--grads") : "";
  const MeshDims mesh = mesh_flag(args);
  args.finish();
  const TokenBatch t = load_token_ids(tokens);
  std::optional<TokenBatch> labels;
  if (!labels_path.empty()) labels = load_token_ids(labels_path, "--labels");
  auto model = models::from_pretrained<>(af.model);
  apply_adapter(model, af);
  const bool grads = !grads_path.empty();
  const nn::LossMetrics m = compute_loss(model, t, labels ? &*labels : nullptr, grads, mesh);
  if (grads && launch().is_primary()) save_grads(grads_path, model);
  nlohmann::ordered_json j;
  j["loss"] = m.loss;
  j["tokens"] = m.tokens;
  std::cout << j.dump() << "\n";
  return 0;
}

inline Command loss_command() {
  return {.name = "loss",
          .group = "models",
          .summary = "HF LlamaForCausalLM's loss on token ids, and optionally every parameter's gradient",
          .synopsis = "--model DIR --tokens T.npy [--labels Y.npy] [--grads G.safetensors] [--mesh ...] [--adapter DIR]",
          .flags = flags({{text_flag("--model", "DIR", "an HF folder (config.json + safetensors) or a .gguf file").required(),
                           text_flag("--tokens", "T.npy", "int32 or int64 token ids [batch, seq] or [seq]").required(),
                           text_flag("--labels", "Y.npy", "labels of the shape of the tokens (-100: ignored)")
                               .defaults("the tokens (HF shift)"),
                           text_flag("--grads", "G.safetensors", "also write d loss / d parameter under HF names"),
                           declare_mesh_flag()},
                          declare_adapter_flags()}),
          .examples = {"edl loss --model ckpt --tokens tokens.npy",
                       "edl loss --model ckpt --tokens tokens.npy --grads grads.safetensors --mesh fsdp=2"},
          .run = cmd_loss};
}

}  // namespace edl::cli
