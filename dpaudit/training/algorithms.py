"""Import every trainer module so that each registers its algorithm name."""

from dpaudit.training import dpsgd, nonprivate  # noqa: F401
