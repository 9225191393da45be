"""A few normal CUDA training steps, then a hand-written Triton scatter kernel stores through a
corrupt index (2**40 elements past its buffer): a real `an illegal memory access was encountered`.

The write lands far outside any allocation, so only this process's CUDA context is lost.
Usage: python3 -u illegal_access.py"""
import time

import torch
import triton
import triton.language as tl

from _steps import step_line


@triton.jit
def scatter_rows(out_ptr, src_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    idx = tl.load(idx_ptr + offs, mask=mask, other=0)  # int64, trusted: no bounds check
    tl.store(out_ptr + idx, tl.load(src_ptr + offs, mask=mask, other=0.0), mask=mask)


def scatter(out, src, idx):
    n = src.numel()
    scatter_rows[(triton.cdiv(n, 1024),)](out, src, idx, n, BLOCK=1024)


torch.manual_seed(0)
N = 1 << 20
w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
opt = torch.optim.SGD([w], lr=1e-3)
print(f"loading model: custom scatter kernel (triton {triton.__version__}) on cuda", flush=True)
for step in range(4410, 4416):
    t0 = time.perf_counter()
    x = torch.randn(4096, 1024, device="cuda")
    loss = (x @ w).tanh().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    src = torch.randn(N, device="cuda")
    idx = torch.randperm(N, device="cuda")
    if step == 4415:
        idx[12345] = 1 << 40  # a corrupt index
    buf = torch.empty(N, device="cuda")
    scatter(buf, src, idx)
    torch.cuda.synchronize()
    step_line(step, loss.item(), 4096 / (time.perf_counter() - t0), seed=9)
