"""A training run that ends as it should (exit 0) while something beside it raised as it ended: a background uploader
thread, or a child process that exports the last metrics. Python prints their tracebacks, and the trainer's own exit is 0.

Usage: python -u background_failure_trainer.py thread|process
"""

import multiprocessing
import sys
import threading
import time

from _steps import step_line


def upload(path: str) -> None:
    with open(path) as f:  # the metrics file was never written: the upload fails, the run does not
        f.read()


mode = sys.argv[1]
for step in range(7000, 7006):
    step_line(step, seed=48)
    time.sleep(0.05)
if mode == "thread":
    worker = threading.Thread(target=upload, args=("/nonexistent/metrics.jsonl",), name="uploader")
else:
    worker = multiprocessing.Process(target=upload, args=("/nonexistent/metrics.jsonl",), name="exporter")
worker.start()
worker.join()
