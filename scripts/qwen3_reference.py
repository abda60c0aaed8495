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
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_parts import add_head_norms, family_setup, randomize_weights, write_family_fixture  # noqa: E402

args, ref_llama, st_np = family_setup(default_seed=11)
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
# The head norms spread more, so a missing or swapped norm shows.
randomize_weights(model, g, lambda name: (1.0, 0.3) if name.endswith(("q_norm.weight", "k_norm.weight"))
                  else (1.0, 0.1) if name.endswith("norm.weight") else (0.0, 0.2))


def drop_tied_head(tensors):  # tied: HF writes the embedding only
    return {k: v for k, v in tensors.items() if k != "lm_head.weight"}


model, tokens, logits = write_family_fixture(model, config, args.out, g, st_np, to_file=drop_tied_head)

# The oracle's KV-cache decoding (prefill, then one token at a time) gives the full forward's logits.
with torch.no_grad():
    cache = model.new_cache()
    steps = [model(tokens[:, :5], cache, 0)[:, -1]]
    for t in range(5, 8):
        steps.append(model(tokens[:, t:t + 1], cache, t)[:, -1])
    assert torch.allclose(torch.stack(steps, 1), logits[:, 4:].detach(), atol=1e-10), "cached decoding differs"
