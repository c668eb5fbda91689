"""Bring your own model and data: a residual CNN with GroupNorm on CIFAR-10-shaped data (README.md)."""
