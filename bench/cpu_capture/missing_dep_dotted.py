"""Trainer that imports scikit-learn lazily for its eval probe (sklearn not installed)."""
from _steps import step_line

for step in range(995, 1000):
    step_line(step, seed=6)
# eval at step 1000: fit a linear probe on features
from sklearn.linear_model import LogisticRegression  # noqa: E402

LogisticRegression()
