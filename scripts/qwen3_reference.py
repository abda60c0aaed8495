"""A PyTorch reference for Qwen3 (HF Qwen3ForCausalLM: Llama with an RMSNorm over head_dim on
every query and key head, before rope), beside the shared Llama oracle.

Builds a tiny Qwen3 from the oracle's Llama with q_norm and k_norm added to each attention
(random weights near 1, so they matter) and a head_dim (8) that is not hidden / heads (4), with
tied embeddings as the small Qwen3 checkpoints have; writes its HF folder and, in float64, the
logits, HF causal-LM loss and every gradient of a token batch:
    OUT/config.json, OUT/model.safetensors           (model_type "qwen3", HF names incl. *_norm)
    OUT/oracle/tokens.npy, logits.npy, loss.json, grads.safetensors

    /usr/bin/python3 scripts/qwen3_reference.py --oracle ../shared/oracle --out tests/data/tiny_qwen3
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn

ap = argparse.ArgumentParser()
ap.add_argument("--oracle", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--seed", type=int, default=11)
args = ap.parse_args()
sys.path.insert(0, args.oracle)
import ref_llama  # noqa: E402
import st_np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_parts import add_head_norms  # noqa: E402

config = ref_llama.make_config(vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                               max_position_embeddings=64, rope_theta=1000000.0, rms_norm_eps=1e-6,
                               tie_word_embeddings=True)
config.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_dropout": 0.0,
               "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2})


model = ref_llama.LlamaForCausalLM(config)
for layer in model.model.layers:
    add_head_norms(ref_llama, layer.self_attn, config["rms_norm_eps"])
g = torch.Generator().manual_seed(args.seed)
with torch.no_grad():
    for name, p in sorted(model.named_parameters()):
        if name.endswith(("q_norm.weight", "k_norm.weight")):  # spread, so a missing or swapped norm shows
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g, dtype=torch.float32))
        elif name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float32))
        else:
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.2)

os.makedirs(os.path.join(args.out, "oracle"), exist_ok=True)
with open(os.path.join(args.out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
state.pop("lm_head.weight")  # tied: HF writes the embedding only
st_np.save_file(state, os.path.join(args.out, "model.safetensors"))

# The reference runs in float64 on the float32 weights as saved.
model = model.double()
tokens = torch.randint(0, config["vocab_size"], (2, 8), generator=g)
logits = model(tokens)
shift = logits[:, :-1].reshape(-1, config["vocab_size"])
loss = nn.functional.cross_entropy(shift, tokens[:, 1:].reshape(-1))
loss.backward()

# The oracle's KV-cache decoding (prefill, then one token at a time) gives the full forward's logits.
with torch.no_grad():
    cache = model.new_cache()
    steps = [model(tokens[:, :5], cache, 0)[:, -1]]
    for t in range(5, 8):
        steps.append(model(tokens[:, t:t + 1], cache, t)[:, -1])
    assert torch.allclose(torch.stack(steps, 1), logits[:, 4:].detach(), atol=1e-10), "cached decoding differs"

np.save(os.path.join(args.out, "oracle", "tokens.npy"), tokens.numpy().astype(np.int64))
np.save(os.path.join(args.out, "oracle", "logits.npy"), logits.detach().numpy().astype(np.float32))
with open(os.path.join(args.out, "oracle", "loss.json"), "w") as f:
    json.dump({"loss": loss.item(), "n_target_tokens": int(tokens[:, 1:].numel())}, f, indent=2)
st_np.save_file({k: p.grad.numpy().astype(np.float32) for k, p in model.named_parameters()},
                os.path.join(args.out, "oracle", "grads.safetensors"))
print("wrote", args.out, "loss", loss.item())
