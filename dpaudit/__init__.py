"""dpaudit: train, attack and audit differentially private machine learning models."""

__version__ = "0.1.0"
