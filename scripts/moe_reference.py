"""A PyTorch reference for the sparse mixture-of-experts block (HF MixtralSparseMoeBlock, with
Qwen2-MoE's norm_topk_prob switch), beside the shared Llama oracle, and for the two router
losses: transformers' load_balancing_loss_func (one layer, no padding) and the router z-loss.

Writes OUT/<name>.safetensors for each case, in float64 from float32 weights:
    inputs   x [T, H], dy [T, H], aux_coef [1], z_coef [1]
    weights  gate.weight [E, H], experts.J.w1.weight [I, H], .w2 [H, I], .w3 [I, H]
    outputs  y [T, H], aux_loss [1], z_loss [1], and for L = sum(dy * y) + aux_coef * aux +
             z_coef * z: dx and grad.<weight name> for every weight
metadata: hidden, intermediate, num_experts, top_k, norm_topk_prob.

    /usr/bin/python3 scripts/moe_reference.py --oracle ../shared/oracle --out tests/data/tiny_moe
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--oracle", required=True)
ap.add_argument("--out", required=True)
args = ap.parse_args()
sys.path.insert(0, args.oracle)
import st_np  # noqa: E402


def case(name, seed, T, H, I, E, K, norm_topk_prob):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).float()
    w = {"gate.weight": r(E, H, scale=0.5)}
    for j in range(E):
        w[f"experts.{j}.w1.weight"] = r(I, H, scale=0.3)
        w[f"experts.{j}.w2.weight"] = r(H, I, scale=0.3)
        w[f"experts.{j}.w3.weight"] = r(I, H, scale=0.3)
    x, dy = r(T, H), r(T, H)
    aux_coef, z_coef = 0.02, 0.001
    p = {k: v.double().clone().requires_grad_(True) for k, v in w.items()}
    xx = x.double().clone().requires_grad_(True)
    # MixtralSparseMoeBlock.forward, in float64.
    logits = xx @ p["gate.weight"].T
    probs = F.softmax(logits, dim=-1)
    weights, selected = torch.topk(probs, K, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    y = torch.zeros_like(xx)
    for j in range(E):
        tok, slot = torch.where(selected == j)
        if tok.numel() == 0:
            continue
        h = xx[tok]
        out = (F.silu(h @ p[f"experts.{j}.w1.weight"].T) * (h @ p[f"experts.{j}.w3.weight"].T)) @ p[f"experts.{j}.w2.weight"].T
        y = y.index_add(0, tok, out * weights[tok, slot, None])
    # transformers' load_balancing_loss_func with one layer and no attention mask.
    expert_mask = F.one_hot(selected, E).double()
    tokens_per_expert = expert_mask.mean(dim=0)
    router_prob_per_expert = probs.mean(dim=0)
    aux = (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * E
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    loss = (dy.double() * y).sum() + aux_coef * aux + z_coef * z
    loss.backward()
    t = {"x": x, "dy": dy, "aux_coef": torch.tensor([aux_coef]).float(), "z_coef": torch.tensor([z_coef]).float()}
    t.update(w)
    t.update({"y": y.detach(), "aux_loss": aux.detach().reshape(1), "z_loss": z.detach().reshape(1), "dx": xx.grad})
    t.update({"grad." + k: v.grad for k, v in p.items()})
    # The selected experts must not sit on a tie or near one: the test's finite differences and
    # float32 routing must pick the same experts.
    top2 = torch.topk(probs, min(K + 1, E), dim=-1).values
    assert K == E or (top2[:, K - 1] - top2[:, K]).min() > 1e-4, "near tie in the routing; pick another seed"
    os.makedirs(args.out, exist_ok=True)
    st_np.save_file({k: v.detach().numpy().astype(np.float64) for k, v in t.items()}, os.path.join(args.out, name + ".safetensors"),
                    metadata={"hidden": str(H), "intermediate": str(I), "num_experts": str(E), "top_k": str(K),
                              "norm_topk_prob": str(norm_topk_prob).lower()})


case("mixtral", seed=3, T=12, H=16, I=24, E=4, K=2, norm_topk_prob=True)
case("qwen2_moe", seed=5, T=10, H=8, I=12, E=6, K=3, norm_topk_prob=False)
