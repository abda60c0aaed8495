"""A PyTorch reference for Qwen2 (HF Qwen2ForCausalLM: Llama with biases on q, k and v), beside
the shared Llama oracle.

Builds a tiny Qwen2 from the oracle's Llama with q_proj, k_proj and v_proj given biases (random,
so they matter), writes its HF folder and, in float64, the logits, HF causal-LM loss and every
gradient of a token batch:
    OUT/config.json, OUT/model.safetensors           (model_type "qwen2", HF names incl. *.bias)
    OUT/oracle/tokens.npy, logits.npy, loss.json, grads.safetensors

    /usr/bin/python3 scripts/qwen2_reference.py --oracle ../shared/oracle --out tests/data/tiny_qwen2
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
ap.add_argument("--seed", type=int, default=7)
args = ap.parse_args()
sys.path.insert(0, args.oracle)
import ref_llama  # noqa: E402
import st_np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_parts import add_qkv_biases  # noqa: E402

config = ref_llama.make_config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                               max_position_embeddings=64, rope_theta=1000000.0, rms_norm_eps=1e-6)
config.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False,
               "sliding_window": 32, "max_window_layers": 2})
config.pop("attention_bias", None)  # Qwen2's q/k/v biases are implied by the model type
config.pop("mlp_bias", None)

model = ref_llama.LlamaForCausalLM(config)
for layer in model.model.layers:  # Qwen2: biases on q, k, v (not o)
    add_qkv_biases(layer.self_attn)
g = torch.Generator().manual_seed(args.seed)
with torch.no_grad():
    for name, p in sorted(model.named_parameters()):
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float32))
        else:
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * (0.5 if name.endswith(".bias") else 0.1))

os.makedirs(os.path.join(args.out, "oracle"), exist_ok=True)
with open(os.path.join(args.out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
st_np.save_file(state, os.path.join(args.out, "model.safetensors"))

# The reference runs in float64 on the float32 weights as saved.
model = model.double()
tokens = torch.randint(0, config["vocab_size"], (2, 8), generator=g)
logits = model(tokens)
shift = logits[:, :-1].reshape(-1, config["vocab_size"])
loss = nn.functional.cross_entropy(shift, tokens[:, 1:].reshape(-1))
loss.backward()
np.save(os.path.join(args.out, "oracle", "tokens.npy"), tokens.numpy().astype(np.int64))
np.save(os.path.join(args.out, "oracle", "logits.npy"), logits.detach().numpy().astype(np.float32))
with open(os.path.join(args.out, "oracle", "loss.json"), "w") as f:
    json.dump({"loss": loss.item(), "n_target_tokens": int(tokens[:, 1:].numel())}, f, indent=2)
st_np.save_file({k: p.grad.numpy().astype(np.float32) for k, p in model.named_parameters()},
                os.path.join(args.out, "oracle", "grads.safetensors"))
print("wrote", args.out, "loss", loss.item())
