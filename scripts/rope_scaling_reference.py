"""A PyTorch reference for the rope scalings yarn, dynamic (NTK) and longrope as transformers
computes them (modeling_rope_utils: _compute_yarn_parameters, _compute_dynamic_ntk_parameters,
_compute_longrope_parameters and dynamic_rope_update), beside the shared Llama oracle.

The frequencies are written here from the formulas, in float64, and replace the oracle's plain
rope; dynamic and longrope read the sequence length L of each forward (its largest position + 1),
so in KV-cache decoding a token is rotated by the L of the step that writes it and the cached keys
keep theirs, as HF generation does. For each scaling a tiny Llama is written with its config and,
in float64, the full forward's logits, HF causal-LM loss and every gradient of a [2, 8] batch,
and the logits of cached decoding (a prefill of 4 tokens, then one token at a time, so dynamic and
longrope cross their threshold of 6 positions mid-way):
    OUT/<type>/config.json, model.safetensors
    OUT/<type>/oracle/tokens.npy, logits.npy, loss.json, grads.safetensors, cached_logits.npy

    /usr/bin/python3 scripts/rope_scaling_reference.py --oracle ../shared/oracle --out tests/data/tiny_rope
"""
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_parts import family_setup, randomize_weights, write_family_fixture  # noqa: E402

THRESHOLD = 6  # dynamic's max_position_embeddings, longrope's original context
PREFILL = 4


def inv_freq_and_scale(config, dim, L):
    """(inv_freq [dim / 2] float64, attention factor) of config's rope in a forward of length L."""
    base = config["rope_theta"]
    rs = config["rope_scaling"]
    kind = rs.get("rope_type", rs.get("type"))
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    if kind == "dynamic":
        max_pos = config["max_position_embeddings"]
        if L > max_pos:
            base = base * ((rs["factor"] * L / max_pos) - (rs["factor"] - 1)) ** (dim / (dim - 2))
        return 1.0 / base ** exponents, 1.0
    if kind == "yarn":
        factor = rs["factor"]
        original = rs.get("original_max_position_embeddings", config["max_position_embeddings"])
        scale = rs.get("attention_factor") or 0.1 * math.log(factor) + 1.0
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def correction_dim(rotations):
            return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp
        original_freq = 1.0 / base ** exponents
        return original_freq / factor * (1 - keep) + original_freq * keep, scale
    if kind == "longrope":
        original = config["original_max_position_embeddings"]
        factor = config["max_position_embeddings"] / original
        scale = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
        ext = torch.tensor(rs["long_factor"] if L > original else rs["short_factor"], dtype=torch.float64)
        return 1.0 / (ext * base ** exponents), scale
    raise ValueError(kind)


def scaled_rope(config):
    """The oracle's rope_cos_sin with config's scaling; L = the forward's largest position + 1."""
    def rope_cos_sin(positions, head_dim, theta, dtype):
        inv_freq, scale = inv_freq_and_scale(config, head_dim, int(positions.max()) + 1)
        freqs = torch.outer(positions.to(torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)
    return rope_cos_sin


args, ref_llama, st_np = family_setup(default_seed=23)
SCALINGS = {
    # yarn: frequency 0 kept, 1 halfway, 2 and 3 interpolated (original context 64, head_dim 8).
    "yarn": dict(max_position_embeddings=256,
                 rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    "dynamic": dict(max_position_embeddings=THRESHOLD, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    # longrope as Phi-3 128k writes it: the original context at the top level, no factor.
    "longrope": dict(max_position_embeddings=4 * THRESHOLD, original_max_position_embeddings=THRESHOLD,
                     rope_scaling={"type": "longrope", "short_factor": [1.0, 1.25, 1.5, 2.0],
                                   "long_factor": [1.0, 2.0, 5.0, 9.0]}),
}
for kind, fields in SCALINGS.items():
    config = ref_llama.make_config(vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   rope_theta=10000.0, rms_norm_eps=1e-5, **fields)
    ref_llama.rope_cos_sin = scaled_rope(config)
    model = ref_llama.LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(args.seed)
    randomize_weights(model, g, lambda name: (1.0, 0.1) if name.endswith("norm.weight") else (0.0, 0.3))
    out = os.path.join(args.out, kind)
    model, tokens, logits = write_family_fixture(model, config, out, g, st_np)
    with torch.no_grad():
        cache = model.new_cache()
        rows = [model(tokens[:, :PREFILL], cache, 0)]
        for t in range(PREFILL, tokens.shape[1]):
            rows.append(model(tokens[:, t:t + 1], cache, t))
        cached = torch.cat(rows, dim=1)
    np.save(os.path.join(out, "oracle", "cached_logits.npy"), cached.numpy().astype(np.float32))
    gap = (cached - logits.detach()).abs().max().item()
    print(kind, "cached decoding vs full forward: max |diff|", gap)
    if kind == "yarn":
        assert gap < 1e-10, "a static scaling decodes as its full forward"
    else:
        assert gap > 1e-3, "the threshold is crossed, so cached decoding differs from the full forward"
