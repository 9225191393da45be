"""Training-style step lines in the format relaunch's log parser expects.

The loss and tok/s values are passed in by the caller (measured); the other
fields are deterministic filler so the lines look like a real trainer's.
"""
import random


def step_line(step, loss, tok_per_s, seed=0, prefix=""):
    r = random.Random(seed * 100003 + step)
    acc = min(0.99, 0.02 + step * 0.00013 + r.uniform(0, 0.01))
    tgt = r.uniform(0.45, 0.55)
    dft = tgt - r.uniform(0.0, 0.02)
    qp = r.choice([48, 49, 50, 51])
    line = (
        f"{prefix}step={step} loss={loss:.4f} acc={acc:.3f} streak={r.uniform(1.0, 1.5):.1f} "
        f"lr={4e-4 * (1 - step / 20000):.2e} noise={r.uniform(0.02, 0.04):.4f} | "
        f"tgt={tgt:.2f}b/s dft={dft:.2f}b/s ({tok_per_s / 1000:.1f}Ktok/s) | "
        f"q_pre={[qp] * 5} q_hs={[r.randint(1, 3)]}"
    )
    print(line, flush=True)
