"""The Llama forward with bf16 (or f16) activations: the reference of edl's compute dtype
(Policy<Param, Compute>, docs/modules.md "Compute dtype").

Written out from the equations, not from edl's code. Every value runs in float64; where edl
rounds an activation to the compute dtype, this rounds too (through float32, as edl's f32
results are rounded): the embeddings, each norm's output, q / k / v after their projections
and again after rope, the attention's context, the attention's and the MLP's outputs, each
residual sum, the MLP's gate, up and activation, and the logits. Scores, softmax, norms'
statistics and the loss are float64.

    /usr/bin/python3 scripts/compute_dtype_reference.py --oracle ../shared/oracle \
        --model tests/data/tiny_hf --dtype bfloat16

writes MODEL/oracle/<dtype>_compute_logits.npy ([2, 8, vocab], float32) and
<dtype>_compute_loss.json (the HF causal-LM loss of the rounded logits) for the tokens of
MODEL/oracle/tokens.npy.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--oracle", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
args = ap.parse_args()
sys.path.insert(0, args.oracle)
import st_np  # noqa: E402

narrow = torch.bfloat16 if args.dtype == "bfloat16" else torch.float16
cfg = json.load(open(os.path.join(args.model, "config.json")))
W = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in st_np.load_file(os.path.join(args.model, "model.safetensors")).items()}
ids = torch.from_numpy(np.load(os.path.join(args.model, "oracle", "tokens.npy")))


def r(x):
    """An activation of the compute dtype: float64 -> float32 -> narrow -> float64."""
    return x.to(torch.float32).to(narrow).to(torch.float64)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
D = cfg.get("head_dim", H // nh)
eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
B, S = ids.shape
inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
ang = torch.outer(torch.arange(S, dtype=torch.float64), inv_freq)  # [S, D/2]
cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)


def rope(x):  # [B, heads, S, D], HF's rotate_half convention
    half = torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1)
    return x * cos + half * sin


x = r(W["model.embed_tokens.weight"][ids])
causal = torch.ones(S, S, dtype=torch.bool).tril()
for l in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{l}."
    n1 = r(rms_norm(x, W[p + "input_layernorm.weight"], eps))
    q = r(n1 @ W[p + "self_attn.q_proj.weight"].T).view(B, S, nh, D).transpose(1, 2)
    k = r(n1 @ W[p + "self_attn.k_proj.weight"].T).view(B, S, nkv, D).transpose(1, 2)
    v = r(n1 @ W[p + "self_attn.v_proj.weight"].T).view(B, S, nkv, D).transpose(1, 2)
    q, k = r(rope(q)), r(rope(k))
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    ctx = r((probs @ v).transpose(1, 2).reshape(B, S, nh * D))
    h = r(x + r(ctx @ W[p + "self_attn.o_proj.weight"].T))
    n2 = r(rms_norm(h, W[p + "post_attention_layernorm.weight"], eps))
    g = r(n2 @ W[p + "mlp.gate_proj.weight"].T)
    u = r(n2 @ W[p + "mlp.up_proj.weight"].T)
    a = r(torch.nn.functional.silu(g) * u)
    x = r(h + r(a @ W[p + "mlp.down_proj.weight"].T))
hidden = r(rms_norm(x, W["model.norm.weight"], eps))
head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
logits = r(hidden @ head.T)
loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

out = os.path.join(args.model, "oracle")
np.save(os.path.join(out, f"{args.dtype}_compute_logits.npy"), logits.numpy().astype(np.float32))
with open(os.path.join(out, f"{args.dtype}_compute_loss.json"), "w") as f:
    json.dump({"loss": loss.item(), "n_target_tokens": int(ids[:, 1:].numel())}, f, indent=2)
print(args.dtype, "loss", loss.item())
