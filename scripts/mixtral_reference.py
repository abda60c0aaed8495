"""A PyTorch reference for Mixtral (HF MixtralForCausalLM: Mistral with a sparse mixture of
experts, MixtralSparseMoeBlock, in place of every MLP), beside the shared Llama oracle.

Builds a tiny Mixtral from the oracle's Llama, each layer's `mlp` replaced by a
`block_sparse_moe` (router "gate", experts.J.w1/w2/w3, HF names), and writes its HF folder and,
in float64, for a right-padded batch (row 1 ends in two padding tokens, labels -100 there):
the logits of the batch without padding, and the loss MixtralForCausalLM computes with
output_router_logits: the causal-LM cross-entropy plus router_aux_loss_coef x transformers'
load_balancing_loss_func over every layer's router logits with the attention mask, and every
gradient of that loss:
    OUT/config.json, OUT/model.safetensors          (model_type "mixtral")
    OUT/oracle/tokens.npy, attention_mask.npy, labels.npy, logits.npy, loss.json, grads.safetensors

    /usr/bin/python3 scripts/mixtral_reference.py --oracle ../shared/oracle --out tests/data/tiny_mixtral
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
ap.add_argument("--out", required=True)
ap.add_argument("--seed", type=int, default=12)
args = ap.parse_args()
sys.path.insert(0, args.oracle)
import ref_llama  # noqa: E402
import st_np  # noqa: E402

E, K = 4, 2
config = ref_llama.make_config(vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                               rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
config.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "sliding_window": None,
               "num_local_experts": E, "num_experts_per_tok": K, "output_router_logits": True,
               "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0, "attention_dropout": 0.0})


class SparseMoeBlock(nn.Module):
    """MixtralSparseMoeBlock: softmax over the router's logits in float, top-k, renormalised."""

    def __init__(self, H, I):
        super().__init__()
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = nn.ModuleList()
        for _ in range(E):
            ex = nn.Module()
            ex.w1, ex.w2, ex.w3 = nn.Linear(H, I, bias=False), nn.Linear(I, H, bias=False), nn.Linear(H, I, bias=False)
            self.experts.append(ex)

    def forward(self, x):
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        logits = self.gate(h)
        probs = F.softmax(logits, dim=-1)
        w, sel = torch.topk(probs, K, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        y = torch.zeros_like(h)
        for j, ex in enumerate(self.experts):
            tok, slot = torch.where(sel == j)
            if tok.numel() == 0:
                continue
            out = ex.w2(F.silu(ex.w1(h[tok])) * ex.w3(h[tok]))
            y = y.index_add(0, tok, out * w[tok, slot, None])
        return y.reshape(shape), logits


router_logits = []


def sparse_layer_forward(self, x, cos, sin, layer_cache, start_pos):
    x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer_cache, start_pos)
    y, logits = self.block_sparse_moe(self.post_attention_layernorm(x))
    router_logits.append(logits)
    return x + y


model = ref_llama.LlamaForCausalLM(config)
for layer in model.model.layers:
    del layer.mlp
    layer.block_sparse_moe = SparseMoeBlock(config["hidden_size"], config["intermediate_size"])
    layer.forward = types.MethodType(sparse_layer_forward, layer)
g = torch.Generator().manual_seed(args.seed)
with torch.no_grad():
    for name, p in sorted(model.named_parameters()):
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float32))
        elif name.endswith("block_sparse_moe.gate.weight"):  # decisive routing: no near ties
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.8)
        else:
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.2)

os.makedirs(os.path.join(args.out, "oracle"), exist_ok=True)
with open(os.path.join(args.out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
st_np.save_file({k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()},
                os.path.join(args.out, "model.safetensors"))


def load_balancing_loss_func(gate_logits, num_experts, top_k, attention_mask):
    """transformers.models.mixtral.modeling_mixtral.load_balancing_loss_func."""
    cat = torch.cat(list(gate_logits), dim=0)
    routing_weights = F.softmax(cat, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = F.one_hot(selected_experts, num_experts)
    batch_size, sequence_length = attention_mask.shape
    num_hidden_layers = cat.shape[0] // (batch_size * sequence_length)
    expert_attention_mask = (attention_mask[None, :, :, None, None]
                             .expand((num_hidden_layers, batch_size, sequence_length, top_k, num_experts))
                             .reshape(-1, top_k, num_experts))
    tokens_per_expert = torch.sum(expert_mask.double() * expert_attention_mask, dim=0) / torch.sum(
        expert_attention_mask, dim=0)
    router_per_expert_attention_mask = (attention_mask[None, :, :, None]
                                        .expand((num_hidden_layers, batch_size, sequence_length, num_experts))
                                        .reshape(-1, num_experts))
    router_prob_per_expert = torch.sum(routing_weights * router_per_expert_attention_mask, dim=0) / torch.sum(
        router_per_expert_attention_mask, dim=0)
    overall_loss = torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0))
    return overall_loss * num_experts


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
