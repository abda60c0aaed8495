"""A PyTorch reference for LoRA adapters (PEFT's LoraLayer math), beside the shared Llama oracle.

Wraps the chosen nn.Linear modules of the oracle's Llama with
    y = base(x) + lora_B(lora_A(x)) * scaling,   scaling = lora_alpha / r  (rsLoRA: / sqrt(r))
in float64, with random A and B (B nonzero, so the adapter changes the logits), and writes
    OUT/adapter/adapter_config.json, OUT/adapter/adapter_model.safetensors   (PEFT's layout and names)
    OUT/logits.npy            [B, T, V] logits of tokens.npy with the adapter
    OUT/loss.json             HF causal-LM loss
    OUT/grads.safetensors     d loss / d lora_A, lora_B (PEFT names), float32
    OUT/merged_logits.npy     logits of the merged weights W + scaling * B @ A (must equal logits.npy)

Run with Debian's interpreter and the oracle folder:
    /usr/bin/python3 scripts/lora_reference.py --oracle ../shared/oracle --ckpt tests/data/tiny_hf \
        --tokens tests/data/tiny_hf/oracle/tokens.npy --out tests/data/tiny_hf/lora
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn


class LoraLinear(nn.Module):
    def __init__(self, base, r, alpha, rslora, gen):
        super().__init__()
        self.base = base
        self.scaling = alpha / math.sqrt(r) if rslora else alpha / r
        out_f, in_f = base.weight.shape
        bound = 1.0 / math.sqrt(in_f)
        self.lora_A = nn.Parameter((torch.rand(r, in_f, generator=gen, dtype=torch.float64) * 2 - 1) * bound)
        self.lora_B = nn.Parameter(torch.randn(out_f, r, generator=gen, dtype=torch.float64) * 0.2)

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T * self.scaling


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--oracle", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--r", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=8.0)
    ap.add_argument("--rslora", action="store_true")
    ap.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    sys.path.insert(0, a.oracle)
    import ref_llama
    import st_np
    from ref_dump import causal_lm_loss

    model = ref_llama.LlamaForCausalLM.from_pretrained(a.ckpt, dtype=torch.float64)
    for p in model.parameters():
        p.requires_grad_(False)
    targets = a.targets.split(",")
    gen = torch.Generator().manual_seed(a.seed)
    wrapped = {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child_name in targets:
                lora = LoraLinear(child, a.r, a.alpha, a.rslora, gen)
                setattr(module, child_name, lora)
                wrapped[(name + "." + child_name).lstrip(".")] = lora

    tokens = torch.from_numpy(np.load(a.tokens)).long()
    logits = model(tokens)
    loss = causal_lm_loss(logits, tokens)
    loss.backward()

    os.makedirs(os.path.join(a.out, "adapter"), exist_ok=True)
    adapter, grads = {}, {}
    for path, m in wrapped.items():
        for part in ("lora_A", "lora_B"):
            key = f"base_model.model.{path}.{part}.weight"
            p = getattr(m, part)
            adapter[key] = p.detach().numpy().astype(np.float32)
            grads[key] = p.grad.numpy().astype(np.float32)
    st_np.save_file(adapter, os.path.join(a.out, "adapter", "adapter_model.safetensors"), metadata={"format": "pt"})
    st_np.save_file(grads, os.path.join(a.out, "grads.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "tiny_hf", "r": a.r,
              "lora_alpha": a.alpha, "lora_dropout": 0.0, "target_modules": targets, "bias": "none",
              "use_rslora": a.rslora, "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None,
              "inference_mode": True}
    with open(os.path.join(a.out, "adapter", "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    np.save(os.path.join(a.out, "logits.npy"), logits.detach().numpy().astype(np.float32))
    with open(os.path.join(a.out, "loss.json"), "w") as f:
        json.dump({"loss": loss.item()}, f)

    # The adapter written to float32 above is what edl reads: recompute from those values for the merge check.
    with torch.no_grad():
        for path, m in wrapped.items():
            A = torch.from_numpy(adapter[f"base_model.model.{path}.lora_A.weight"]).double()
            B = torch.from_numpy(adapter[f"base_model.model.{path}.lora_B.weight"]).double()
            m.lora_A.copy_(A)
            m.lora_B.copy_(B)
        exact = model(tokens)
        for path, m in wrapped.items():
            m.base.weight += (m.lora_B @ m.lora_A) * m.scaling
            m.lora_B.zero_()
        merged = model(tokens)
    print("max |logits(adapter) - logits(merged)| =", (exact - merged).abs().max().item())
    np.save(os.path.join(a.out, "logits.npy"), exact.numpy().astype(np.float32))
    np.save(os.path.join(a.out, "merged_logits.npy"), merged.numpy().astype(np.float32))


if __name__ == "__main__":
    main()
