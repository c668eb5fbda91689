"""Privacy loss distributions: the discrete PMF, the dominating pairs of the mechanisms and their
pessimistic "connect-the-dots" discretisation, as used by :class:`dpaudit.accounting.pld.PldAccountant`
(see that module's docstring for the pessimism argument, step by step).

Split out of ``pld.py`` (issue 23) so that :mod:`dpaudit.accounting.jl` builds its pairs from here and
the accountant imports both, instead of ``jl.py`` and ``pld.py`` importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import fft as sp_fft
from scipy import signal, special

from dpaudit.budget import Cost, check_cost
from dpaudit.errors import UnsupportedEventError

# --------------------------------------------------------------------------------------------
# Discrete privacy-loss PMF
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DiscretePLD:
    """Privacy-loss PMF: mass ``probs[i]`` at loss ``(offset + i) * interval`` (nats), plus
    ``inf_mass`` at +infinity. Total mass may exceed 1 slightly (pessimistic bookkeeping)."""

    interval: float
    offset: int
    probs: np.ndarray
    inf_mass: float
    # Floating-point rounding of the FFTs that built ``probs`` (see :func:`_fft_power`): the true
    # (pessimistic) PMF is dominated by ``probs + e`` for some non-negative vector e on the grid
    # indices ``rounding_span`` = [lo, hi] (absolute, loss = index * interval) with ||e||_2 <= ``rounding``.
    # ``delta`` charges it by Cauchy-Schwarz; 0 for a PMF computed without FFT (every discretisation).
    rounding: float = 0.0
    rounding_span: tuple[int, int] = (0, -1)
    # (count, tail) -> the Chernoff window of ``self_compose`` (it depends on neither precision nor anything
    # else): the accountant's float64 and long-double passes compose the same discretised PMF.
    _windows: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def losses(self) -> np.ndarray:
        return (self.offset + np.arange(self.probs.size)) * self.interval

    @property
    def top(self) -> int:
        return self.offset + self.probs.size - 1

    def _rounding_l1(self) -> float:
        # ||e||_1 <= sqrt(#span) ||e||_2 (Cauchy-Schwarz).
        lo, hi = self.rounding_span
        return self.rounding * math.sqrt(max(hi - lo + 1, 0))

    def rounding_charge(self, epsilon: float) -> float:
        """Upper bound on the delta(eps) that the rounding vector e can hide: sum_j e_j (1 - e^(eps - l_j))_+
        <= ||e||_2 ||w||_2 with w_j = (1 - e^(eps - l_j))_+ over the span (Cauchy-Schwarz)."""
        lo, hi = self.rounding_span
        if self.rounding == 0.0 or hi < lo or epsilon == math.inf:  # w = 0 on every finite bin at eps = inf
            return 0.0
        j0 = max(lo, math.floor(epsilon / self.interval))  # one index low; w is 0 below eps
        if j0 > hi:
            return 0.0
        w = -np.expm1(np.minimum(epsilon - np.arange(j0, hi + 1) * self.interval, 0.0))  # 0 at l <= eps
        k = w.size
        # The float sum of k non-negative squares is rounded up by its error bound (Higham 2002, Eq. (4.4)).
        return self.rounding * math.sqrt(float(np.dot(w, w)) * (1.0 + (k + 2) * _U))

    def _grid_charges(self, start: int, stop: int) -> np.ndarray:
        """rounding_charge at the grid points l_k, start <= k < stop, of ``probs`` (closed-form geometric
        sums; for the search only: ``epsilon`` checks its answer with ``delta``, which sums term by term)."""
        lo, hi = self.rounding_span
        if self.rounding == 0.0 or hi < lo:
            return np.zeros(max(stop - start, 0))
        g = self.offset + np.arange(start, stop)
        j0 = np.maximum(g + 1, lo)
        c = np.maximum(hi - j0 + 1, 0).astype(np.float64)
        t0 = (j0 - g).astype(np.float64)
        h = self.interval
        # sum_{t=t0}^{t0+c-1} (1 - r^t)^2 = c - 2 r^t0 (1 - r^c)/(1 - r) + r^(2 t0) (1 - r^(2c))/(1 - r^2), r = e^-h.
        s1 = np.exp(-h * t0) * np.expm1(-h * c) / np.expm1(-h)
        s2 = np.exp(-2.0 * h * t0) * np.expm1(-2.0 * h * c) / np.expm1(-2.0 * h)
        return self.rounding * np.sqrt(np.maximum(c - 2.0 * s1 + s2, 0.0))

    # -- queries -----------------------------------------------------------------------------

    def delta(self, epsilon: float) -> float:
        """Hockey-stick divergence delta(eps) = inf_mass + sum_{l > eps} p_l (1 - e^(eps - l)), plus the
        FFT rounding charge (:meth:`rounding_charge`), so that it bounds the exact PMF's divergence."""
        losses = self.losses
        start = int(np.searchsorted(losses, epsilon, side="right"))
        tail = self.probs[start:]
        # 1 - e^x for x <= 0 via -expm1 keeps full relative precision when l is close to eps.
        val = float(np.sum(tail * -np.expm1(epsilon - losses[start:])))
        return min(1.0, self.inf_mass + max(0.0, val) + self.rounding_charge(epsilon))

    def deltas(self, epsilons: np.ndarray) -> np.ndarray:
        """:meth:`delta` at many eps at once, each an upper bound on the same quantity (the exact PMF's
        divergence plus what the FFT rounding can hide): O(size) once, then O(1) per eps.

        Main sum: sum_{l_i > eps} p_i (1 - e^(eps - l_i)) = S_k - e^(eps - l_k) W_k at the first bin k above
        eps, with the suffix sums S_k = sum_{i >= k} p_i and W_k = sum_{i >= k} p_i e^-(l_i - l_k) = p_k + e^-h
        W_(k+1), both summed from the top: every term is non-negative, so each carries a relative error
        <= gamma_(3n) (Higham 2002, Eqs. (3.5), (4.4)), and the difference an absolute error <= gamma_(4n+8)
        (S_k + e^(eps - l_k) W_k), which is added. The rounding charge: :meth:`_charges`.
        """
        eps = np.asarray(epsilons, dtype=np.float64)
        charges = self._charges(eps)
        p = np.asarray(self.probs, dtype=np.float64)
        n = p.size
        if n == 0:
            return np.minimum(1.0, self.inf_mass + charges)
        suffix = np.cumsum(p[::-1])[::-1]
        weighted = signal.lfilter([1.0], [1.0, -math.exp(-self.interval)], p[::-1])[::-1]
        losses = self.losses
        start = np.searchsorted(losses, eps, side="right")
        inside = start < n
        k = np.minimum(start, n - 1)
        factor = np.exp(np.minimum(eps - losses[k], 0.0))  # e^(eps - l_k) <= 1 at the first bin above eps
        s_k = np.where(inside, suffix[k], 0.0)
        w_k = np.where(inside, factor * weighted[k], 0.0)
        gamma = (4 * n + 8) * _U / (1.0 - (4 * n + 8) * _U)
        val = np.maximum(s_k - w_k, 0.0) + gamma * (s_k + w_k)
        return np.minimum(1.0, self.inf_mass + val + charges)

    def _charges(self, eps: np.ndarray) -> np.ndarray:
        """:meth:`rounding_charge` at many eps, in closed form with its own rounding bound added.

        From the index j0 = max(lo, floor(eps / h)) (at most one bin low, where w is 0: that bin's closed-form
        term (1 - e^-x0)^2 is subtracted again when x0 < 0), with c = hi - j0 + 1 bins and
        x0 = j0 h - eps: sum_{t < c} (1 - e^-(x0 + t h))^2 = c - 2 e^-x0 G1 + e^-2x0 G2, G1 = (1 - e^-hc) /
        (1 - e^-h), G2 the same in 2h (geometric sums). Each of the three terms is computed to a relative
        (32 + 4 (|j0 h| + eps)) u (a few exp/expm1, products and a quotient, and x0's own rounding, which
        e^-x0 turns into a relative error); that times the terms' magnitudes is added before the square root.
        """
        lo, hi = self.rounding_span
        if self.rounding == 0.0 or hi < lo:
            return np.zeros(eps.shape)
        h = self.interval
        # eps = inf charges nothing (w = 0 on every finite bin): it is moved past the span, where c = 0.
        eps = np.where(np.isinf(eps), (hi + 1.0) * h, eps)
        j0 = np.maximum(np.floor(eps / h), lo)
        c = np.maximum(hi - j0 + 1.0, 0.0)
        x0 = j0 * h - eps
        g1 = np.expm1(-h * c) / math.expm1(-h)
        g2 = np.expm1(-2.0 * h * c) / math.expm1(-2.0 * h)
        t1, t2 = 2.0 * np.exp(-x0) * g1, np.exp(-2.0 * x0) * g2
        # The bin one low (x0 < 0) has w = 0: its closed-form term (1 - e^-x0)^2 is taken out again.
        t0 = np.where((x0 < 0.0) & (c > 0), np.expm1(-x0) ** 2, 0.0)
        err = (32.0 + 4.0 * (np.abs(j0 * h) + np.abs(eps))) * _U * (c + t1 + t2 + t0)
        total = np.maximum(c - t1 + t2 - t0 + err, 0.0)
        return np.where(c > 0, self.rounding * np.sqrt(total) * (1.0 + 4.0 * _U), 0.0)

    def epsilon(self, delta: float) -> float:
        """Smallest eps >= 0 with delta(eps) <= ``delta`` (inf if the +inf mass exceeds delta)."""
        if self.inf_mass > delta:
            return math.inf
        p = self.probs
        n = p.size
        if n == 0 or self.delta(0.0) <= delta:
            return 0.0
        losses = self.losses
        a = math.exp(-self.interval)
        # suffix[k] = sum_{i >= k} p_i ; w[k] = sum_{i >= k} p_i e^-(l_i - l_k) (first-order recursion
        # w[k] = p_k + a w[k+1], run as a stable IIR filter on the reversed array).
        suffix = np.cumsum(p[::-1])[::-1]
        w = signal.lfilter([1.0], [1.0, -a], p[::-1])[::-1]
        # delta at grid point l_k uses the terms i > k: inf + suffix[k+1] - (w[k] - p_k).
        s_next = np.append(suffix[1:], 0.0)
        d_grid = self.inf_mass + s_next - (w - p)
        ok = np.nonzero(d_grid <= delta)[0]
        k = int(ok[0]) if ok.size else n - 1
        # With the rounding charge (>= 0, decreasing in eps) the first grid point that qualifies is at or
        # after k: scan forward in growing chunks (the charge moves it by a few bins at most in practice).
        chunk = 256
        while self.rounding > 0.0 and k < n - 1:
            charged = d_grid[k : k + chunk] + self._grid_charges(k, min(k + chunk, n))
            hit = np.nonzero(charged <= delta)[0]
            if hit.size:
                k += int(hit[0])
                break
            k = min(k + chunk, n - 1)
            chunk *= 4
        # The answer lies in [l_(k-1), l_k]; there delta(eps) = inf + A - e^(eps - l_k) B + charge(eps) with
        # A = sum_{i >= k} p_i, B = sum_{i >= k} p_i e^-(l_i - l_k); the charge decreases in eps, so on
        # that interval it is at most its value at l_(k-1).
        A, B = float(suffix[k]), float(w[k])
        lower = float(losses[k - 1]) if k > 0 else 0.0

        def solve(charge: float) -> float:  # the eps in [l_(k-1), l_k] where the charge is taken as fixed
            num = self.inf_mass + A - (delta - charge)
            eps = float(losses[k]) if (num <= 0.0 or B <= 0.0) else float(losses[k]) + math.log(num / B)
            return min(max(eps, lower, 0.0), float(losses[k]))

        eps = solve(float(self._grid_charges(max(k - 1, 0), max(k, 1))[0]))
        if self.rounding > 0.0:
            # One refinement with the charge at that (sound) eps: it lands at or just below the answer, which
            # the loop below then steps up to.
            eps = solve(self.rounding_charge(eps))
        # Never under-report: step up until the guarantee provably holds on this PMF.
        resolution = max(abs(eps), 1.0) * 1e-12
        step, failed = resolution, None
        while self.delta(eps) > delta:
            failed = eps
            eps += step
            step *= 2.0
        # The doubling overshoots by up to its last step (far, when only the rounding charge is left above the
        # PMF's top): bisect back between the last failing point and eps; eps always meets delta.
        while failed is not None and eps - failed > resolution:
            mid = 0.5 * (failed + eps)
            if self.delta(mid) > delta:
                failed = mid
            else:
                eps = mid
        return eps

    # -- composition -------------------------------------------------------------------------

    def compose(self, other: DiscretePLD, tail: float, long_inverse: bool = False) -> DiscretePLD:
        """PMF of the sum of the two losses (linear convolution by FFT), tails truncated pessimistically.
        ``long_inverse``: the transforms in long double (rounding charge ~2^11 times smaller, slower)."""
        if not math.isclose(self.interval, other.interval, rel_tol=0.0, abs_tol=0.0):
            raise ValueError("cannot compose PLDs with different discretisation intervals")
        conv, conv_err = _convolve(self.probs, other.probs, long_inverse)
        conv = np.maximum(conv, 0.0)  # clamping moves each value towards the true (non-negative) one
        fin_a, fin_b = _mass_up(self.probs), _mass_up(other.probs)
        l1_a, l1_b = self._rounding_l1(), other._rounding_l1()
        # (fin_a + inf_a)(fin_b + inf_b) - fin_a fin_b, expanded: the difference of two products near 1
        # would keep no digit of an infinite mass below ~1e-16. The rounding vectors' masses (l1) count as
        # finite mass that may meet the other's infinite mass.
        inf_mass = self.inf_mass * (fin_b + l1_b + other.inf_mass) + (fin_a + l1_a) * other.inf_mass
        # (p_a + e_a) * (p_b + e_b) = p_a * p_b + e_a * p_b + p_a * e_b + e_a * e_b, each bounded in L2 by
        # Young's inequality ||x * y||_2 <= ||x||_2 ||y||_1; the FFT's own error adds conv_err.
        rounding = conv_err + self.rounding * fin_b + fin_a * other.rounding + self.rounding * l1_b
        a_lo, a_hi = self.rounding_span
        b_lo, b_hi = other.rounding_span
        spans = [(self.offset + other.offset, self.top + other.top)]
        if self.rounding > 0.0:
            spans.append((a_lo + other.offset, a_hi + other.top))
        if other.rounding > 0.0:
            spans.append((self.offset + b_lo, self.top + b_hi))
        if self.rounding > 0.0 and other.rounding > 0.0:
            spans.append((a_lo + b_lo, a_hi + b_hi))
        span = (min(s[0] for s in spans), max(s[1] for s in spans)) if rounding > 0.0 else (0, -1)
        out = DiscretePLD(self.interval, self.offset + other.offset, conv, inf_mass, rounding, span)
        return _truncate(out, tail)

    def self_compose(self, count: int, tail: float, long_inverse: bool = False) -> DiscretePLD:
        """PMF of the sum of ``count`` iid losses, by exponentiation in the Fourier domain.

        The output window [lo, hi] comes from Chernoff bounds: mass(S >= h) <= e^(count K(lam) - lam h)
        with K(lam) = log sum p_i e^(lam i) (valid for any positive measure), so the mass outside
        the window is at most ``tail`` on each side; it is added to +inf (above) and to the lowest
        bin (below). Cyclic wrap-around of the FFT only adds non-negative mass inside the window.
        The FFT's rounding is bounded by :func:`_fft_power` and carried in ``rounding`` (``long_inverse``:
        as in :meth:`compose`).
        """
        count = int(count)
        if count == 1:
            return self
        p = self.probs
        n = p.size
        fin = _mass_up(p)
        l1 = self._rounding_l1()
        tot = fin + l1 + self.inf_mass
        if tot > 1.0 and count * math.log(tot) > LOG_FLOAT_MAX:
            # tot^count bounds the composed mass with its error terms (below): past float64 it overflowed
            # (OverflowError, an internal error), and long before that the bounds make delta 1.
            raise UnsupportedEventError(
                f"PLD accounting of {count} compositions: the discretisation's error bounds grow as (1 + "
                f"{tot - 1.0:.3g})^{count}, beyond float64; use the rdp accountant"
            )
        # tot^count - fin^count = tot^count (1 - (1 - inf/tot)^count), through log1p/expm1: the plain
        # difference loses an infinite mass below ~1e-16 (tot == fin in float64), e.g. the 1e-20 of a
        # discretised Gaussian's cut-off tail, 1e6 times.
        # All the mass at +inf (inf_mass == tot: a noise multiplier so small that every loss is past max_loss) is
        # tot^count outright: math.log1p(-1) raises ValueError (an internal error at sigma 0.0016, q = 1, T = 2).
        share = self.inf_mass / tot if tot > 0.0 else 0.0
        inf_mass = tot**count * (1.0 if share >= 1.0 else -math.expm1(count * math.log1p(-share)))
        # (p + e)^(*count) - p^(*count) = sum_k C(count, k) e^(*k) * p^(*(count-k)): by Young's inequality its
        # L2 norm is <= ||e||_2 ((fin + l1)^count - fin^count) / l1 <= ||e||_2 count (fin + l1)^(count-1).
        carried = self.rounding * count * (fin + l1) ** (count - 1) if self.rounding > 0.0 else 0.0
        c_lo = count * min(self.offset, self.rounding_span[0])
        c_hi = count * max(self.top, self.rounding_span[1])
        if n == 0 or fin == 0.0:
            span = (c_lo, c_hi) if carried > 0.0 else (0, -1)
            return DiscretePLD(
                self.interval, self.offset * count, np.zeros(1), min(inf_mass, tot**count), carried, span
            )
        key = (count, tail)
        if key not in self._windows:
            self._windows[key] = _chernoff_window(p, count, tail, self.interval)
        lo, hi, tail_lo, tail_hi = self._windows[key]
        size = hi - lo + 1
        # Before the FFT: the window's arrays (real input, complex spectrum, output: ~48 bytes a point)
        # must fit, and a window taking hours asks for --yes (2 µs a point, measured on a 2-core CPU).
        # The grid is the accountant's (a user chooses no grid points): the way out is another accountant.
        advice = "use the rdp accountant (or fewer steps)"
        check_cost(Cost(f"PLD accounting of {count} compositions", size, "grid points", 48.0, 2e-6, advice=advice))
        length = sp_fft.next_fast_len(size, real=True)
        folded = (
            np.bincount(np.arange(n) % length, weights=p, minlength=length)
            if n > length
            else (np.pad(p, (0, length - n)))
        )
        # Folding sums <= ceil(n / length) values a bin: relative error <= that many u (Higham 2002, Eq. (4.4)),
        # i.e. the folded vector is within fold_err (L2) of the exact fold, which the count-fold power amplifies
        # at most count * (fin (1 + u))^(count - 1) times (Young's inequality, as for ``carried``).
        fold_terms = -(-n // length)
        fold_err = (fold_terms * _U * float(np.linalg.norm(folded)) * 1.01) if fold_terms > 1 else 0.0
        res, fft_err = _fft_power(folded, count, long_inverse)
        fft_err += fold_err * count * (fin * (1.0 + fold_terms * _U)) ** (count - 1)
        out = np.roll(res, -(lo % length))[:size]
        out = np.maximum(out, 0.0)  # clamping moves each value towards the true (non-negative) one
        out[0] += tail_lo
        offset = self.offset * count + lo
        span = (offset, offset + size - 1)
        if carried > 0.0:
            span = (min(span[0], c_lo), max(span[1], c_hi))
        return DiscretePLD(self.interval, offset, out, inf_mass + tail_hi, fft_err + carried, span)


# --------------------------------------------------------------------------------------------
# Rounding error bounds of the FFT convolutions
# --------------------------------------------------------------------------------------------

_U = 2.0**-53  # unit roundoff of float64
LOG_FLOAT_MAX = math.log(np.finfo(np.float64).max)  # ~709.78: e^x overflows float64 above it
_LONG = np.longdouble  # the extended type (tests swap in float64, the case of platforms without one)
_U_LONG = float(np.finfo(_LONG).epsneg)  # its unit roundoff: 2^-64 on x86-64, 2^-53 where long double is double
# Normwise error of a computed DFT: ||fl(F x) - F x||_2 <= (t eta / (1 - t eta)) ||F x||_2 for a radix-2 FFT of
# length 2^t, eta = mu + gamma_4 (sqrt(2) + mu) ~ 6.7 u with accurately computed twiddles (Higham 2002, "Accuracy
# and Stability of Numerical Algorithms", 2nd ed., Sec. 24.1, Thm. 24.2; Ramos 1971, Math. Comp. 25(116), bounds
# of the same form for mixed radix). pocketfft (scipy.fft) runs radix-2/3/4/5 passes with accurate twiddles; a
# radix-r pass is a direct length-r DFT (error <= gamma_(r+2) sqrt(r) relative, Higham Eq. (3.5)) spanning log2 r
# levels, ~8.4 u a level for r = 5. We take FFT_LEVEL_ERROR = 10 u per level of ceil(log2 L); measured on
# lengths 2^a 3^b 5^c (tests/accounting/test_pld_rounding.py) at most 0.3 u per level, a 30x margin.
FFT_LEVEL_ERROR = 10.0


def _fft_error(length: int, unit: float) -> float:
    t_eta = FFT_LEVEL_ERROR * math.ceil(math.log2(max(length, 2))) * unit
    return t_eta / (1.0 - t_eta)


def _mass_up(p: np.ndarray) -> float:
    # Sum of non-negative floats rounded up by its error bound n u sum (Higham 2002, Eq. (4.4)).
    return float(np.sum(p)) * (1.0 + p.size * _U)


def _hermitian_weights(size: int, length: int) -> np.ndarray:
    # Multiplicity of each rfft bin in the full (Hermitian) spectrum of a real signal of this length.
    wts = np.full(size, 2.0)
    wts[0] = 1.0
    if length % 2 == 0:
        wts[-1] = 1.0
    return wts


def _full_norm(half: np.ndarray, length: int, mask: np.ndarray | None = None) -> float:
    """L2 norm of the Hermitian spectrum of length ``length`` whose first half ``half`` (rfft layout) is,
    restricted to ``mask``, rounded up (the float sum of squares by the relative bound (length + 2) u,
    Higham Eq. (4.4))."""
    sq = np.abs(half.astype(np.complex128)) ** 2 * _hermitian_weights(half.size, length)
    return _rounded_sqrt(float(np.sum(sq if mask is None else sq[mask])), length)


def _rounded_sqrt(sum_of_squares: float, length: int) -> float:
    return math.sqrt(sum_of_squares * (1.0 + (length + 4) * _U)) * (1.0 + 4 * _U)


# Complex multiplication: |fl(x y) - x y| <= sqrt(2) gamma_2 |x y| (Higham 2002, Lemma 3.5), gamma_2 = 2u/(1-2u).
def _cmul_error(unit: float) -> float:
    return math.sqrt(2.0) * 2.0 * unit / (1.0 - 2.0 * unit)


_CMUL = _cmul_error(_U)
# Gradual underflow: a product below the normal range is off by at most this much absolutely (an ulp of the
# subnormals, 2^-1074, per real operation; 4 of them per complex product, rounded up).
_UNDERFLOW = 2.0**-1068
# Spectrum bins whose count-th power is within this factor of the largest are raised in long double.
_PRECISE_POWER = 1e-6


def _binary_power(z: np.ndarray, count: int) -> tuple[np.ndarray, int]:
    """z^count by repeated squaring, and the number of products. Each squaring doubles the exponent of the
    earlier roundings, so along any path at most count relative roundings compose: the relative error is at
    most (1 + sqrt(2) gamma_2)^count - 1 (Higham 2002, Lemma 3.5), plus underflow (``_UNDERFLOW`` a product)."""
    result = None
    mults = 0
    with np.errstate(under="ignore"):
        while count:
            if count & 1:
                result = z.copy() if result is None else result * z
                mults += 1
            count >>= 1
            if count:
                z = z * z
                mults += 1
    assert result is not None
    return result, mults


def _fft_power(x: np.ndarray, count: int, long_inverse: bool) -> tuple[np.ndarray, float]:
    """Cyclic ``count``-fold self-convolution of ``x`` by FFT, and a bound on the L2 norm of its error.

    Steps and their errors (L = x.size, F the DFT, ||F y||_2 = sqrt(L) ||y||_2 by Parseval):
    1. S' = fl(F x) in long double, ||S' - F x||_2 <= eta_long sqrt(L) ||x||_2 (``_fft_error``); every |S_k|,
       |S'_k| <= M, so |S'^count - S^count| <= count M^(count - 1) |S' - S| (mean value theorem): after the
       inverse transform count M^(count-1) eta_long ||x||_2. This is the one term amplified by count against
       ||x||_2 rather than the output's norm; long double makes it 2^11 times smaller than float64 would.
    2. The power: in long double on the bins where |S'_k|^count is within ``_PRECISE_POWER`` of the largest
       (relative error rel_big = (1 + sqrt(2) gamma_2,long)^count - 1, times (1 + u) when rounded to float64);
       elsewhere S' is rounded to complex128 first (relative u, raised to the count-th power) and raised in
       float64: rel_small = (1 + u)^count (1 + sqrt(2) gamma_2)^count - 1 (``_binary_power``), on bins that
       carry at most 1e-6 of the peak. Total: (rel_big ||Z_big||_2 + rel_small ||Z_small||_2 + underflow) / sqrt(L).
    3. The inverse FFT: eta ||F^-1 Z||_2 = eta ||Z||_2 / sqrt(L), in float64, or (``long_inverse``) in long
       double and then rounded to float64 (relative u a bin, i.e. u ||out||_2).
    """
    length = x.size
    spec_long = sp_fft.rfft(x.astype(_LONG))
    z = spec_long.astype(np.complex128)
    mag = np.abs(z)
    big_mag = float(np.max(mag))
    mass = _mass_up(x)
    bound = max(mass, big_mag * (1.0 + 8.0 * _U))  # M: rounding to float64 is relative u; |S_k| <= mass
    dominant = mag >= big_mag * _PRECISE_POWER ** (1.0 / count)
    small, mults = _binary_power(z, count)
    big = _binary_power(spec_long[dominant], count)[0]
    u_long = _U_LONG
    rel_big = math.expm1(count * math.log1p(_cmul_error(u_long)) + (0.0 if long_inverse else math.log1p(_U)))
    rel_small = math.expm1(count * (math.log1p(_U) + math.log1p(_CMUL)))
    result = small.astype(spec_long.dtype) if long_inverse else small
    result[dominant] = big
    sqrt_l = math.sqrt(length)
    underflow = mults * _UNDERFLOW * max(bound, 1.0) ** count * sqrt_l  # L2 over the spectrum
    sq = np.abs(result.astype(np.complex128)) ** 2 * _hermitian_weights(result.size, length)
    big_sq, small_sq = float(np.sum(sq, where=dominant)), float(np.sum(sq, where=~dominant))
    norm_big, norm_small = _rounded_sqrt(big_sq, length), _rounded_sqrt(small_sq, length)
    spec_err = (
        rel_big / (1.0 - rel_big) * norm_big + rel_small / (1.0 - rel_small) * (norm_small + underflow) + underflow
    )
    forward = count * bound ** (count - 1) * _fft_error(length, u_long) * float(np.linalg.norm(x)) * (1.0 + length * _U)
    out, inverse = _inverse(result, length, math.hypot(norm_big, norm_small), long_inverse)
    return out, (spec_err / sqrt_l + forward + inverse) * (1.0 + 1e-6)


def _inverse(spec: np.ndarray, length: int, spec_norm: float, long_inverse: bool) -> tuple[np.ndarray, float]:
    """irfft of ``spec`` as float64 and the L2 bound on its own error (step 3 of ``_fft_power``)."""
    out = sp_fft.irfft(spec, n=length)
    if not long_inverse:
        return out, _fft_error(length, _U) * spec_norm / math.sqrt(length)
    out = out.astype(np.float64)
    rounding = _U / (1.0 - _U) * float(np.linalg.norm(out)) * (1.0 + length * _U)
    return out, _fft_error(length, _U_LONG) * spec_norm / math.sqrt(length) + rounding


def _convolve(a: np.ndarray, b: np.ndarray, long_inverse: bool) -> tuple[np.ndarray, float]:
    """Linear convolution of two non-negative vectors and a bound on the L2 norm of its rounding error."""
    if min(a.size, b.size) <= 64:
        # Direct sums of <= k = min(size) products: |error_j| <= gamma_k (|a| * |b|)_j (Higham 2002, Eq. (3.5)),
        # and (|a| * |b|)_j <= conv_j / (1 - gamma_k) for non-negative inputs.
        conv = np.convolve(a, b)
        k = min(a.size, b.size)
        gamma = k * _U / (1.0 - k * _U)
        return conv, gamma / (1.0 - gamma) * float(np.linalg.norm(conv)) * (1.0 + 1e-6)
    size = a.size + b.size - 1
    length = sp_fft.next_fast_len(size, real=True)  # zero padding to >= size: the cyclic convolution is linear
    # In one precision throughout: float64, or long double with ``long_inverse``. Unlike in ``_fft_power``
    # nothing amplifies the forward transforms' errors here, so float64 costs at most ~3x the inverse's charge.
    dtype, unit = (_LONG, _U_LONG) if long_inverse else (np.float64, _U)
    fa = sp_fft.rfft(a.astype(dtype), n=length)
    fb = sp_fft.rfft(b.astype(dtype), n=length)
    prod = fa * fb
    eta = _fft_error(length, unit)
    max_a = float(np.max(np.abs(fa))) * (1.0 + 8.0 * unit)
    max_b = float(np.max(np.abs(fb))) * (1.0 + 8.0 * unit)
    norm_a = float(np.linalg.norm(a)) * (1.0 + a.size * _U)
    norm_b = float(np.linalg.norm(b)) * (1.0 + b.size * _U)
    # With A = F a, fa = A + dA: fa fb - A B = dA fb + A dB, |A_k| <= mass(a), |fb_k| <= max_b, so
    # ||.||_2 <= eta sqrt(L) (||a||_2 max_b + mass(a) ||b||_2) (``_fft_error``); after the inverse, / sqrt(L).
    forward = eta * (norm_a * max_b + max(_mass_up(a), max_a) * norm_b)
    p_norm = _full_norm(prod, length)
    # The product (sqrt(2) gamma_2, Higham 2002, Lemma 3.5; the underflow of a float64 product, absolutely).
    rel = _cmul_error(unit)
    products = rel / (1.0 - rel) * p_norm + length * _UNDERFLOW
    conv, inverse = _inverse(prod, length, p_norm, long_inverse)
    return conv[:size], (forward + products / math.sqrt(length) + inverse) * (1.0 + 1e-6)


def _truncate(pld: DiscretePLD, tail: float) -> DiscretePLD:
    # Drop an upper tail of mass <= tail to +inf, and move a lower tail of mass <= tail up to the
    # first kept bin (both pessimistic). Each tail is summed from its own end: the upper tail as
    # total - prefix sum cancels catastrophically (no digit below ~1e-16 * total survives) and once
    # dropped ~4e-14 of mass it had not counted, an under-reported delta (found by
    # benchmarks/accounting_fuzz.py; tests/accounting/test_accounting_fuzz.py). The float sums of
    # non-negative terms are rounded up by their error bound n u sum (Higham 2002, "Accuracy and
    # Stability of Numerical Algorithms", Eq. (4.4)) so that no moved mass is under-counted either.
    p = pld.probs
    if p.size <= 1:
        return pld
    prefix = np.cumsum(p)  # mass at indices <= i
    suffix = np.cumsum(p[::-1])[::-1]  # mass at indices >= i
    round_up = 1.0 + p.size * 2.0**-53
    lo = int(np.searchsorted(prefix, tail, side="right"))  # first index with prefix mass > tail
    above = np.nonzero(suffix > tail)[0]
    hi = int(above[-1]) if above.size else p.size - 1
    lo = min(lo, hi)
    kept = p[lo : hi + 1].copy()
    kept[0] += float(prefix[lo - 1]) * round_up if lo > 0 else 0.0
    moved_up = float(suffix[hi + 1]) * round_up if hi + 1 < p.size else 0.0
    # The rounding vector e keeps its span: moving the computed PMF's own mass up only raises delta, so the
    # truth stays dominated by (moved PMF) + e.
    return DiscretePLD(pld.interval, pld.offset + lo, kept, pld.inf_mass + moved_up, pld.rounding, pld.rounding_span)


def _logsumexp(x: np.ndarray) -> float:
    m = float(np.max(x))
    return m + math.log(float(np.sum(np.exp(x - m))))


def _chernoff_window(
    p: np.ndarray, count: int, tail: float, interval: float, lams: np.ndarray | None = None
) -> tuple[int, int, float, float]:
    """Index window [lo, hi] (relative to count * offset) holding all but <= tail mass on each side.

    Chernoff: mass(S >= h) <= exp(count K(lam) - lam h) and mass(S <= l) <= exp(count K(-lam) + lam l)
    for every lam > 0, with K the log-MGF of one PMF in index units; the best of a log-spaced grid
    of lam (0.01 to 1e5 per nat, and 0.1/max_idx to 1 per index; ``lams`` per index unit, for tests) is
    used. Any lam gives a valid bound.
    """
    n = p.size
    max_idx = count * (n - 1)
    # Coarse-grain into <= 4096 blocks of B indices (~25x cheaper). Within a block starting at s,
    # e^(lam j) for j = 0..B-1 is convex, so it lies below its chord 1 + (e^(lam (B-1)) - 1) j / (B-1):
    # sum_j p_(s+j) e^(lam (s+j)) <= e^(lam s) (m0 + (e^(lam (B-1)) - 1) m1 / (B-1)) with the block's mass
    # m0 and first moment m1 = sum_j j p_(s+j) (the same for e^(-lam j) in the lower tail). An upper bound
    # on K, so the window stays valid, and only ~(lam B)^2 / 8 above it: bounding e^(lam j) by the
    # block's largest index instead would add lam (B - 1) to K, i.e. count (B - 1) indices to the
    # window (2,100 nats instead of 35 for 10^6 steps of q = 1e-5, sigma = 0.5).
    block = max(1, math.ceil(n / 4096))
    starts_i = np.arange(0, n, block)
    m0 = np.add.reduceat(p, starts_i)
    m1 = np.add.reduceat(p * (np.arange(n) - np.repeat(starts_i, block)[:n]), starts_i) if block > 1 else None
    nz = np.nonzero(m0 > 0.0)[0]
    m0, starts = m0[nz], starts_i[nz].astype(np.float64)
    # a block's width - 1 (the last block may be shorter); m1 / width in [0, m0] up to rounding
    width = np.minimum(starts + block, n) - starts - 1.0
    frac = (
        np.zeros_like(m0) if m1 is None else np.where(width > 0, np.minimum(m1[nz] / np.maximum(width, 1.0), m0), 0.0)
    )
    # sum_j p_(s+j) e^(±lam (s+j)) <= (m0 - frac) e^(±lam s) + frac e^(±lam (s + w)) with frac = m1 / w (the
    # chord, both terms >= 0): one log-sum-exp over the 2 x blocks terms (log weights L at positions S).
    with np.errstate(divide="ignore"):
        L = np.concatenate([np.log(m0 - frac), np.log(frac)])
    S = np.concatenate([starts, starts + width])
    keep = np.isfinite(L)
    L, S = L[keep], S[keep]
    log_tail = math.log(tail)
    best_hi, best_lo = math.inf, -math.inf
    # lam per nat from 1e-2 to 1e5, plus lam per index unit down to ~1/max_idx: heavy-tailed PMFs
    # spread over many nats (DP-SGD-JL with small r) need lam far below 1e-2 per nat.
    if lams is None:
        lams = np.concatenate([np.geomspace(1e-2, 1e5, 45) * interval, np.geomspace(0.1 / max(max_idx, 1), 1.0, 30)])
    for lam in lams:  # per index unit
        k_pos = _logsumexp(L + lam * S)
        best_hi = min(best_hi, math.ceil((count * k_pos - log_tail) / lam))
        k_neg = _logsumexp(L - lam * S)
        best_lo = max(best_lo, math.floor((log_tail - count * k_neg) / lam))
    hi, tail_hi = (int(best_hi), tail) if best_hi < max_idx else (max_idx, 0.0)
    lo, tail_lo = (int(best_lo), tail) if best_lo > 0 else (0, 0.0)
    if lo > hi:  # degenerate (nearly a point mass): keep the full support
        lo, hi, tail_lo, tail_hi = 0, max_idx, 0.0, 0.0
    return lo, hi, tail_lo, tail_hi


# --------------------------------------------------------------------------------------------
# Dominating pairs and their pessimistic discretisation
# --------------------------------------------------------------------------------------------


class LossPair:
    """A dominating pair (P, Q) described by the distribution of L = log dP/dQ.

    Subclasses give, vectorised over t (nats): p_cdf(t) = P(L <= t), p_sf(t) = P(t < L < inf),
    q_cdf(t) = Q(L <= t), q_sf(t) = Q(t < L < inf) (right-continuous, so atoms are fine), the
    support [lo, hi] of L under P and the mass ``p_inf`` = P(L = +inf).
    """

    lo: float = -math.inf
    hi: float = math.inf
    p_inf: float = 0.0

    def p_cdf(self, t: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def p_sf(self, t: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def q_cdf(self, t: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def q_sf(self, t: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def cdfs(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(p_cdf, p_sf, q_cdf, q_sf) at t; subclasses may share work between the four."""
        return self.p_cdf(t), self.p_sf(t), self.q_cdf(t), self.q_sf(t)

    def loss_range(self, tail: float, max_loss: float) -> tuple[float, float]:
        """[t_lo, t_hi] with P(L < t_lo) <= tail and P(t_hi < L < inf) <= tail, clipped to +-max_loss."""
        t_hi = self.hi if math.isfinite(self.hi) else _search(lambda t: self.p_sf(t) <= tail, up=True)
        t_lo = self.lo if math.isfinite(self.lo) else _search(lambda t: self.p_cdf(t) <= tail, up=False)
        return _clip_range(t_lo, t_hi, max_loss)

    def discretise(self, interval: float, tail: float, max_loss: float) -> DiscretePLD:
        t_lo, t_hi = self.loss_range(tail, max_loss)
        return _ctd_continuous(self, interval, t_lo, t_hi)


def _clip_range(lo: float, hi: float, max_loss: float) -> tuple[float, float]:
    hi = min(hi, max_loss)
    lo = max(lo, -max_loss)
    return min(lo, hi), hi


def _search(pred, *, up: bool) -> float:
    # Smallest |t| (upwards: smallest t >= 0; downwards: largest t <= 0) with pred(t), by doubling
    # then bisection; bounded by 1e4 nats (beyond that the caller clips anyway).
    sign = 1.0 if up else -1.0
    a, b = 0.0, 1.0
    if pred(np.array([0.0]))[0]:
        return 0.0
    while not pred(np.array([sign * b]))[0]:
        a, b = b, 2.0 * b
        if b > 1e4:
            return sign * b
    for _ in range(60):
        m = 0.5 * (a + b)
        if pred(np.array([sign * m]))[0]:
            b = m
        else:
            a = m
    return sign * b


def interval_masses(cdf: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """Masses of the intervals (t_k, t_(k+1)] from the CDF and the survival function at the edges t_k:
    the CDF is differenced in the lower half and the survival function in the upper half, so that
    neither tail loses its relative precision (a difference of two numbers near 1 keeps no digits of a
    mass near 1e-16); negative rounding is clamped to 0. The one helper for every such mass in the
    accounting (PLD discretisation here, the JL norm-ratio bins in :mod:`dpaudit.accounting.jl`)."""
    from_cdf = cdf[1:] - cdf[:-1]
    from_sf = sf[:-1] - sf[1:]
    return np.maximum(np.where(cdf[1:] <= 0.5, from_cdf, from_sf), 0.0)


# Absolute error of an interval mass from :func:`interval_masses`, in units of 2^-52 times v (1 + |ln v|) summed over
# the two values v differenced (the |ln v| term: an argument off by a few ulps moves a Gaussian tail value v by about
# x^2 ~ 2 |ln v| ulps). Measured against 80-digit mpmath (benchmarks/stats_rounding.py, section ``pld``): at most 1.39
# for the Gaussian pair (P's and Q's arguments rounded separately) and 1.50 for the Poisson-subsampled pairs (both
# CDFs at the same float argument, whose own error only moves the interval's edge), over mu 1e-10..2, q 1e-4..1.
_MASS_ERROR_UNITS = 8.0


def interval_mass_errors(cdf: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """Bounds on the absolute rounding errors of :func:`interval_masses` (same pairs of values differenced)."""

    def scale(v: np.ndarray) -> np.ndarray:
        v = np.abs(v)
        with np.errstate(divide="ignore"):
            return np.where(v > 0.0, v * (1.0 - np.log(np.where(v > 0.0, np.minimum(v, 1.0), 1.0))), 0.0)

    c, s = scale(cdf), scale(sf)
    return _MASS_ERROR_UNITS * 2.0**-52 * np.where(cdf[1:] <= 0.5, c[1:] + c[:-1], s[:-1] + s[1:])


def _ctd_continuous(pair: LossPair, interval: float, t_lo: float, t_hi: float) -> DiscretePLD:
    i_lo = math.floor(t_lo / interval)
    i_hi = max(math.ceil(t_hi / interval), i_lo + 1)
    grid = (i_lo + np.arange(i_hi - i_lo + 1)) * interval
    pc, ps, qc, qs = pair.cdfs(grid)
    m = interval_masses(pc, ps)
    w = interval_masses(qc, qs)
    probs = np.zeros(grid.size)
    probs[0] += max(0.0, float(pc[0]))  # mass at or below the grid: rounded up to l_0
    inf_mass = pair.p_inf + max(0.0, float(ps[-1]))  # mass above the grid: to +inf
    probs += _split(m, w, grid, interval, interval_mass_errors(pc, ps), interval_mass_errors(qc, qs))
    return DiscretePLD(interval, i_lo, probs, inf_mass)


def _split(
    m: np.ndarray, w: np.ndarray, grid: np.ndarray, interval: float, m_err: np.ndarray, w_err: np.ndarray
) -> np.ndarray:
    """Connect-the-dots split of interval masses onto the end points (Doroshenko et al. 2022, Sec. 3).

    For P-mass m and Q-mass w in [l_k, l_(k+1)], the upper end gets
        b = (m e^-l_k - w) / (e^-l_k - e^-l_(k+1)) = m (1 - (w/m) e^l_k) / (1 - e^-interval)
    and the lower end a = m - b, which preserves m and w. Computed through log(w/m) + l_k so that
    large losses do not overflow; b is clipped to [0, m] (float noise only; clipping up is pessimistic
    when w underflows to 0).

    Rounded up: 1 - (w/m) e^l_k is of the order of the interval, so the masses' rounding (``m_err``, ``w_err``:
    :func:`interval_mass_errors`) is amplified by 1/interval in b: at a noise multiplier of 1e9 (losses within
    +-1e-8 nats, interval 2.4e-8) b came out 3e-8 relative low, and delta(0) 3.1e-8 below the exact
    erf(1/(2 sqrt(2) sigma)) (benchmarks/RESULTS.md). b is taken at w - w_err and m + m_err, the logarithms'
    and the sum's rounding (4 u each of |log w|, |log m|, |l_k|) is added to the numerator and the quotient's to
    the result: moving P-mass to the higher loss only raises every delta(eps) (a valid, pessimistic PMF).
    """
    out = np.zeros(m.size + 1)
    pos = m > 0.0
    w_lo = np.maximum(w - w_err, 0.0)
    m_hi = np.where(pos, m + m_err, 1.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_w, log_m = np.log(w_lo), np.log(m_hi)
        log_ratio = np.where(pos & (w_lo > 0.0), log_w - log_m, -np.inf) + grid[:-1]
        lr_err = 4.0 * _U * (np.abs(log_w) + np.abs(log_m) + np.abs(grid[:-1]))
        slack = np.where(np.isfinite(log_ratio), np.exp(log_ratio) * lr_err, 0.0)
        frac_up = (-np.expm1(log_ratio) + slack) / -np.expm1(-interval) * (1.0 + 8.0 * _U)
    frac_up = np.where(np.isnan(frac_up), 1.0, np.clip(frac_up, 0.0, 1.0))
    b = np.where(pos, m * frac_up, 0.0)
    a = m - b
    out[:-1] += a
    out[1:] += b
    return out


def _ctd_atoms(losses: list[float], masses: list[float], p_inf: float, interval: float) -> DiscretePLD:
    """Connect-the-dots discretisation of a PMF with finitely many atoms (Q-mass e^-l per unit P-mass)."""
    finite = [(lv, mv) for lv, mv in zip(losses, masses, strict=True) if mv > 0.0 and math.isfinite(lv)]
    p_inf = p_inf + sum(mv for lv, mv in zip(losses, masses, strict=True) if mv > 0.0 and lv == math.inf)
    if not finite:
        return DiscretePLD(interval, 0, np.zeros(1), p_inf)
    ks = [math.floor(lv / interval) for lv, _ in finite]
    offset, top = min(ks), max(ks) + 1
    probs = np.zeros(top - offset + 1)
    for (lv, mv), k in zip(finite, ks, strict=True):
        lower = k * interval
        frac_up = 0.0 if lv <= lower else min(1.0, -math.expm1(lower - lv) / -math.expm1(-interval))
        probs[k - offset] += mv * (1.0 - frac_up)
        probs[k + 1 - offset] += mv * frac_up
    return DiscretePLD(interval, offset, probs, p_inf)


class AtomPair(LossPair):
    """A pair whose loss takes finitely many values (randomized response, (eps, delta)-DP, ...)."""

    def __init__(self, losses: list[float], masses: list[float], p_inf: float = 0.0) -> None:
        self.losses, self.masses, self.p_inf = list(losses), list(masses), float(p_inf)
        finite = [lv for lv, mv in zip(self.losses, self.masses, strict=True) if mv > 0 and math.isfinite(lv)]
        self.lo = min(finite) if finite else 0.0
        self.hi = max(finite) if finite else 0.0

    def loss_range(self, tail: float, max_loss: float) -> tuple[float, float]:
        return max(self.lo, -max_loss), min(self.hi, max_loss)

    def discretise(self, interval: float, tail: float, max_loss: float) -> DiscretePLD:
        losses = [lv if lv <= max_loss else math.inf for lv in self.losses]
        losses = [max(lv, -max_loss) for lv in losses]
        return _ctd_atoms(losses, self.masses, self.p_inf, interval)


def epsilon_delta_pair(epsilon: float, delta: float) -> AtomPair:
    """The dominating pair of (eps, delta)-DP: losses +inf (mass delta), eps and -eps.

    Dong, Roth & Su 2022 (arXiv:1905.02383), Prop. 2.5: f_(eps,delta) is the tradeoff function of
    P = (delta, (1-delta) e^eps/(1+e^eps), (1-delta)/(1+e^eps), 0) vs Q = reversed P.
    """
    if epsilon == 0.0:
        return AtomPair([0.0], [1.0 - delta], delta)
    hi = (1.0 - delta) / (1.0 + math.exp(-epsilon))
    lo = (1.0 - delta) / (1.0 + math.exp(epsilon))
    return AtomPair([epsilon, -epsilon], [hi, lo], delta)


def randomized_response_pair(noise_parameter: float, num_buckets: int) -> AtomPair:
    """Exact pair of k-ary randomized response under replace-one: P = (1-p+p/k, p/k, ..., p/k),
    Q with the first two entries swapped (losses log(a/b), log(b/a) and 0)."""
    p, k = noise_parameter, num_buckets
    if k == 1 or p == 1.0:
        return AtomPair([0.0], [1.0])
    if p == 0.0:
        return AtomPair([], [], 1.0)
    a, b = 1.0 - p + p / k, p / k
    return AtomPair([math.log(a / b), math.log(b / a), 0.0], [a, b, (k - 2) * b])


class GaussianPair(LossPair):
    """P = N(mu, 1), Q = N(0, 1): L ~ N(mu^2/2, mu^2) under P and N(-mu^2/2, mu^2) under Q (symmetric)."""

    def __init__(self, mu: float) -> None:
        self.mu = float(mu)

    def loss_range(self, tail: float, max_loss: float) -> tuple[float, float]:
        z = -float(special.ndtri(tail))  # P(N(0,1) > z) = tail
        lo, hi = 0.5 * self.mu**2 - self.mu * z, 0.5 * self.mu**2 + self.mu * z
        return _clip_range(lo, hi, max_loss)

    def p_cdf(self, t):
        return special.ndtr((t - 0.5 * self.mu**2) / self.mu)

    def p_sf(self, t):
        return special.ndtr(-(t - 0.5 * self.mu**2) / self.mu)

    def q_cdf(self, t):
        return special.ndtr((t + 0.5 * self.mu**2) / self.mu)

    def q_sf(self, t):
        return special.ndtr(-(t + 0.5 * self.mu**2) / self.mu)


def _ginv(t: np.ndarray, q: float) -> np.ndarray:
    # Inverse of g(l) = log(1 - q + q e^l): g^-1(t) = log(e^t - 1 + q) - log q (expm1 keeps precision
    # just above t = log(1 - q), where almost all the mass of a subsampled loss sits). For t > 1 it is
    # t + log1p((q - 1) e^-t) - log q instead: expm1 overflows beyond ~709 nats, which would put
    # every larger loss at CDF 1 (an under-report).
    t = np.asarray(t, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        small = np.log(np.expm1(np.minimum(t, 1.0)) + q)
        large = t + np.log1p((q - 1.0) * np.exp(-np.maximum(t, 1.0)))
        return np.where(t > 1.0, large, small) - math.log(q)


def _subsampled_loss(q: float, log_ratio: float) -> float:
    """g(l) = log(1 - q + q e^l), the loss of a Poisson-subsampled pair whose inner loss is l. As log1p(q expm1(l))
    for l < 700: the log-sum-exp form rounds 1 - q + q (1 + l) back to exactly 1 for |l| below ~1e-16 (a noise
    multiplier above ~1e17): the loss range [log(1 - q), 0] then left out the mass above 0, which was put at an
    infinite loss (epsilon = inf)."""
    if log_ratio < 700.0:
        return float(math.log1p(q * math.expm1(log_ratio)))
    return float(np.logaddexp(math.log1p(-q), math.log(q) + log_ratio))


class SubsampledGaussianRemove(LossPair):
    """Poisson-subsampled Gaussian, remove direction: P = (1-q) N(0,1) + q N(mu,1), Q = N(0,1).

    L(x) = log(1 - q + q e^(mu x - mu^2/2)) is increasing in x, so CDFs are Gaussian CDFs at
    x(t) = (g^-1(t) + mu^2/2) / mu. (P, Q) and its reverse below are the dominating pairs of
    Poisson subsampling under add/remove (Zhu, Dong & Wang 2022, arXiv:2106.08567; Koskela et al.
    2020, arXiv:1906.03049).
    """

    def __init__(self, mu: float, q: float) -> None:
        self.mu, self.q = float(mu), float(q)
        self.lo = math.log1p(-q)

    def loss_range(self, tail: float, max_loss: float) -> tuple[float, float]:
        # P(L > L(x)) <= Phi(mu - x) <= tail for x = mu + z_tail (both mixture parts are below it).
        z = -float(special.ndtri(tail))
        hi = _subsampled_loss(self.q, 0.5 * self.mu**2 + self.mu * z)
        return _clip_range(self.lo, hi, max_loss)

    def _x(self, t):
        t = np.asarray(t, dtype=np.float64)
        x = (_ginv(t, self.q) + 0.5 * self.mu**2) / self.mu
        return np.where(t <= self.lo, -np.inf, x)

    def p_cdf(self, t):
        x = self._x(t)
        return (1.0 - self.q) * special.ndtr(x) + self.q * special.ndtr(x - self.mu)

    def p_sf(self, t):
        x = self._x(t)
        return (1.0 - self.q) * special.ndtr(-x) + self.q * special.ndtr(self.mu - x)

    def q_cdf(self, t):
        return special.ndtr(self._x(t))

    def q_sf(self, t):
        return special.ndtr(-self._x(t))

    def cdfs(self, t):
        x = self._x(t)
        a, na = special.ndtr(x), special.ndtr(-x)
        b, nb = special.ndtr(x - self.mu), special.ndtr(self.mu - x)
        return (1.0 - self.q) * a + self.q * b, (1.0 - self.q) * na + self.q * nb, a, na


class SubsampledGaussianAdd(LossPair):
    """Poisson-subsampled Gaussian, add direction: P = N(0,1), Q = (1-q) N(0,1) + q N(mu,1).

    L(x) = -log(1 - q + q e^(mu x - mu^2/2)) is decreasing in x; L <= t iff x >= x(-t).
    """

    def __init__(self, mu: float, q: float) -> None:
        self.mu, self.q = float(mu), float(q)
        self.hi = -math.log1p(-q)

    def loss_range(self, tail: float, max_loss: float) -> tuple[float, float]:
        # P(L < L(x)) = P(N(0,1) > x) = tail at x = z_tail.
        z = -float(special.ndtri(tail))
        lo = -_subsampled_loss(self.q, self.mu * z - 0.5 * self.mu**2)
        return _clip_range(lo, self.hi, max_loss)

    def _x(self, t):
        t = np.asarray(t, dtype=np.float64)
        x = (_ginv(-t, self.q) + 0.5 * self.mu**2) / self.mu
        return np.where(t >= self.hi, -np.inf, x)

    def p_cdf(self, t):
        return special.ndtr(-self._x(t))

    def p_sf(self, t):
        return special.ndtr(self._x(t))

    def q_cdf(self, t):
        x = self._x(t)
        return (1.0 - self.q) * special.ndtr(-x) + self.q * special.ndtr(self.mu - x)

    def q_sf(self, t):
        x = self._x(t)
        return (1.0 - self.q) * special.ndtr(x) + self.q * special.ndtr(x - self.mu)

    def cdfs(self, t):
        x = self._x(t)
        a, na = special.ndtr(x), special.ndtr(-x)
        b, nb = special.ndtr(x - self.mu), special.ndtr(self.mu - x)
        return na, a, (1.0 - self.q) * na + self.q * nb, (1.0 - self.q) * a + self.q * b


class LaplacePair(LossPair):
    """P = Lap(1, b), Q = Lap(0, b) with eps0 = 1/b: L = (|x| - |x-1|)/b in [-eps0, eps0] with atoms
    at both ends (Koskela, Jälkö & Honkela 2020, arXiv:1906.03049). Symmetric."""

    def __init__(self, eps0: float) -> None:
        self.eps0 = float(eps0)
        self.lo, self.hi = -self.eps0, self.eps0

    def p_cdf(self, t):
        t = np.asarray(t, dtype=np.float64)
        mid = 0.5 * np.exp(np.minimum(0.5 * (t - self.eps0), 0.0))
        return np.where(t < -self.eps0, 0.0, np.where(t >= self.eps0, 1.0, mid))

    def p_sf(self, t):
        return 1.0 - self.p_cdf(t)

    def q_cdf(self, t):
        t = np.asarray(t, dtype=np.float64)
        mid = 1.0 - 0.5 * np.exp(np.minimum(-0.5 * (t + self.eps0), 0.0))
        return np.where(t < -self.eps0, 0.0, np.where(t >= self.eps0, 1.0, mid))

    def q_sf(self, t):
        t = np.asarray(t, dtype=np.float64)
        mid = 0.5 * np.exp(np.minimum(-0.5 * (t + self.eps0), 0.0))
        return np.where(t < -self.eps0, 1.0, np.where(t >= self.eps0, 0.0, mid))


class MixturePair(LossPair):
    """Pair whose P and Q are mixtures sharing a *public* mixing variable: the PLD is the mixture
    of the component PLDs, and connect-the-dots is linear in the interval masses, so components
    are discretised separately and added (each with the full tail budget scaled by its weight)."""

    def __init__(
        self,
        components: list[tuple[float, LossPair]],
        max_points: int = 10_000,
        *,
        light_points: int | None = None,
        light_weight: float = 1e-3,
    ) -> None:
        self.components = [(float(wt), c) for wt, c in components if wt > 0.0]
        self.p_inf = 0.0
        self.max_points = max_points
        # Components of weight < light_weight may use a coarser grid (light_points per component).
        self.light_points = max_points if light_points is None else light_points
        self.light_weight = light_weight

    def loss_range(self, tail: float, max_loss: float) -> tuple[float, float]:
        rs = [c.loss_range(tail, max_loss) for _, c in self.components]
        return min(r[0] for r in rs), max(r[1] for r in rs)

    def discretise(self, interval: float, tail: float, max_loss: float) -> DiscretePLD:
        parts = []
        for wt, c in self.components:
            # Wide components are discretised on a coarser grid (a multiple of ``interval``, so its
            # points are grid points too); connect-the-dots is pessimistic on any grid.
            lo, hi = c.loss_range(tail, max_loss)
            points = self.max_points if wt >= self.light_weight else self.light_points
            mult = max(1, math.ceil((hi - lo) / (interval * points)))
            parts.append((wt, mult, c.discretise(interval * mult, tail, max_loss)))
        # Part k sits at fine-grid indices (offset + i) * mult: added with a stride (no upsampled copy).
        offset = min(p.offset * m for _, m, p in parts)
        top = max((p.offset + p.probs.size - 1) * m + 1 for _, m, p in parts)
        probs = np.zeros(top - offset)
        inf_mass = 0.0
        for wt, mult, part in parts:
            start = part.offset * mult - offset
            probs[start : start + (part.probs.size - 1) * mult + 1 : mult] += wt * part.probs
            inf_mass += wt * part.inf_mass
        return DiscretePLD(interval, offset, probs, inf_mass)


def non_private_pair() -> AtomPair:
    return AtomPair([], [], 1.0)


def gaussian_or_trivial_pair(mu: float) -> LossPair:
    if not math.isfinite(mu):
        return non_private_pair()
    return AtomPair([0.0], [1.0]) if mu == 0.0 else GaussianPair(mu)


def subsampled_non_private_pairs(q: float) -> tuple[AtomPair, AtomPair | None]:
    """Poisson subsampling (rate q) of a mechanism with P, Q mutually singular (mu = inf).

    Remove: P = (1-q) Q0 + q P1 vs Q0 -> loss +inf (mass q), log(1-q) (mass 1-q).
    Add: P = Q0 vs (1-q) Q0 + q P1 -> loss -log(1-q) (mass 1). For q = 1 both are +inf.
    """
    if q >= 1.0:
        return non_private_pair(), None
    lq = math.log1p(-q)
    return AtomPair([lq], [1.0 - q], q), AtomPair([-lq], [1.0])
