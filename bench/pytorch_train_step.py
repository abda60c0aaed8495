#!/usr/bin/python3
# PyTorch training step (forward + backward, f32) on the same shapes as `edl bench train`, with
# the PyTorch reference Llama of the oracle. Usage (Debian python3-torch):
#   ORACLE=../shared/oracle /usr/bin/python3 bench/pytorch_train_step.py tiny 8 256 2
import sys, time, torch, torch.nn.functional as F
import os
sys.path.insert(0, os.environ.get('ORACLE', '../shared/oracle'))  # the PyTorch oracle (shared/oracle)
import make_models, ref_llama
name, B, S, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = make_models.hf_config(name)
m = ref_llama.LlamaForCausalLM(cfg).float()
ids = torch.randint(0, cfg["vocab_size"], (B, S))
def step():
    m.zero_grad(set_to_none=True)
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
print('{"impl":"pytorch","config":"%s","threads":%d,"tokens_per_s":%.1f,"ms_per_step":%.0f,"peak_rss_bytes":%d}' % (name, threads, B*S/t, t*1000, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024))
