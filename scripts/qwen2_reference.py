"""A PyTorch reference for Qwen2 (HF Qwen2ForCausalLM: Llama with biases on q, k and v), beside
the shared Llama oracle.

Builds a tiny Qwen2 from the oracle's Llama with q_proj, k_proj and v_proj given biases (random,
so they matter), writes its HF folder and, in float64, the logits, HF causal-LM loss and every
gradient of a token batch:
    OUT/config.json, OUT/model.safetensors           (model_type "qwen2", HF names incl. *.bias)
    OUT/oracle/tokens.npy, logits.npy, loss.json, grads.safetensors

    /usr/bin/python3 scripts/qwen2_reference.py --oracle ../shared/oracle --out tests/data/tiny_qwen2
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_parts import add_qkv_biases, family_setup, randomize_weights, write_family_fixture  # noqa: E402

args, ref_llama, st_np = family_setup(default_seed=7)
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
randomize_weights(model, g, lambda name: (1.0, 0.1) if name.endswith("norm.weight")
                  else (0.0, 0.5 if name.endswith(".bias") else 0.1))

write_family_fixture(model, config, args.out, g, st_np)
