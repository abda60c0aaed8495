"""A PyTorch reference for Phi-3 (HF Phi3ForCausalLM, the 4k-context models: Llama's math with the
attention's q, k and v projections fused into one qkv_proj and the MLP's gate and up projections
into one gate_up_proj), beside the shared Llama oracle.

Builds a tiny model from the oracle's Llama (random weights, grouped-query attention), and writes
its HF folder with Phi-3's fused names and, in float64, the logits, HF causal-LM loss and every
gradient of a token batch (fused the same way):
    OUT/config.json, OUT/model.safetensors     (model_type "phi3": self_attn.qkv_proj = [q; k; v]
                                                rows, mlp.gate_up_proj = [gate; up] rows)
    OUT/oracle/tokens.npy, logits.npy, loss.json, grads.safetensors

    /usr/bin/python3 scripts/phi3_reference.py --oracle ../shared/oracle --out tests/data/tiny_phi3
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_parts import family_setup, randomize_weights, write_family_fixture  # noqa: E402

args, ref_llama, st_np = family_setup(default_seed=13)
config = ref_llama.make_config(vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                               rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
config.pop("head_dim", None)  # Phi3Config has none: hidden / heads
config.pop("mlp_bias", None)
config.update({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "attention_dropout": 0.0,
               "resid_pdrop": 0.0, "embd_pdrop": 0.0, "original_max_position_embeddings": 64,
               "rope_scaling": None, "sliding_window": 2047, "pad_token_id": 0})

model = ref_llama.LlamaForCausalLM(config)
g = torch.Generator().manual_seed(args.seed)
randomize_weights(model, g, lambda name: (1.0, 0.1) if name.endswith("norm.weight") else (0.0, 0.2))


def fused(tensors):
    """Llama's names to Phi-3's: q/k/v rows into qkv_proj, gate/up rows into gate_up_proj."""
    out = {}
    for k, v in tensors.items():
        if k.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight")):
            continue
        if k.endswith("self_attn.q_proj.weight"):
            base = k[: -len("q_proj.weight")]
            out[base + "qkv_proj.weight"] = np.concatenate(
                [v, tensors[base + "k_proj.weight"], tensors[base + "v_proj.weight"]], axis=0)
        elif k.endswith("mlp.gate_proj.weight"):
            base = k[: -len("gate_proj.weight")]
            out[base + "gate_up_proj.weight"] = np.concatenate([v, tensors[base + "up_proj.weight"]], axis=0)
        else:
            out[k] = v
    return out


write_family_fixture(model, config, args.out, g, st_np, to_file=fused)
