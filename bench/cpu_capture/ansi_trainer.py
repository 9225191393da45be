"""Training loop that logs through a colour console and dies with a real torch error, drawn in colour.

rich is what many trainers log with; its Console is forced to colour here as it is under CI runners,
`script`, or FORCE_COLOR, so the saved log keeps the escape codes a terminal would have interpreted.
"""
import contextlib
import io

import torch
from rich.console import Console
from rich.traceback import install

from _steps import step_line

out = Console(force_terminal=True, color_system="256", width=240, soft_wrap=True)
install(console=Console(stderr=True, force_terminal=True, color_system="256", width=120), show_locals=False)


def log_step(step: int) -> None:
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        step_line(step, seed=5)
    out.print(text.getvalue().rstrip())  # rich highlights numbers, lists and `key=` in colour


model = torch.nn.Linear(64, 10)
for step in range(615, 621):
    log_step(step)
    model(torch.randn(8, 64)).sum().backward()
# A batch from a reshaped shard: the width no longer matches the layer.
model(torch.randn(8, 32))
