"""Training-like loop that switches to a torch.compile'd step after a few eager steps."""
import torch
from _steps import step_line

torch.manual_seed(0)
w = torch.randn(64, 64, requires_grad=True)


def loss_fn(x):
    return torch.nn.functional.gelu(x @ w).pow(2).mean()


compiled = torch.compile(loss_fn)
for step in range(1200, 1204):
    loss_fn(torch.randn(8, 64)).backward()
    step_line(step, seed=2)
for step in range(1204, 1300):
    compiled(torch.randn(8, 64)).backward()  # first call compiles C++ via inductor
    step_line(step, seed=2)
