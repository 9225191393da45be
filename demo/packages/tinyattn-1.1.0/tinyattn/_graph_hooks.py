"""tinyattn 1.1.0's drift: graph hooks registered by FX-tracing in a background thread.

Imported by tinyattn on import, so it starts with the trainer. While a thread FX-traces, FX's global patches catch
other threads' module calls and torch.compile refuses to run: the race of the incident, which pinning the
known-good release removes.

The incident's race struck when the timing was bad; the demo's strikes every time: its hook's trace stays open for
the life of the process, and the import returns only once the trace is open. (A loop of short traces held the
patches "most of the time" and, on a host whose every core was busy, let a trainer train on: a demo whose
broken run does not break proves nothing.)
"""

import threading

import torch

_tracing = threading.Event()
_never = threading.Event()


class _Hooks(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Runs inside symbolic_trace: FX's global flag and Module.__call__ patch are in place until this returns.
        _tracing.set()
        _never.wait()
        return x


def _register_graph_hooks() -> None:
    torch.fx.symbolic_trace(_Hooks())


threading.Thread(target=_register_graph_hooks, daemon=True, name="tinyattn-graph-hooks").start()
_tracing.wait(timeout=60)
