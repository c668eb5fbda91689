"""Privacy loss distribution (PLD) accountant with pessimistic "connect-the-dots" discretisation.

For a pair of output distributions (P, Q) of neighbouring datasets the privacy loss is
L = log(dP/dQ)(o), o ~ P, and the tight (epsilon, delta) curve is the hockey-stick divergence
    delta(eps) = E_P[(1 - e^(eps - L))_+] + P(L = +inf)
(Sommer, Meiser & Mohammadi 2019, arXiv:1807.11136; Koskela, Jälkö & Honkela 2020,
arXiv:1906.03049). Adaptive composition of mechanisms with dominating pairs is dominated by the
product pair, whose privacy loss is the *sum* of the losses (Zhu, Dong & Wang 2022,
arXiv:2106.08567, Sec. 3 on dominating pairs), i.e. PMFs convolve.

Pessimism, step by step (every step can only increase delta(eps) for every eps):

1. Discretisation by connect-the-dots (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022,
   arXiv:2207.04380, Sec. 3): the P-mass of each loss interval [l_k, l_(k+1)] is split between
   its two end points so that both the P-mass and the Q-mass (= E_P[e^-L]) are preserved. With
   y = e^-L, delta(eps) = E[(1 - e^eps y)_+] + P(inf) is an expectation of a *convex* function of y,
   so this mean-preserving spread raises it (Jensen), also after composition with anything.
2. Mass below the grid is rounded up to the lowest grid point; mass above it goes to +inf.
3. Composition tails (Chernoff-bounded) above the FFT window go to +inf; below it, to the lowest
   bin; FFT wrap-around only *adds* (non-negative) mass inside the window.
4. Floating-point rounding of the FFTs (~count * u of the *peak* mass per bin, which in the far upper tail
   exceeds the true mass) is bounded, not estimated: every FFT composition carries a bound on the L2 norm of
   its rounding error (``pld_pairs._fft_power`` and ``_convolve``: Higham 2002, "Accuracy and Stability of
   Numerical Algorithms", Thm. 24.2 for the transforms, with a safety factor, ``FFT_LEVEL_ERROR``; Lemma 3.5
   for the products; Young's inequality through later compositions), and ``delta(eps)`` adds
   ||e||_2 ||(1 - e^(eps - l))_+||_2 over the bins the error may occupy (Cauchy-Schwarz). The forward
   transforms of a self-composition and the dominant bins of its power run in long double; below delta 1e-8
   every transform does (:data:`LONG_INVERSE_BELOW_DELTA`), which keeps the charge small down to delta 1e-12.
Until 2026-11-27 that rounding was not charged, a known under-report at small delta (found by
benchmarks/accounting_fuzz.py: 253 Gaussian steps gave eps 3e-7 relative below exact at delta 1e-9, 1.2e-4 at
1e-12). Validated against exact oracles down to delta 1e-12 (tests/accounting/test_oracles.py,
test_pld_rounding.py); below it ``epsilon`` warns (:data:`SMALL_DELTA_WARNING`).

Add/remove neighbours need both orderings of the pair; the accountant composes the "remove"
pairs and the "add" pairs separately and reports the worse (as dp_accounting does).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import threading
import warnings

import numpy as np

from dpaudit.accounting.base import (
    Accountant,
    effective_gaussian_noise_multiplier,
    replace_factor,
    unsupported,
)
from dpaudit.accounting.pld_pairs import (
    AtomPair,
    DiscretePLD,
    GaussianPair,
    LaplacePair,
    LossPair,
    SubsampledGaussianAdd,
    SubsampledGaussianRemove,
    epsilon_delta_pair,
    gaussian_or_trivial_pair,
    non_private_pair,
    randomized_response_pair,
    subsampled_non_private_pairs,
)
from dpaudit.budget import Cost, check_cost
from dpaudit.events import (
    EpsilonDelta,
    Event,
    FixedSizeSampled,
    Gaussian,
    GNMax,
    JLGaussian,
    Laplace,
    LNMax,
    PoissonSampled,
    RandomizedResponse,
)
from dpaudit.validation import check_in_interval, check_non_negative, check_positive, check_positive_int

# --------------------------------------------------------------------------------------------
# Accountant
# --------------------------------------------------------------------------------------------


class PldAccountant(Accountant):
    """Privacy-loss-distribution accountant (pessimistic; see module docstring).

    ``value_discretization_interval``: grid step in nats (default 1e-4, as dp_accounting); it is
    enlarged automatically when a mechanism's loss range would need more than ``max_bins`` grid
    points. ``tail_mass_truncation``: mass allowed outside FFT windows per composition (default
    1e-15). ``max_loss``: losses beyond +-max_loss nats are treated as +inf / rounded up.

    DP-SGD-JL (JLGaussian leaves) has a heavy-tailed per-step loss (seed paper Prop. B.5; see
    :mod:`dpaudit.accounting.jl`), so its loss cap is chosen *per query* instead: for epsilon(delta)
    it starts at ``jl_initial_cap`` nats and is raised until it lies at least ``JL_CAP_MARGIN`` nats
    above the certified epsilon; for delta(eps) it is max(jl_initial_cap, eps + JL_CAP_MARGIN). The
    loss mass above the cap is sent to +inf (charged to delta in full); with the cap that far above
    eps this over-charges delta by at most e^-JL_CAP_MARGIN times the charged mass (the true term
    is E[1 - e^(eps - L - S)] >= 1 - e^(eps - cap) E_P[e^-S], E_P[e^-S] <= 1). Every cap gives a
    valid bound. ``jl_bins``: Z_r bins per e-fold of z (relative z error e^(1/jl_bins) - 1). A JL ledger's
    epsilon(delta) takes seconds and is remembered in the process (:data:`JL_EPSILONS`, keyed exactly by the class,
    every option, the ledger and delta), so a repeated query returns the same number at once.

    Supported leaves: Gaussian, GNMax, Laplace, LNMax, EpsilonDelta, RandomizedResponse
    (replace-one), JLGaussian (add/remove), PoissonSampled(Gaussian composition | JLGaussian)
    (add/remove). FixedSizeSampled is not (use rdp).
    """

    name = "pld"

    def __init__(
        self,
        *,
        neighbouring: str = "add_remove",
        value_discretization_interval: float = 1e-4,
        tail_mass_truncation: float = 1e-15,
        max_loss: float = 1000.0,
        max_bins: int = 2_000_000,
        jl_bins: int = 400,
        jl_initial_cap: float = 200.0,
    ) -> None:
        super().__init__(neighbouring=neighbouring)
        self.interval = check_positive(value_discretization_interval=value_discretization_interval)
        self.tail = check_in_interval(0.0, 1e-3, tail_mass_truncation=tail_mass_truncation)
        self.max_loss = check_positive(max_loss=max_loss)
        self.max_bins = check_positive_int(max_bins=max_bins)
        self.jl_bins = check_positive_int(jl_bins=jl_bins)
        self.jl_initial_cap = check_positive(jl_initial_cap=jl_initial_cap)
        self._counts: dict[Event, int] = {}
        self._cache: dict[tuple[float, bool], tuple[DiscretePLD, DiscretePLD | None]] = {}
        # (event, direction, jl cap, interval, max loss) -> its discretised one-step PMF, shared by the float64 and
        # long-double compositions (and by JL caps where the event is not JL)
        self._steps: dict[tuple, DiscretePLD] = {}
        self._grid_steps: dict[float, list[float]] = {}  # JL cap -> _grids(cap), until the ledger changes

    # -- leaves ------------------------------------------------------------------------------

    def _leaf(self, event: Event) -> Event:
        if isinstance(event, Gaussian | GNMax | Laplace | LNMax | EpsilonDelta):
            return event
        if isinstance(event, RandomizedResponse):
            if self.neighbouring != "replace_one":
                raise unsupported(self.name, event, "randomized response is accounted with neighbouring='replace_one'")
            return event
        if isinstance(event, JLGaussian):
            if self.neighbouring != "add_remove":
                raise unsupported(self.name, event, "the DP-SGD-JL analysis covers add/remove neighbours only")
            return event
        if isinstance(event, PoissonSampled):
            if self.neighbouring != "add_remove":
                raise unsupported(self.name, event, "Poisson subsampling is accounted with neighbouring='add_remove'")
            if isinstance(event.event, JLGaussian):
                return event
            sigma = effective_gaussian_noise_multiplier(event.event)
            if isinstance(sigma, Event):
                raise unsupported(
                    self.name, sigma, "only Gaussian (or JLGaussian) mechanisms are supported inside Poisson sampling"
                )
            return PoissonSampled(event.sample_rate, Gaussian(sigma))
        if isinstance(event, FixedSizeSampled):
            raise unsupported(self.name, event, "sampling without replacement is not implemented for PLD; use rdp")
        raise unsupported(self.name, event, "no privacy loss distribution for this mechanism")

    def _accumulate(self, rep: Event, count: int) -> None:
        self._counts[rep] = self._counts.get(rep, 0) + count
        self._cache, self._grid_steps = {}, {}

    def _is_empty(self) -> bool:
        return not self._counts

    def _jl_leaves(self) -> list[tuple[JLGaussian, float, int]]:
        """(JL mechanism, sample rate, count) of every DP-SGD-JL leaf in the ledger."""
        out = []
        for e, c in self._counts.items():
            if isinstance(e, JLGaussian):
                out.append((e, 1.0, c))
            elif isinstance(e, PoissonSampled) and isinstance(e.event, JLGaussian):
                out.append((e.event, e.sample_rate, c))
        return out

    def _pairs(self, event: Event, jl_cap: float) -> tuple[LossPair, LossPair | None]:
        """(remove-direction pair, add-direction pair or None when symmetric)."""
        sens = replace_factor(self.neighbouring)
        if isinstance(event, Gaussian):
            s = event.noise_multiplier
            return (non_private_pair() if s == 0.0 else gaussian_or_trivial_pair(sens / s)), None
        if isinstance(event, GNMax):
            s = event.sigma
            return (non_private_pair() if s == 0.0 else gaussian_or_trivial_pair(math.sqrt(2.0) / s)), None
        if isinstance(event, Laplace):
            b = event.noise_multiplier
            return (non_private_pair() if b == 0.0 else LaplacePair(sens / b)), None
        if isinstance(event, LNMax):
            b = event.noise_scale
            return (non_private_pair() if b == 0.0 else epsilon_delta_pair(2.0 / b, 0.0)), None
        if isinstance(event, EpsilonDelta):
            return epsilon_delta_pair(event.epsilon, event.delta), None
        if isinstance(event, RandomizedResponse):
            return randomized_response_pair(event.noise_parameter, event.num_buckets), None
        if isinstance(event, JLGaussian):
            from dpaudit.accounting.jl import jl_pairs

            return jl_pairs(event.noise_multiplier, event.projections, 1.0, jl_cap, self.jl_bins, self.tail)
        if isinstance(event, PoissonSampled):
            q = event.sample_rate
            inner = event.event
            if isinstance(inner, JLGaussian):
                from dpaudit.accounting.jl import jl_pairs

                return jl_pairs(inner.noise_multiplier, inner.projections, q, jl_cap, self.jl_bins, self.tail)
            assert isinstance(inner, Gaussian)
            s = inner.noise_multiplier
            if s == 0.0:
                return subsampled_non_private_pairs(q)
            mu = 1.0 / s
            if mu == 0.0:
                return AtomPair([0.0], [1.0]), None
            if not math.isfinite(mu):
                return subsampled_non_private_pairs(q)
            if q == 1.0:
                return GaussianPair(mu), None
            return SubsampledGaussianRemove(mu, q), SubsampledGaussianAdd(mu, q)
        raise AssertionError(f"unvalidated leaf {event!r}")  # pragma: no cover

    # -- evaluation --------------------------------------------------------------------------

    def _grids(self, jl_cap: float) -> list[float]:
        """The grid steps the ledger is evaluated on, coarsest first; each gives a valid (pessimistic) bound and
        the accountant reports the smallest.

        The first is ``value_discretization_interval``, enlarged if some mechanism's loss range would need more
        than ``max_bins`` points (one grid for all leaves: composition needs a common grid). Connect-the-dots
        moves each step's loss by up to one grid step, so a step whose loss range spans only a few grid points
        (large σ or small q: DP-SGD at q = 256/60000, σ = 142, spans 3 points of 1e-4 nats) is charged a spread
        comparable to its own, and over T steps that dominates ε (0.0148 at 1e-4 nats against 0.00852 at 1e-6;
        the rdp accountant gave 0.0100, so calibrating with pld doubled σ). Finer grids, halving the step until
        every leaf spans ``GRID_POINTS_PER_LEAF`` points (each at most ``max_bins`` for every leaf), follow; all
        are evaluated, so the reported ε is the minimum over an increasing set as σ grows or q falls, which keeps it
        monotone wherever each grid's is. Not for DP-SGD-JL ledgers (their per-query loss cap has its own loop).
        Computed once per cap and ledger (every query reads it; the loss ranges need root searches).
        """
        if jl_cap not in self._grid_steps:
            self._grid_steps[jl_cap] = self._grid_steps_for(jl_cap)
        return self._grid_steps[jl_cap]

    def _grid_steps_for(self, jl_cap: float) -> list[float]:
        ranges = []
        for event in self._counts:
            for pair in self._pairs(event, jl_cap):
                if pair is not None:
                    ranges.append(pair.loss_range(self.tail, jl_cap if _is_jl(event) else self.max_loss))
        widest = max((hi - lo for lo, hi in ranges), default=0.0)
        coarse = max(self.interval, widest / self.max_bins)
        narrowest = min((hi - lo for lo, hi in ranges if hi > lo), default=0.0)
        if self._jl_leaves() or narrowest <= 0.0 or narrowest >= GRID_POINTS_PER_LEAF * coarse:
            grids = [coarse]
        else:
            ratio = GRID_POINTS_PER_LEAF * coarse / narrowest  # inf for a subnormal range (q = 5e-324): the cap
            halvings = MAX_GRID_HALVINGS if math.isinf(ratio) else min(MAX_GRID_HALVINGS, math.ceil(math.log2(ratio)))
            while halvings > 0 and widest / (coarse / 2**halvings) > self.max_bins:
                halvings -= 1
            grids = [coarse / 2**k for k in range(halvings + 1)]
        # Before any of it: every (mechanism, direction) is discretised and self-composed on every grid, and the work
        # and the PMFs kept grow with its points (PLD_SECONDS_PER_POINT). A schedule of hundreds of distinct phases
        # is announced (above a minute) or refused (above an hour, without --yes) here, with its reason.
        points = sum((hi - lo) / g + 1.0 for g in grids for lo, hi in ranges)
        check_cost(
            Cost(
                f"PLD accounting of {len(self._counts)} distinct mechanisms ({len(ranges)} loss distributions, "
                f"{len(grids)} grid{'s' * (len(grids) > 1)})",
                points,
                "grid points",
                bytes_per_unit=8.0,
                seconds_per_unit=PLD_SECONDS_PER_POINT,
                advice="use the rdp accountant",
            )
        )
        return grids

    def _composed(
        self, jl_cap: float | None = None, long_inverse: bool = False, interval: float | None = None
    ) -> tuple[DiscretePLD, DiscretePLD | None]:
        """Composed (remove, add-or-None) PMFs on the grid step ``interval`` (None: the coarsest of
        :meth:`_grids`); JL leaves use the loss cap ``jl_cap`` (nats); ``long_inverse``: the FFTs' inverse transforms
        in long double (see :data:`LONG_INVERSE_BELOW_DELTA`)."""
        jl_cap = self.jl_initial_cap if jl_cap is None else float(jl_cap)
        if interval is None:
            interval = self._grids(jl_cap)[0]
        key = (jl_cap, long_inverse, interval)
        if key in self._cache:
            return self._cache[key]
        jl_events = {e for e, c in self._counts.items() if _is_jl(e)}
        pairs = [
            (self._pairs(e, jl_cap), c, jl_cap if e in jl_events else self.max_loss) for e, c in self._counts.items()
        ]
        symmetric = all(add is None for (_, add), _, _ in pairs)
        total_rem: DiscretePLD | None = None
        total_add: DiscretePLD | None = None

        def step(event: Event, direction: str, pair, max_loss: float) -> DiscretePLD:
            key = (event, direction, jl_cap if event in jl_events else None, interval, max_loss)
            if key not in self._steps:
                self._steps[key] = pair.discretise(interval, self.tail * 1e-5, max_loss)
            return self._steps[key]

        for event, ((rem, add), count, max_loss) in zip(self._counts, pairs, strict=True):
            d_rem = step(event, "remove", rem, max_loss).self_compose(count, self.tail, long_inverse)
            total_rem = d_rem if total_rem is None else total_rem.compose(d_rem, self.tail, long_inverse)
            if not symmetric:
                d_add = (
                    d_rem
                    if add is None
                    else step(event, "add", add, max_loss).self_compose(count, self.tail, long_inverse)
                )
                total_add = d_add if total_add is None else total_add.compose(d_add, self.tail, long_inverse)
        assert total_rem is not None
        self._cache[key] = (total_rem, total_add)
        return self._cache[key]

    def _eps_at(self, delta: float, jl_cap: float | None) -> tuple[float, float]:
        # (epsilon, +inf mass of the worse direction's composed PMF) at this JL cap. The precision of the
        # inverse FFTs depends on delta alone, so that epsilon stays monotone in the mechanism's parameters.
        cap = self.jl_initial_cap if jl_cap is None else float(jl_cap)
        best = (math.inf, math.inf)
        for interval in self._grids(cap):  # each a valid bound: the smallest (_grids)
            rem, add = self._composed(jl_cap, delta < LONG_INVERSE_BELOW_DELTA, interval)
            eps, inf_mass = rem.epsilon(delta), rem.inf_mass
            if add is not None:
                eps = max(eps, add.epsilon(delta))
                inf_mass = max(inf_mass, add.inf_mass)
            best = min(best, (eps, inf_mass))
        return best

    def _epsilon(self, delta: float) -> float:
        if delta < CERTIFIED_DELTA:
            warnings.warn(SMALL_DELTA_WARNING.format(delta=delta), UserWarning, stacklevel=3)
        jl = self._jl_leaves()
        if not jl:
            return self._eps_at(delta, None)[0]
        # One query of a DP-SGD-JL ledger takes seconds (the Z_r mixture's thousands of components are discretised
        # for every noise multiplier), and the same query comes back: calibration verifies the sigma its search
        # already evaluated, the trainer's claim then asks it again, as do `inspect` and `account calibrate`.
        # The answer is a pure function of the key (every float bit for bit, every count and option), so a
        # remembered one is the same number (JL_EPSILONS).
        key = self._memo_key(delta)
        remembered = JL_EPSILONS.get(key)
        if remembered is not None:
            return remembered
        best = self._jl_epsilon(delta, jl)
        JL_EPSILONS.put(key, best)
        return best

    def _memo_key(self, delta: float) -> tuple:
        """Everything :meth:`_epsilon` reads, exactly: the class, every option, the ledger's leaves and counts in
        order (composition order moves the last bits), and delta; floats by their bits (-0.0 is not 0.0)."""
        options = (
            self.neighbouring,
            self.interval,
            self.tail,
            self.max_loss,
            self.max_bins,
            self.jl_bins,
            self.jl_initial_cap,
        )
        ledger = tuple((_exact(e), c) for e, c in self._counts.items())
        return (type(self), _exact(options), ledger, _exact(delta))

    def _jl_epsilon(self, delta: float, jl: list[tuple[JLGaussian, float, int]]) -> float:
        # Per-query JL cap (class docstring): every eps below is a valid bound, so the smallest is
        # returned; the loop stops once the cap is JL_CAP_MARGIN nats above the certified eps.
        r_min = min(e.projections for e, _, _ in jl)
        cap = self.jl_initial_cap
        best = math.inf
        for _ in range(JL_MAX_WIDENINGS):
            eps, inf_mass = self._eps_at(delta, cap)
            best = min(best, eps)
            if best + JL_CAP_MARGIN <= cap:
                break
            if math.isfinite(best):
                cap = best * (1.0 + 1e-3) + JL_CAP_MARGIN
            else:
                # The charged mass exceeds delta. The per-step tail decays like cap^(-r/2) (jl module
                # docstring), so aim at charging delta/2; any factor is valid, this one is a guess.
                ratio = max(inf_mass / (0.5 * delta), 1.0)
                cap = cap * max(4.0, 1.5 * ratio ** (2.0 / r_min)) + JL_CAP_MARGIN
        return best

    def _delta(self, epsilon: float) -> float:
        cap = max(self.jl_initial_cap, epsilon + JL_CAP_MARGIN) if self._jl_leaves() else None
        d = self._delta_at(epsilon, cap, False)
        if d < LONG_INVERSE_BELOW_DELTA:  # both are valid bounds; the long-double one is tighter there
            d = min(d, self._delta_at(epsilon, cap, True))
        return d

    def deltas(self, epsilons) -> np.ndarray:
        """:meth:`delta` at many epsilons at once (each a valid delta(epsilon), as ``delta``'s; the composed PMFs
        are read once, not once per epsilon: :meth:`DiscretePLD.deltas`). For curves, e.g. the f-DP audits'."""
        eps = np.array([check_non_negative(epsilon=float(e)) for e in np.ravel(epsilons)], dtype=np.float64)
        if self._non_private:
            return np.ones(eps.shape)
        if self._is_empty():
            return np.zeros(eps.shape)
        if self._jl_leaves():  # the JL loss cap follows each epsilon
            return np.array([self.delta(float(e)) for e in eps])
        d = self._deltas_at(eps, False)
        low = d < LONG_INVERSE_BELOW_DELTA  # as in _delta: both are valid bounds, the long-double one tighter
        if low.any():
            d[low] = np.minimum(d[low], self._deltas_at(eps[low], True))
        if np.isnan(d).any():  # a bug, never a result
            raise RuntimeError("pld accountant produced NaN delta")
        return np.clip(d, 0.0, 1.0)

    def _deltas_at(self, eps: np.ndarray, long_inverse: bool) -> np.ndarray:
        best = np.full(eps.shape, np.inf)
        for interval in self._grids(self.jl_initial_cap):  # each a valid bound: the smallest (_grids)
            rem, add = self._composed(None, long_inverse, interval)
            d = rem.deltas(eps)
            best = np.minimum(best, d if add is None else np.maximum(d, add.deltas(eps)))
        return best

    def _delta_at(self, epsilon: float, jl_cap: float | None, long_inverse: bool) -> float:
        cap = self.jl_initial_cap if jl_cap is None else float(jl_cap)
        best = math.inf
        for interval in self._grids(cap):  # each a valid bound: the smallest (_grids)
            rem, add = self._composed(jl_cap, long_inverse, interval)
            d = rem.delta(epsilon)
            if add is not None:
                d = max(d, add.delta(epsilon))
            best = min(best, d)
        return best


# Below this delta the accountant is outside the range validated against exact oracles (module docstring).
# epsilon stays an upper bound there (every step is pessimistic and the FFT rounding is charged), but the
# truncated tails (tail_mass_truncation = 1e-15 of mass per composition, sent to +inf) and the rounding charge
# become a material part of delta, so it can be far from tight, or infinite.
CERTIFIED_DELTA = 1e-12
SMALL_DELTA_WARNING = (
    "PLD accounting at delta {delta:g} < 1e-12 is outside the range validated against exact oracles: the "
    "truncated tails (1e-15 of mass per composition, charged to delta) and the FFT rounding charge dominate "
    "delta there, so epsilon is an upper bound but may be far from tight; the rdp accountant may be tighter"
)
# Below this delta the FFTs' inverse transforms (and compose's forward ones) run in long double as well: the
# rounding charge (module docstring) then comes from the count-amplified forward error alone, which keeps epsilon
# tight at delta down to 1e-12, for 1.5x (DP-SGD, q = 0.01, T = 3000) to 2.6x (three different leaves) the time.
# At larger delta the float64 charge moves epsilon by < 1e-6 relative (measured; benchmarks/RESULTS.md).
LONG_INVERSE_BELOW_DELTA = 1e-8
# Grid points a leaf's loss range should span before finer grids stop paying (PldAccountant._grids): measured
# with dp_accounting's PLD at DP-SGD q = 256/60000, T = 14063, delta 1e-5: σ = 142 spans 3 points of 1e-4 nats
# (eps 0.0148), 28 of 1e-5 (0.00861), 280 of 1e-6 (0.00852); finer grids gain nothing (0.00852 at 3e-7, 0.00853 at
# 1e-7, where tail truncation starts to cost). benchmarks/RESULTS.md.
GRID_POINTS_PER_LEAF = 500
# CPU seconds per grid point of one loss distribution's discretisation, self-composition and share of the composition
# (PldAccountant._grid_steps_for's estimate): 0.7-1.1 µs measured on this project's 2-core machine for schedules of
# 100-2000 DP-SGD phases (benchmarks/schedule_accounting.py); twice that, as the FFT window's own check assumes.
PLD_SECONDS_PER_POINT = 2e-6
MAX_GRID_HALVINGS = 12  # at most 4096x finer than value_discretization_interval
JL_CAP_MARGIN = 25.0  # nats between a certified epsilon and the JL loss cap (PldAccountant docstring)
JL_MAX_WIDENINGS = 8


class _Memo:
    """A bounded, thread-safe map of exact keys to results (least recently stored dropped first): the JL queries of
    :class:`PldAccountant`, from reference models trained in threads (a Dask worker) as well."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: dict[tuple, float] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple) -> float | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: tuple, value: float) -> None:
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = value
            while len(self._items) > self.size:
                del self._items[next(iter(self._items))]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


# epsilon(delta) of DP-SGD-JL ledgers (PldAccountant._epsilon), by PldAccountant._memo_key. 256 entries: a
# calibration asks about 10, one per noise multiplier.
JL_EPSILONS = _Memo(256)


def _exact(value):
    """A hashable key that tells apart every two values an accountant could answer differently for: numbers by their
    type and bits (float.hex: -0.0 is not 0.0, 1 is not 1.0, numpy's float32 is not float), events by class and
    fields, recursively."""
    if isinstance(value, numbers.Integral):  # bool, int, numpy integers
        return (type(value), int(value))
    if isinstance(value, numbers.Real):  # float, numpy floats
        return (type(value), float(value).hex())
    if isinstance(value, str):
        return (str, value)
    if isinstance(value, Event):
        return (type(value), tuple(_exact(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, tuple | list):
        return (tuple, tuple(_exact(v) for v in value))
    raise TypeError(f"no exact key for {type(value).__name__}")  # pragma: no cover - a new field type: add it


def _is_jl(event: Event) -> bool:
    return isinstance(event, JLGaussian) or (isinstance(event, PoissonSampled) and isinstance(event.event, JLGaussian))
