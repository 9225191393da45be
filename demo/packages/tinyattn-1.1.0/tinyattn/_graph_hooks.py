"""tinyattn 1.1.0's drift: graph hooks registered by FX-tracing in a background thread.

Imported by tinyattn on import, so it starts with the trainer. While a thread FX-traces, FX's global patches catch other threads' module calls and torch.compile refuses
to run: the race of the incident, which pinning the known-good release removes.
"""

import threading
import time

import torch


def _register_graph_hooks() -> None:
    # Many submodules: tracing them keeps FX's global patches in place most of the time.
    probe = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(64)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        torch.fx.symbolic_trace(probe)


threading.Thread(target=_register_graph_hooks, daemon=True, name="tinyattn-graph-hooks").start()
