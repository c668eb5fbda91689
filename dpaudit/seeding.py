"""Seeds for the frameworks a training pipeline uses, derived from one integer.

A plug-in trainer (:mod:`dpaudit.plugins`) receives one ``seed: int`` per run from dpaudit and must
turn it into every random choice of that run — initialisation, batch sampling, noise. These helpers
make that one line per framework::

    from dpaudit.seeding import jax_key, numpy_rng, seed_torch, torch_generator

    def train(X, y, seed):
        init = torch_generator(seed, stream=0)      # model initialisation
        batches = torch_generator(seed, stream=1)   # Poisson sampling
        noise = torch_generator(seed, stream=2)     # Gaussian noise
        ...

Derivation: each value is drawn from ``np.random.SeedSequence(seed, spawn_key=(tag, stream))``, where
``tag`` names the framework. This is how numpy itself makes independent child streams
(``SeedSequence.spawn`` sets exactly such spawn keys; numpy docs, "Parallel random number
generation"): SeedSequence hashes its entropy and spawn key (after M. O'Neill's seed_seq design for
PCG) so that distinct (seed, tag, stream) triples give unrelated states — distinct seeds, or distinct
streams of one seed, give independent streams with overwhelming probability — while the same triple
always gives the same stream.

Seeds and streams are integers in [0, 2**63 - 1] (:func:`dpaudit.validation.check_seed`, dpaudit's one seed
rule, with the range of the seeds dpaudit derives, so an output of :func:`derive_seed` may be passed back);
:class:`~dpaudit.errors.InputError` otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dpaudit.errors import InputError
from dpaudit.validation import MAX_DERIVED_SEED, check_seed

if TYPE_CHECKING:
    import torch

# Domain-separation tags (arbitrary constants): numpy_rng(s), derive_seed(s) (hence torch) and jax_key(s) draw
# from different SeedSequence children, so code mixing frameworks never reuses one stream twice.
_NUMPY, _INT, _JAX = 0x6E70, 0x696E, 0x6A78

__all__ = ["derive_seed", "jax_key", "numpy_rng", "seed_torch", "torch_generator"]


def _sequence(seed: int, tag: int, stream: int) -> np.random.SeedSequence:
    # The one seed rule, with the range of seeds dpaudit derives (a derive_seed output may come back here).
    seed = check_seed(limit=MAX_DERIVED_SEED, seed=seed)
    return np.random.SeedSequence(seed, spawn_key=(tag, check_seed(limit=MAX_DERIVED_SEED, stream=stream)))


def derive_seed(seed: int, *, stream: int = 0, bits: int = 63) -> int:
    """A ``bits``-bit non-negative integer derived from ``(seed, stream)`` (for libraries that take an int).

    ``bits`` in [1, 64]; 63 (default) fits a signed 64-bit integer, 31 a signed 32-bit one.
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 64:
        raise InputError(f"expected bits in [1, 64], got {bits!r}")
    word = int(_sequence(seed, _INT, stream).generate_state(1, np.uint64)[0])
    return word >> (64 - bits)


def numpy_rng(seed: int, *, stream: int = 0) -> np.random.Generator:
    """A ``np.random.Generator`` (PCG64) for ``(seed, stream)``."""
    return np.random.default_rng(_sequence(seed, _NUMPY, stream))


def torch_generator(seed: int, *, stream: int = 0, device: str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded from ``(seed, stream)``; pass it to ``torch.randn(...,
    generator=g)``, a ``DataLoader(generator=g)`` or Opacus' ``make_private(noise_generator=g)``."""
    import torch

    seed = derive_seed(seed, stream=stream)  # 63 bits: torch accepts any int64
    try:  # "gpu", or "cuda" on a machine without one: one line naming the device, not torch's paragraph
        kind = "cpu" if device is None else torch.device(device).type  # None: torch's default, the CPU
    except (RuntimeError, TypeError):
        raise InputError(f"torch_generator: expected a torch device such as 'cpu' or 'cuda', got {device!r}") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise InputError(f"torch_generator: device {str(device)!r} requested but no CUDA device is available")
    return torch.Generator(device=device).manual_seed(seed)


def seed_torch(seed: int, *, stream: int = 0) -> int:
    """Seed torch's global generator (``torch.manual_seed``) from ``(seed, stream)``, for code that draws
    from the default generator (e.g. ``nn.Linear``'s initialisation); returns the derived seed.

    Prefer :func:`torch_generator` where the code accepts a generator: the global one is shared by
    everything in the process."""
    import torch

    derived = derive_seed(seed, stream=stream)
    torch.manual_seed(derived)
    return derived


def jax_key(seed: int, *, stream: int = 0):
    """A JAX PRNG key (``jax.random.PRNGKey``) for ``(seed, stream)``; JAX is imported only here.

    The derived seed has 31 bits, which ``PRNGKey`` accepts whether or not 64-bit mode is enabled.
    """
    derived = int(_sequence(seed, _JAX, stream).generate_state(1, np.uint32)[0]) >> 1
    try:
        import jax
    except ImportError:
        raise InputError("jax_key needs JAX: pip install jax (or dpaudit[jax])") from None
    return jax.random.PRNGKey(derived)
