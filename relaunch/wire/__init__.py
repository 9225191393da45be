"""The wire: commands as data, and how they reach a host (a local shell, or SSH through jump hosts and a container). Builders are pure; a transport is the one place that executes."""
