"""Training loop whose progress is a tqdm bar, redrawn in place with `\r` as tqdm always does.

Saved to a file, the redraws never end a line: every step lands on one ever-growing line, with the
bar's postfix carrying the step line. Every 50 steps an eval line is printed through tqdm.write, which
clears the bar, prints the line with a newline and draws the bar again.
Usage: python -u progress_trainer.py TOTAL_STEPS   (the capture stops it part-way, as a poll would find it)
"""
import contextlib
import io
import sys
import time

import torch
from tqdm import tqdm

from _steps import step_line


def step_text(step: int) -> str:
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        step_line(step, seed=7)
    return text.getvalue().rstrip()


total = int(sys.argv[1])
model = torch.nn.Linear(64, 10)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
bar = tqdm(total=total, desc="train", mininterval=0, miniters=1)
for step in range(1, total + 1):
    loss = model(torch.randn(8, 64)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)  # the real step time of a bigger model
    bar.set_postfix_str(step_text(step), refresh=False)
    bar.update(1)
    if step % 50 == 0:
        tqdm.write(f"eval step={step} val_loss={loss.item():.4f}")
bar.close()
