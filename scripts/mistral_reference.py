"""A PyTorch reference for Mistral (HF MistralForCausalLM: Llama with a sliding attention
window), beside the shared Llama oracle.

Builds a tiny Mistral from the oracle's Llama with a window of 3 keys, shorter than the fixture's
8 tokens, so the window cuts every row past position 2, and writes its HF folder and, in
float64, the logits, HF causal-LM loss and every gradient of a token batch:
    OUT/config.json, OUT/model.safetensors           (model_type "mistral", sliding_window 3)
    OUT/oracle/tokens.npy, logits.npy, loss.json, grads.safetensors

    /usr/bin/python3 scripts/mistral_reference.py --oracle ../shared/oracle --out tests/data/tiny_mistral
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_parts import add_sliding_window, family_setup, randomize_weights, write_family_fixture  # noqa: E402

WINDOW = 3
args, ref_llama, st_np = family_setup(default_seed=17)
config = ref_llama.make_config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                               max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5)
config.update({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": WINDOW})
config.pop("attention_bias", None)
config.pop("mlp_bias", None)

model = ref_llama.LlamaForCausalLM(config)
for layer in model.model.layers:
    add_sliding_window(layer.self_attn, WINDOW)
g = torch.Generator().manual_seed(args.seed)
randomize_weights(model, g, lambda name: (1.0, 0.1) if name.endswith("norm.weight") else (0.0, 0.2))

write_family_fixture(model, config, args.out, g, st_np)
