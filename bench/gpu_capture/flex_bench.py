"""fwd+bwd flex_attention loop on cuda, eager (default) or torch.compile'd (--compile).
Prints step lines with the measured tokens/s over each logging window."""
import argparse
import json
import time

import torch
from torch.nn.attention.flex_attention import flex_attention

from _steps import step_line

p = argparse.ArgumentParser()
p.add_argument("--compile", action="store_true")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--log-every", type=int, default=1)
p.add_argument("--start-step", type=int, default=581)
p.add_argument("--B", type=int, default=4)
p.add_argument("--H", type=int, default=16)
p.add_argument("--S", type=int, default=4096)
p.add_argument("--D", type=int, default=64)
p.add_argument("--summary", default=None)
a = p.parse_args()


def causal(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


attn = torch.compile(flex_attention) if a.compile else flex_attention
torch.manual_seed(0)
shape = (a.B, a.H, a.S, a.D)
q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
target = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

rates = []
torch.cuda.synchronize()
t_last = time.perf_counter()
for i in range(a.steps):
    out = attn(q, k, v, score_mod=causal)
    loss = (out.float() - target.float()).pow(2).mean()
    loss.backward()
    q.grad = k.grad = v.grad = None
    if (i + 1) % a.log_every == 0:
        torch.cuda.synchronize()
        now = time.perf_counter()
        rate = a.B * a.S * a.log_every / (now - t_last)
        rates.append(rate)
        t_last = now
        step_line(a.start_step + i, loss.item(), rate, seed=5)

if a.summary:
    steady = sorted(rates[1:]) or rates
    with open(a.summary, "w") as f:
        json.dump({"compiled": a.compile, "shape_BHSD": list(shape), "steps": a.steps,
                   "log_every": a.log_every, "tok_per_s_per_window": rates,
                   "steady_median_tok_per_s": steady[len(steady) // 2]}, f, indent=1)
