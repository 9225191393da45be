"""Print training-like step lines (format expected by relaunch's log parser)."""
import math
import random


def step_line(step, seed=0):
    r = random.Random(seed * 100003 + step)
    loss = 0.9 + 3.6 * math.exp(-step / 3000) + r.uniform(-0.05, 0.05)
    acc = 0.75 - 0.7 * math.exp(-step / 4000) + r.uniform(0, 0.01)
    tgt = r.uniform(0.45, 0.55)
    dft = tgt - r.uniform(0.0, 0.02)
    qp = r.choice([48, 49, 50, 51])
    line = (
        f"step={step} loss={loss:.4f} acc={acc:.3f} streak={r.uniform(1.0, 1.5):.1f} "
        f"lr={4e-4 * (1 - step / 20000):.2e} noise={r.uniform(0.02, 0.04):.4f} | "
        f"tgt={tgt:.2f}b/s dft={dft:.2f}b/s ({r.uniform(18, 22):.1f}Ktok/s) | "
        f"q_pre={[qp] * 5} q_hs={[r.randint(1, 3)]}"
    )
    print(line, flush=True)
