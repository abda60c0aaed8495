"""Pieces the model references share (imported by the scripts beside it): Qwen3's per-head
q/k norms on the shared oracle's attention, and the sparse mixture-of-experts block of Mixtral
and Qwen-MoE with transformers' load-balancing loss."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def add_head_norms(ref_llama, attn, eps):
    """Qwen3Attention: q = q_norm(q_proj(x) per head), k likewise, before rope. The oracle's
    attention reshapes the projections' outputs to heads itself, so the norms run as forward
    hooks on q_proj and k_proj: parameter names stay HF's (self_attn.q_norm.weight, registered
    after o_proj as in HF), and the oracle's forward, cache and decoding are used unchanged."""
    attn.q_norm = ref_llama.RMSNorm(attn.hd, eps)
    attn.k_norm = ref_llama.RMSNorm(attn.hd, eps)

    def per_head(norm):
        def hook(_module, _inputs, out):
            return norm(out.view(*out.shape[:-1], -1, attn.hd)).reshape(out.shape)
        return hook

    attn.q_proj.register_forward_hook(per_head(attn.q_norm))
    attn.k_proj.register_forward_hook(per_head(attn.k_norm))


class SparseMoeBlock(nn.Module):
    """MixtralSparseMoeBlock (names "mixtral": experts.J.w1/w2/w3) or Qwen2MoeSparseMoeBlock /
    Qwen3MoeSparseMoeBlock (names "qwen": experts.J.gate_proj/up_proj/down_proj, and with
    shared > 0 a shared expert gated by sigmoid(shared_expert_gate(x))). Softmax over the
    router's logits, top-k, renormalised when norm_topk_prob. Returns (y, router logits)."""

    def __init__(self, H, I, E, K, norm_topk_prob, names, shared=0):
        super().__init__()
        self.E, self.K, self.norm, self.names = E, K, norm_topk_prob, names
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = nn.ModuleList([self._mlp(H, I) for _ in range(E)])
        if shared:
            self.shared_expert = self._mlp(H, shared)
            self.shared_expert_gate = nn.Linear(H, 1, bias=False)
        self.has_shared = bool(shared)

    def _mlp(self, H, I):
        m = nn.Module()
        if self.names == "mixtral":
            m.w1, m.w2, m.w3 = nn.Linear(H, I, bias=False), nn.Linear(I, H, bias=False), nn.Linear(H, I, bias=False)
        else:
            m.gate_proj, m.up_proj = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False)
            m.down_proj = nn.Linear(I, H, bias=False)
        return m

    def _run(self, m, h):
        if self.names == "mixtral":
            return m.w2(F.silu(m.w1(h)) * m.w3(h))
        return m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))

    def forward(self, x):
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        logits = self.gate(h)
        probs = F.softmax(logits, dim=-1)
        w, sel = torch.topk(probs, self.K, dim=-1)
        if self.norm:
            w = w / w.sum(dim=-1, keepdim=True)
        y = torch.zeros_like(h)
        for j, ex in enumerate(self.experts):
            tok, slot = torch.where(sel == j)
            if tok.numel() == 0:
                continue
            y = y.index_add(0, tok, self._run(ex, h[tok]) * w[tok, slot, None])
        if self.has_shared:
            y = y + torch.sigmoid(self.shared_expert_gate(h)) * self._run(self.shared_expert, h)
        return y.reshape(shape), logits


def load_balancing_loss_func(gate_logits, num_experts, top_k, attention_mask):
    """transformers.models.mixtral.modeling_mixtral.load_balancing_loss_func (Qwen2-MoE's and
    Qwen3-MoE's are the same function)."""
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


def add_sliding_window(attn, window):
    """MistralAttention's sliding window (transformers' sliding-window causal mask): query i
    attends to key j when j <= i and i - j < window. Replaces the oracle attention's forward
    with the same computation under that mask (no cache: the fixture is a full forward)."""
    import math
    import types

    def forward(self, x, cos, sin, layer_cache, start_pos):
        assert layer_cache is None and start_pos == 0, "the sliding-window reference runs full forwards only"
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        rot = lambda t: torch.cat((-t[..., t.shape[-1] // 2:], t[..., : t.shape[-1] // 2]), dim=-1)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        qpos = torch.arange(T).view(T, 1)
        kpos = torch.arange(T).view(1, T)
        scores = scores.masked_fill((kpos > qpos) | (qpos - kpos >= window), float("-inf"))
        p = F.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
        return self.o_proj((p @ v).transpose(1, 2).reshape(B, T, self.nh * self.hd))

    attn.forward = types.MethodType(forward, attn)


def add_qkv_biases(attn):
    """Qwen2Attention: biases on q, k and v (not o)."""
    attn.q_proj = nn.Linear(attn.q_proj.in_features, attn.q_proj.out_features, bias=True)
    attn.k_proj = nn.Linear(attn.k_proj.in_features, attn.k_proj.out_features, bias=True)
    attn.v_proj = nn.Linear(attn.v_proj.in_features, attn.v_proj.out_features, bias=True)


def randomize_weights(model, generator, spread):
    """Fills every parameter of `model`, in name order, with mean + std * N(0, 1) drawn from
    `generator`, (mean, std) = spread(name): the families' fixtures spread norms around 1 and
    the rest around 0, so that every weight matters."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            mean, std = spread(name)
            r = std * torch.randn(p.shape, generator=generator, dtype=torch.float32)
            p.copy_(mean + r if mean else r)


def family_setup(default_seed):
    """The command line of every family reference (--oracle, --out, --seed): parses it and puts
    the shared oracle on the path; returns (args, ref_llama, st_np)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser()
    ap.add_argument("--oracle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=default_seed)
    args = ap.parse_args()
    sys.path.insert(0, args.oracle)
    import ref_llama
    import st_np
    return args, ref_llama, st_np


def write_family_fixture(model, config, out, generator, st_np, to_file=lambda tensors: tensors):
    """Writes a family's fixture: OUT/config.json, OUT/model.safetensors (the float32 weights,
    through `to_file`: the family's names and layout), and, with the model in float64, the
    logits, HF causal-LM loss and every gradient (through `to_file` too) of a [2, 8] token batch
    drawn from `generator`: OUT/oracle/tokens.npy, logits.npy, loss.json, grads.safetensors.
    Returns (the float64 model, tokens, logits) for a family's further checks."""
    import json
    import os

    import numpy as np

    os.makedirs(os.path.join(out, "oracle"), exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    st_np.save_file(to_file(state), os.path.join(out, "model.safetensors"))

    # The reference runs in float64 on the float32 weights as saved.
    model = model.double()
    tokens = torch.randint(0, config["vocab_size"], (2, 8), generator=generator)
    logits = model(tokens)
    shift = logits[:, :-1].reshape(-1, config["vocab_size"])
    loss = nn.functional.cross_entropy(shift, tokens[:, 1:].reshape(-1))
    loss.backward()
    np.save(os.path.join(out, "oracle", "tokens.npy"), tokens.numpy().astype(np.int64))
    np.save(os.path.join(out, "oracle", "logits.npy"), logits.detach().numpy().astype(np.float32))
    with open(os.path.join(out, "oracle", "loss.json"), "w") as f:
        json.dump({"loss": loss.item(), "n_target_tokens": int(tokens[:, 1:].numel())}, f, indent=2)
    grads = {k: p.grad.numpy().astype(np.float32) for k, p in model.named_parameters()}
    st_np.save_file(to_file(grads), os.path.join(out, "oracle", "grads.safetensors"))
    print("wrote", out, "loss", loss.item())
    return model, tokens, logits
