"""Import every trainer module so that each registers its algorithm name."""

from dpaudit.training import convex, dpagd, dpsgd, jl, nonprivate  # noqa: F401
