"""The embedded demo: a small real trainer, the faults it can suffer, and a target built around it."""
