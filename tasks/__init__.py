"""One module per recovery step. Each builds its commands in a pure `plan_*` function and runs them in a task."""
