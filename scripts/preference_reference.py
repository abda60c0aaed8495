"""A PyTorch reference for the preference losses (DPO's sigmoid and IPO losses as TRL's
DPOTrainer computes them, ORPO's as TRL's ORPOTrainer does), beside the shared Llama oracle.

The policy is the tiny_hf fixture; the reference model is the same model with every weight moved
by a little noise (written beside, so edl can load it). Three (chosen, rejected) pairs of 8
tokens share their prompts (3, 4 and 5 tokens); the labels are -100 on the prompts. In float64,
per loss: the loss, the rewards' means and d loss / d every policy parameter:
    OUT/reference/config.json, OUT/reference/model.safetensors
    OUT/tokens.npy, OUT/labels.npy               int64 [6, 8]: rows 2i (chosen), 2i + 1 (rejected)
    OUT/{dpo_sigmoid,ipo,orpo}.json              loss, rewards/chosen, rewards/rejected, ...
    OUT/{dpo_sigmoid,ipo,orpo}_grads.safetensors the policy's gradients (HF names)

    /usr/bin/python3 scripts/preference_reference.py --oracle ../shared/oracle \\
        --model tests/data/tiny_hf --out tests/data/preference
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--oracle", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--seed", type=int, default=21)
args = ap.parse_args()
sys.path.insert(0, args.oracle)
import st_np  # noqa: E402
from ref_llama import LlamaForCausalLM  # noqa: E402

g = torch.Generator().manual_seed(args.seed)
os.makedirs(os.path.join(args.out, "reference"), exist_ok=True)
weights = st_np.load_file(os.path.join(args.model, "model.safetensors"))
moved = {k: (v + 0.05 * torch.randn(v.shape, generator=g, dtype=torch.float64).numpy()).astype(np.float32)
         for k, v in weights.items()}
st_np.save_file(moved, os.path.join(args.out, "reference", "model.safetensors"))
shutil.copy(os.path.join(args.model, "config.json"), os.path.join(args.out, "reference", "config.json"))

vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
rows, labels = [], []
for i, prompt in enumerate([3, 4, 5]):
    head = torch.randint(0, vocab, (prompt,), generator=g)
    for _ in range(2):  # chosen, rejected: the same prompt, different completions
        ids = torch.cat([head, torch.randint(0, vocab, (8 - prompt,), generator=g)])
        rows.append(ids)
        lab = ids.clone()
        lab[:prompt] = -100
        labels.append(lab)
tokens, labels = torch.stack(rows), torch.stack(labels)
np.save(os.path.join(args.out, "tokens.npy"), tokens.numpy().astype(np.int64))
np.save(os.path.join(args.out, "labels.npy"), labels.numpy().astype(np.int64))


def row_logps(model):
    """Per row: the sum of log p over its scored targets (the HF shift), and their count."""
    logp = F.log_softmax(model(tokens)[:, :-1], dim=-1)
    tgt = labels[:, 1:]
    mask = tgt != -100
    picked = logp.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    return picked.sum(-1), mask.sum(-1)


reference = LlamaForCausalLM.from_pretrained(os.path.join(args.out, "reference"), dtype=torch.float64)
with torch.no_grad():
    ref_sum, _ = row_logps(reference)


def run(name, beta, kind, eps=0.0):
    policy = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float64)
    pol_sum, count = row_logps(policy)
    pc, pr, rc, rr = pol_sum[0::2], pol_sum[1::2], ref_sum[0::2], ref_sum[1::2]
    if kind == "orpo":  # TRL's ORPOTrainer: token-averaged log p, NLL of the chosen completions
        a, b = pc / count[0::2], pr / count[1::2]
        log_odds = (a - b) - (torch.log1p(-torch.exp(a)) - torch.log1p(-torch.exp(b)))
        nll = -pc.sum() / count[0::2].sum()
        loss = nll - beta * F.logsigmoid(log_odds).mean()
        chosen, rejected = beta * a, beta * b
        extra = {"nll_loss": nll.item(), "log_odds_ratio": F.logsigmoid(log_odds).mean().item(),
                 "log_odds_chosen": log_odds.mean().item()}
    else:
        if kind == "ipo":  # IPO on token-averaged log p (TRL averages them before the loss and the rewards)
            cc, cr = count[0::2], count[1::2]
            pc, rc, pr, rr = pc / cc, rc / cc, pr / cr, rr / cr
            h = (pc - rc) - (pr - rr)
            losses = (h - 1 / (2 * beta)) ** 2
        else:
            h = (pc - rc) - (pr - rr)
            losses = -(1 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)
        loss = losses.mean()
        chosen, rejected = beta * (pc - rc), beta * (pr - rr)
        extra = {}
    loss.backward()
    out = {"loss": loss.item(), "beta": beta, "label_smoothing": eps,
           "rewards/chosen": chosen.mean().item(), "rewards/rejected": rejected.mean().item(),
           "rewards/margins": (chosen - rejected).mean().item(),
           "rewards/accuracies": (chosen > rejected).double().mean().item(), **extra}
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(out, f, indent=2)
    st_np.save_file({k: p.grad.numpy().astype(np.float32) for k, p in policy.named_parameters()},
                    os.path.join(args.out, name + "_grads.safetensors"))
    print(name, out)


run("dpo_sigmoid", 0.3, "sigmoid", eps=0.1)
run("ipo", 0.3, "ipo")
run("orpo", 0.25, "orpo")
