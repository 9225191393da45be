"""FX tracing race: one thread loops torch.fx.symbolic_trace on a small module
while worker threads call a torch.compile'd flex_attention (fwd+bwd) on cuda.
torch.fx's 'is tracing' flag is process-global, so the compiled calls in the
other threads can see it set. Worker exceptions are re-raised in main."""
import threading
import time

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import flex_attention

from _steps import step_line

B, H, S, D = 4, 16, 4096, 64
N_WORKERS, ITERS = 3, 400


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(24))

    def forward(self, x):
        for l in self.layers:
            x = torch.relu(l(x)) + x
        return x


def causal(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


attn = torch.compile(flex_attention)


def make():
    return [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]


def train_step(q, k, v):
    out = attn(q, k, v, score_mod=causal)
    loss = out.float().pow(2).mean()
    loss.backward()
    q.grad = k.grad = v.grad = None
    return loss


# warm-up (compiles) in the main thread, logged like a trainer
qkv = make()
for step in range(1200, 1203):
    t0 = time.perf_counter()
    loss = train_step(*qkv)
    torch.cuda.synchronize()
    step_line(step, loss.item(), B * S / (time.perf_counter() - t0), seed=7)

stop = threading.Event()
errors = []


def worker(wid):
    try:
        qkv = make()
        for i in range(ITERS):
            if stop.is_set():
                return
            t0 = time.perf_counter()
            loss = train_step(*qkv)
            if i % 50 == 0:
                torch.cuda.synchronize()
                step_line(1203 + i, loss.item(), B * S / (time.perf_counter() - t0), seed=wid)
    except BaseException as e:
        errors.append(e)
        stop.set()


def tracer():
    while not stop.is_set():
        torch.fx.symbolic_trace(Small())


tt = threading.Thread(target=tracer, name="fx-tracer")
ws = [threading.Thread(target=worker, args=(i,), name=f"attn-worker-{i}") for i in range(N_WORKERS)]
tt.start()
for w in ws:
    w.start()
for w in ws:
    w.join()
stop.set()
tt.join()
if errors:
    raise errors[0]
print("no race hit", flush=True)
