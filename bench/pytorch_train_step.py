#!/usr/bin/python3
# PyTorch training step (forward + backward, f32) on the same shapes as `edl bench train`, with
# the PyTorch reference Llama of the oracle. Usage (Debian python3-torch):
#   ORACLE=../shared/oracle /usr/bin/python3 bench/pytorch_train_step.py tiny 8 256 2 [MODE]
# MODE: f32 (default); checkpoint: every decoder layer under torch.utils.checkpoint (HF's
# gradient_checkpointing=True, edl's nothing_saveable per layer); bf16: torch.autocast("cpu",
# bfloat16) around the forward (PyTorch's CPU mixed precision: f32 weights, bf16 matmuls).
import sys, time, torch, torch.nn.functional as F
import os
sys.path.insert(0, os.environ.get('ORACLE', '../shared/oracle'))  # the PyTorch oracle (shared/oracle)
import make_models, ref_llama
name, B, S, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mode = sys.argv[5] if len(sys.argv) > 5 else "f32"
assert mode in ("f32", "checkpoint", "bf16"), "MODE must be f32, checkpoint or bf16, found " + mode
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = make_models.hf_config(name)
m = ref_llama.LlamaForCausalLM(cfg).float()
ids = torch.randint(0, cfg["vocab_size"], (B, S))
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
step()
ts = []
for _ in range(2):
    t = time.time(); step(); ts.append(time.time() - t)
t = sorted(ts)[0]
import resource
print('{"impl":"pytorch","mode":"%s","config":"%s","threads":%d,"tokens_per_s":%.1f,"ms_per_step":%.0f,"peak_rss_bytes":%d}' % (mode, name, threads, B*S/t, t*1000, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024))
