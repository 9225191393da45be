"""tinyjunk 0.1.0: a package nobody asked for, installed into the training venv by hand."""

__version__ = "0.1.0"
