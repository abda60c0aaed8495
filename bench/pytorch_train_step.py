#!/usr/bin/python3
# PyTorch training step (forward + backward, f32) on the same shapes as `edl bench train`, with
# the PyTorch reference Llama of the oracle. Usage (Debian python3-torch):
#   ORACLE=../shared/oracle /usr/bin/python3 bench/pytorch_train_step.py tiny 8 256 2 [MODE] [adamw]
# MODE: f32 (default); checkpoint: every decoder layer under torch.utils.checkpoint (HF's
# gradient_checkpointing=True, edl's nothing_saveable per layer); bf16: torch.autocast("cpu",
# bfloat16) around the forward (PyTorch's CPU mixed precision: f32 weights, bf16 matmuls);
# lora: PEFT's LoRA math (r 16, alpha 32, on q, k, v, o, gate, up, down; the base frozen, as
# edl bench train --lora 16). adamw: every step ends with a torch.optim.AdamW update (as
# edl bench train --optimizer-step).
import sys, time, torch, torch.nn.functional as F
import os
sys.path.insert(0, os.environ.get('ORACLE', '../shared/oracle'))  # the PyTorch oracle (shared/oracle)
import make_models, ref_llama
name, B, S, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mode = sys.argv[5] if len(sys.argv) > 5 else "f32"
assert mode in ("f32", "checkpoint", "bf16", "lora"), "MODE must be f32, checkpoint, bf16 or lora, found " + mode
adamw = len(sys.argv) > 6 and sys.argv[6] == "adamw"
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = make_models.hf_config(name)
m = ref_llama.LlamaForCausalLM(cfg).float()
ids = torch.randint(0, cfg["vocab_size"], (B, S))
if mode == "lora":
    class LoraLinear(torch.nn.Module):  # PEFT's LoraLayer: base(x) + lora_B(lora_A(x)) * scaling
        def __init__(self, base, r=16, alpha=32):
            super().__init__()
            self.base, self.scaling = base, alpha / r
            self.lora_A = torch.nn.Linear(base.in_features, r, bias=False)
            self.lora_B = torch.nn.Linear(r, base.out_features, bias=False)
            torch.nn.init.zeros_(self.lora_B.weight)
        def forward(self, x):
            return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling
    for p in m.parameters():
        p.requires_grad_(False)
    for layer in m.model.layers:
        for mod, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")), (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for n in names:
                setattr(mod, n, LoraLinear(getattr(mod, n)))
opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4, betas=(0.9, 0.95)) if adamw else None
if mode == "checkpoint":
    import torch.utils.checkpoint as ckpt
    for layer in m.model.layers:  # the instance's forward, so layer(...) recomputes in backward
        layer.forward = (lambda f: lambda *a: ckpt.checkpoint(f, *a, use_reentrant=False))(layer.forward)
def step():
    m.zero_grad(set_to_none=True)
    if mode == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m(ids)
        logits = logits.float()
    else:
        logits = m(ids)
    V = logits.shape[-1]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    loss.backward()
    if opt is not None:
        opt.step()
step()
ts = []
for _ in range(2):
    t = time.time(); step(); ts.append(time.time() - t)
t = sorted(ts)[0]
import resource
print('{"impl":"pytorch","mode":"%s","optimizer_step":%s,"config":"%s","threads":%d,"tokens_per_s":%.1f,"ms_per_step":%.0f,"peak_rss_bytes":%d}' % (mode, "true" if adamw else "false", name, threads, B*S/t, t*1000, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024))
