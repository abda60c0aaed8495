"""A PyTorch reference for mixture-of-experts models, beside the shared Llama oracle:
Mixtral (HF MixtralForCausalLM: block_sparse_moe in every layer), Qwen2-MoE (Qwen2 with
mlp = a sparse block plus a gated shared expert, some layers dense through mlp_only_layers) and
Qwen3-MoE (Qwen3's per-head q/k norms, a sparse block with renormalised weights).

Builds a tiny model of the family from the oracle's Llama, each sparse layer's `mlp` replaced
by the block (reference_parts.SparseMoeBlock, HF names), and writes its HF folder and, in
float64, for a right-padded batch (row 1 ends in two padding tokens, labels -100 there): the
logits of the batch without padding, and the loss the HF model computes with
output_router_logits: the causal-LM cross-entropy plus router_aux_loss_coef x transformers'
load_balancing_loss_func over every sparse layer's router logits with the attention mask, and
every gradient of that loss:
    OUT/config.json, OUT/model.safetensors
    OUT/oracle/tokens.npy, attention_mask.npy, labels.npy, logits.npy, loss.json, grads.safetensors

    /usr/bin/python3 scripts/moe_model_reference.py --oracle ../shared/oracle --family mixtral --out tests/data/tiny_mixtral
    /usr/bin/python3 scripts/moe_model_reference.py --oracle ../shared/oracle --family qwen2_moe --out tests/data/tiny_qwen2_moe
    /usr/bin/python3 scripts/moe_model_reference.py --oracle ../shared/oracle --family qwen3_moe --out tests/data/tiny_qwen3_moe
"""
import argparse
import json
import os
import sys
import types

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--oracle", required=True)
ap.add_argument("--family", choices=["mixtral", "qwen2_moe", "qwen3_moe"], default="mixtral")
ap.add_argument("--out", required=True)
ap.add_argument("--seed", type=int, default=None)
args = ap.parse_args()
sys.path.insert(0, args.oracle)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llama  # noqa: E402
import st_np  # noqa: E402
from reference_parts import (SparseMoeBlock, add_head_norms, add_qkv_biases, load_balancing_loss_func,  # noqa: E402
                             randomize_weights)

E, K = 4, 2
family = args.family
if family == "mixtral":
    seed = 12
    config = ref_llama.make_config(vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    config.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "sliding_window": None,
                   "num_local_experts": E, "num_experts_per_tok": K, "output_router_logits": True,
                   "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0, "attention_dropout": 0.0})
    sparse = [0, 1]
    block = lambda: SparseMoeBlock(16, 24, E, K, True, "mixtral")
    block_name = "block_sparse_moe"
elif family == "qwen2_moe":  # a dense middle layer, a shared expert, weights not renormalised
    seed = 27
    config = ref_llama.make_config(vocab_size=48, hidden_size=16, intermediate_size=20, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
    config.update({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": E,
                   "num_experts_per_tok": K, "moe_intermediate_size": 12, "shared_expert_intermediate_size": 24,
                   "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [1],
                   "output_router_logits": True, "router_aux_loss_coef": 0.02, "use_sliding_window": False,
                   "sliding_window": None, "attention_dropout": 0.0})
    sparse = [0, 2]
    block = lambda: SparseMoeBlock(16, 12, E, K, False, "qwen", shared=24)
    block_name = "mlp"
else:  # qwen3_moe: q/k norms, head_dim 8 (not hidden / heads), renormalised weights
    seed = 32
    config = ref_llama.make_config(vocab_size=48, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=64, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=False)
    config.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": E,
                   "num_experts_per_tok": K, "moe_intermediate_size": 12, "norm_topk_prob": True,
                   "decoder_sparse_step": 1, "mlp_only_layers": [], "output_router_logits": True,
                   "router_aux_loss_coef": 0.02, "use_sliding_window": False, "sliding_window": None,
                   "attention_dropout": 0.0})
    sparse = [0, 1]
    block = lambda: SparseMoeBlock(16, 12, E, K, True, "qwen")
    block_name = "mlp"
if args.seed is not None:
    seed = args.seed

router_logits = []


def sparse_layer_forward(self, x, cos, sin, layer_cache, start_pos):
    x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer_cache, start_pos)
    y, logits = getattr(self, block_name)(self.post_attention_layernorm(x))
    router_logits.append(logits)
    return x + y


model = ref_llama.LlamaForCausalLM(config)
for i, layer in enumerate(model.model.layers):
    if family == "qwen3_moe":
        add_head_norms(ref_llama, layer.self_attn, config["rms_norm_eps"])
    if family == "qwen2_moe":
        add_qkv_biases(layer.self_attn)
    if i not in sparse:
        continue
    del layer.mlp
    setattr(layer, block_name, block())
    layer.forward = types.MethodType(sparse_layer_forward, layer)
g = torch.Generator().manual_seed(seed)
randomize_weights(model, g, lambda name: (1.0, 0.3) if name.endswith(("q_norm.weight", "k_norm.weight"))
                  else (1.0, 0.1) if name.endswith("norm.weight")
                  else (0.0, 0.8) if name.endswith(("block_sparse_moe.gate.weight", "mlp.gate.weight"))  # decisive routing
                  else (0.0, 0.2))

os.makedirs(os.path.join(args.out, "oracle"), exist_ok=True)
with open(os.path.join(args.out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
st_np.save_file({k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()},
                os.path.join(args.out, "model.safetensors"))


# The reference runs in float64 on the float32 weights as saved.
model = model.double()
B, S = 2, 8
tokens = torch.randint(0, config["vocab_size"], (B, S), generator=g)
mask = torch.ones(B, S, dtype=torch.int64)
mask[1, S - 2:] = 0  # right padding: real tokens never attend to it, so the oracle needs no mask
labels = tokens.clone()
labels[mask == 0] = -100
router_logits.clear()
logits = model(tokens)
shift = logits[:, :-1].reshape(-1, config["vocab_size"])
ce = F.cross_entropy(shift, labels[:, 1:].reshape(-1), ignore_index=-100)
aux = load_balancing_loss_func(router_logits, E, K, mask.double())
loss = ce + config["router_aux_loss_coef"] * aux
loss.backward()

# Every routing decision must be clear of a tie: float32 must choose the same experts.
probs = F.softmax(torch.cat(router_logits, dim=0), dim=-1)
top = torch.topk(probs, K + 1, dim=-1).values
gap = (top[:, K - 1] - top[:, K]).min().item()
assert gap > 1e-3, f"near tie in the routing ({gap}); pick another seed"

# The oracle's KV-cache decoding (prefill, then one token at a time) gives the full forward's logits.
with torch.no_grad():
    cache = model.new_cache()
    steps = [model(tokens[:, :5], cache, 0)[:, -1]]
    for t in range(5, S):
        steps.append(model(tokens[:, t:t + 1], cache, t)[:, -1])
    assert torch.allclose(torch.stack(steps, 1), logits[:, 4:].detach(), atol=1e-10), "cached decoding differs"

np.save(os.path.join(args.out, "oracle", "tokens.npy"), tokens.numpy().astype(np.int64))
np.save(os.path.join(args.out, "oracle", "attention_mask.npy"), mask.numpy().astype(np.int64))
np.save(os.path.join(args.out, "oracle", "labels.npy"), labels.numpy().astype(np.int64))
np.save(os.path.join(args.out, "oracle", "logits.npy"), logits.detach().numpy().astype(np.float32))
with open(os.path.join(args.out, "oracle", "loss.json"), "w") as f:
    json.dump({"loss": loss.item(), "ce": ce.item(), "aux_loss": aux.item(),
               "n_target_tokens": int((labels[:, 1:] != -100).sum()), "routing_gap": gap}, f, indent=2)
st_np.save_file({k: (p.grad if p.grad is not None else torch.zeros_like(p)).numpy().astype(np.float32)
                 for k, p in model.named_parameters()},
                os.path.join(args.out, "oracle", "grads.safetensors"))
print("wrote", args.out, "loss", loss.item(), "aux", aux.item(), "gap", gap)
