"""Helpers the tests, bench, scripts and the multi-node demo share: real targets (a git repo, a lock of tiny wheels,
a bash trainer; targets), faults injected for real and the fault matrix's registry (faults), sshd on loopback with
the fake `pct` and `docker` in bin/ (sshd), hosts in network namespaces of their own (netns), and the multi-rank
trainer's helpers (multirank). Shipped in the package, as Prefect ships `prefect.testing`, so that nothing outside
tests/ imports tests; it needs pytest where it is imported (sshd skips or fails a test that cannot run here).
"""
