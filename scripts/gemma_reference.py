"""A PyTorch reference for Gemma 3 (HF Gemma3ForCausalLM, model_type "gemma3_text") and
Gemma 2 (Gemma2ForCausalLM, "gemma2"), written here from transformers' modeling_gemma3 and
modeling_gemma2 in float64, beside the shared Llama oracle.

What makes it Gemma, all exercised by a tiny model (4 layers, 4 heads over 2 kv heads,
head_dim 8 with hidden 16, query_pre_attn_scalar 12, a sliding window of 3 keys on every layer
but the last of each group of 2 (sliding_window_pattern 2: layers 0 and 2 slide, 1 and 3 are
global), rope_local_base_freq 100 on the sliding layers and rope_theta 10000 with linear
scaling (factor 2) on the global ones):
  - RMSNorm scales by (1 + weight) (weights stored around 0), in four norms per layer:
    input_layernorm, post_attention_layernorm (on the attention's output, before the residual),
    pre_feedforward_layernorm, post_feedforward_layernorm (on the MLP's output);
  - q_norm and k_norm (the same (1 + w) RMSNorm over head_dim) on each head before rope;
  - attention scores scaled by query_pre_attn_scalar^-0.5 instead of head_dim^-0.5;
  - the MLP is GeGLU: down(gelu_tanh(gate x) * up x);
  - the embeddings are multiplied by sqrt(hidden_size); the lm_head is the tied embedding.
Gemma 2 (--family gemma2) has no q/k norms, one rope for every layer, its sliding layers are the
even ones, and it soft-caps the attention scores (attn_logit_softcapping: s <- c tanh(s / c),
before the mask) and the final logits (final_logit_softcapping); the fixture's caps (2 and 3)
are small enough to bend most values.
Writes the HF folder and the logits, HF causal-LM loss and every gradient of a [2, 8] batch:
    OUT/config.json, OUT/model.safetensors
    OUT/oracle/tokens.npy, logits.npy, loss.json, grads.safetensors

    /usr/bin/python3 scripts/gemma_reference.py --oracle ../shared/oracle --out tests/data/tiny_gemma3
    /usr/bin/python3 scripts/gemma_reference.py --oracle ../shared/oracle --family gemma2 --out tests/data/tiny_gemma2
"""
import math
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_parts import family_setup, randomize_weights, write_family_fixture  # noqa: E402

GEMMA2 = "--family" in sys.argv and sys.argv[sys.argv.index("--family") + 1] == "gemma2"
if "--family" in sys.argv:  # family_setup parses the shared flags
    i = sys.argv.index("--family")
    del sys.argv[i:i + 2]


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(T, head_dim, theta, factor, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)) / factor
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, c, sliding):
        super().__init__()
        H, self.nh, self.nkv, self.hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        if not GEMMA2:
            self.q_norm = GemmaRMSNorm(self.hd, c["rms_norm_eps"])
            self.k_norm = GemmaRMSNorm(self.hd, c["rms_norm_eps"])
        self.scaling = c["query_pre_attn_scalar"] ** -0.5
        self.window = c["sliding_window"] if sliding else None
        local = sliding and not GEMMA2  # Gemma 3's sliding layers have their own rope
        self.theta = c["rope_local_base_freq"] if local else c["rope_theta"]
        self.factor = 1.0 if local or not c.get("rope_scaling") else c["rope_scaling"]["factor"]
        self.softcap = c.get("attn_logit_softcapping")

    def forward(self, x):
        B, T, _ = x.shape
        q, k = self.q_proj(x).view(B, T, self.nh, self.hd), self.k_proj(x).view(B, T, self.nkv, self.hd)
        if not GEMMA2:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = rope(T, self.hd, self.theta, self.factor, x.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) * self.scaling
        if self.softcap:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        qpos, kpos = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
        masked = kpos > qpos
        if self.window is not None:
            masked = masked | (qpos - kpos >= self.window)
        p = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1)
        return self.o_proj((p @ v).transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c, sliding):
        super().__init__()
        eps = c["rms_norm_eps"]
        self.input_layernorm = GemmaRMSNorm(c["hidden_size"], eps)
        self.self_attn = Attention(c, sliding)
        self.post_attention_layernorm = GemmaRMSNorm(c["hidden_size"], eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(c["hidden_size"], eps)
        self.mlp = MLP(c)
        self.post_feedforward_layernorm = GemmaRMSNorm(c["hidden_size"], eps)

    def forward(self, x):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x)))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        def sliding(i):  # Gemma 2: the even layers; Gemma 3: all but the last of each pattern
            return not bool(i % 2) if GEMMA2 else bool((i + 1) % c["sliding_window_pattern"])
        self.layers = nn.ModuleList(Layer(c, sliding(i)) for i in range(c["num_hidden_layers"]))
        self.norm = GemmaRMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Gemma3ForCausalLM(nn.Module):  # and Gemma2ForCausalLM
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Body(c)

    def forward(self, ids):
        x = self.model.embed_tokens(ids) * torch.tensor(self.c["hidden_size"] ** 0.5, dtype=self.model.embed_tokens.weight.dtype)
        for layer in self.model.layers:
            x = layer(x)
        logits = self.model.norm(x) @ self.model.embed_tokens.weight.T  # tied lm_head
        cap = self.c.get("final_logit_softcapping")
        return torch.tanh(logits / cap) * cap if cap else logits


args, _, st_np = family_setup(default_seed=29)
config = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 48, "hidden_size": 16,
          "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 64,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_local_base_freq": 100.0,
          "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "query_pre_attn_scalar": 12,
          "sliding_window": 3, "sliding_window_pattern": 2, "final_logit_softcapping": None,
          "attn_logit_softcapping": None, "attention_bias": False, "attention_dropout": 0.0,
          "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
          "torch_dtype": "float32", "initializer_range": 0.02}
if GEMMA2:
    for k in ("rope_local_base_freq", "sliding_window_pattern", "rope_scaling"):
        del config[k]
    config.update({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_act": "gelu_pytorch_tanh",
                   "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0, "cache_implementation": "hybrid"})
model = Gemma3ForCausalLM(config)
g = torch.Generator().manual_seed(args.seed)
# Every weight around 0, the norms too (they scale by 1 + w).
randomize_weights(model, g, lambda name: (0.0, 0.3))
write_family_fixture(model, config, args.out, g, st_np)
