"""relaunch: bring a dead or sick training run back to health, and say why it died."""

__version__ = "0.1.0"
