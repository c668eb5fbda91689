"""Independent high-precision references for the DP-SGD-JL accountant (no dpaudit code used),
with self-checks of the oracle itself (the tests at the bottom).

Mechanism (seed paper arXiv:2102.03013, Lemma 4.3 and Thm. 4.1): mu = Z_r / sigma with
Z_r = 1/sqrt(chi2_r / r) public; remove direction P = (1-q) N(0,1) + q N(mu,1) vs Q = N(0,1),
add direction the reverse.

1. ``single_step_delta``: delta(eps) = E_Z[delta_mu(eps)] by adaptive quadrature over log z of
   the closed-form hockey-stick divergence of each (subsampled) Gaussian pair.
2. ``loss_cdfs``: CDFs of the remove-direction privacy loss L = log(1 - q + q e^(mu x - mu^2/2))
   of the *mixture*, written as expectations over the light-tailed N ~ N(0,1) of the exact chi^2
   CDF (so the heavy tail of Z_r sits in a closed form, not in a quadrature):
       x = N under branch 0 (and under Q), x = mu + N under branch 1; with a = log((e^t-1+q)/q),
       {L <= t} = {mu^2 -/+ 2 N mu + 2a >= / <= 0}, a quadratic in mu solved exactly.
   With G(m) = P(mu <= m) and k = sqrt(2|a|):
       H(k) = E[G(N + sqrt(N^2 + k^2))],
       J(k) = int_0^inf phi(m) [G(m+v) - G(m-v)] v/m dv,  m = sqrt(k^2 + v^2)  (substitution
              v = sqrt(N^2 - k^2) removes the square-root kink at N = k),
       a >= 0: P(L <= t) = (1-q)(1 - J) + q H,   Q(L <= t) = 1 - J;
       a <  0: P(L <= t) = (1-q)(1 - H) + q J,   Q(L <= t) = 1 - H.
   Composite 10-point Gauss-Legendre over N (panels of width 0.5 on [-12, 12], 1/16 on [-1, 1],
   plus panels at the scale of k).
3. ``BracketPLD``: from the same CDFs, a pessimistic PMF (connect-the-dots split onto bin ends,
   preserving P- and Q-mass: Doroshenko et al. 2022, arXiv:2207.04380; mass above the top ->
   +inf) and an optimistic one (each bin's mass at its lower end; mass above the top at the top),
   composed T times by FFT squaring. delta(eps) = E_P[(1 - e^(eps - sum L))_+] is increasing in
   every loss, so rounding down gives a lower bound and the mean-preserving spread an upper one.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, signal, special, stats

_GL_X, _GL_W = np.polynomial.legendre.leggauss(10)


def _pair_delta(mu: float, q: float, eps: float, direction: str) -> float:
    # Closed-form hockey-stick divergences (e^eps Phi(x) as exp(eps + log Phi(x)): no overflow).
    def e_phi(x: float) -> float:
        return math.exp(eps + special.log_ndtr(x))

    if q >= 1.0:
        return float(special.ndtr(-eps / mu + mu / 2) - e_phi(-eps / mu - mu / 2))
    if direction == "remove":
        g_inv = eps + math.log1p((q - 1.0) * math.exp(-eps)) - math.log(q)  # log((e^eps - 1 + q) / q)
        x = (g_inv + mu * mu / 2) / mu
        return float((1 - q) * special.ndtr(-x) + q * special.ndtr(mu - x) - e_phi(-x))
    if eps >= -math.log1p(-q):
        return 0.0
    x = (math.log((math.expm1(-eps) + q) / q) + mu * mu / 2) / mu
    return float(special.ndtr(x) - math.exp(eps) * ((1 - q) * special.ndtr(x) + q * special.ndtr(x - mu)))


def single_step_delta(sigma: float, r: int, q: float, eps: float, direction: str = "remove") -> float:
    """E_{Z_r}[delta_(Z_r/sigma)(eps)] by scipy quad over u = log z (density of Z_r from Prop. B.4)."""

    def density_log_z(u: float) -> float:  # f_Z(z) z with Z = sqrt(r / W), W ~ chi2_r
        z = math.exp(u)
        w = r / (z * z)
        return math.exp(stats.chi2.logpdf(w, r)) * 2.0 * w

    def integrand(u: float) -> float:
        return max(_pair_delta(math.exp(u) / sigma, q, eps, direction), 0.0) * density_log_z(u)

    z_eps = math.log(sigma * math.sqrt(2.0 * max(eps, 1e-3)))
    pts = sorted({-1.0, 0.0, 1.0, z_eps - 1, z_eps, z_eps + 1})
    edges = [-8.0, *pts, 40.0]
    return sum(
        integrate.quad(integrand, a, b, limit=400, epsabs=0.0, epsrel=1e-11)[0] for a, b in itertools.pairwise(edges)
    )


class MixtureLoss:
    """Remove-direction loss CDFs of the DP-SGD-JL step (module docstring, item 2)."""

    def __init__(self, sigma: float, r: int, q: float) -> None:
        self.sigma, self.r, self.q = float(sigma), int(r), float(q)
        self.lo = math.log1p(-q) if q < 1.0 else -math.inf

    def _g(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # (P(mu <= m), P(mu > m)) for mu = Z_r / sigma, each accurate in its own small tail.
        m = np.asarray(m, dtype=np.float64)
        with np.errstate(divide="ignore", over="ignore"):
            half_w = 0.5 * self.r / np.square(self.sigma * np.maximum(m, 1e-300))
        gbar = special.gammainc(0.5 * self.r, half_w)  # chi2_r CDF at w = P(mu > m)
        g = 1.0 - gbar
        big = gbar > 0.5  # there P(mu <= m) is small: evaluate it directly
        g[big] = special.gammaincc(0.5 * self.r, half_w[big])
        return g, gbar

    @staticmethod
    def _nodes(k: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        fixed = np.union1d(np.arange(lo, hi + 1e-12, 0.5), np.arange(max(lo, -1.0), 1.0 + 1e-12, 0.0625))
        extra = np.clip(np.outer(k, [0.05, 0.2, 0.5, 2.0]), lo, hi)
        if lo < 0:
            extra = np.concatenate([extra, -extra], axis=1)
        br = np.sort(np.concatenate([np.broadcast_to(fixed, (k.size, fixed.size)), extra], axis=1), axis=1)
        a, b = br[:, :-1, None], br[:, 1:, None]
        x = 0.5 * (a + b) + 0.5 * (b - a) * _GL_X
        w = 0.5 * (b - a) * _GL_W
        return x.reshape(k.size, -1), w.reshape(k.size, -1)

    def _h(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, wt = self._nodes(k, -12.0, 12.0)
        kk = k[:, None] ** 2
        s = np.sqrt(n * n + kk)
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.where(n >= 0, n + s, kk / (s - n))
        g, gbar = self._g(m)
        phi = np.exp(-0.5 * n * n) / math.sqrt(2 * math.pi) * wt
        return np.sum(phi * g, axis=1), np.sum(phi * gbar, axis=1)

    def _j(self, k: np.ndarray) -> np.ndarray:
        v, wt = self._nodes(k, 0.0, 12.0)
        kk = k[:, None] ** 2
        m = np.sqrt(kk + v * v)
        lower = np.where(m + v > 0, kk / np.maximum(m + v, 1e-300), 0.0)  # m - v without cancellation
        g_hi, gb_hi = self._g(m + v)
        g_lo, gb_lo = self._g(lower)
        g_lo = np.where(lower > 0, g_lo, 0.0)
        gb_lo = np.where(lower > 0, gb_lo, 1.0)
        diff = np.where(g_lo > 0.5, gb_lo - gb_hi, g_hi - g_lo)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(m > 0, v / m, 1.0)
        phi = np.exp(-0.5 * m * m) / math.sqrt(2 * math.pi) * wt
        return np.sum(phi * np.maximum(diff, 0.0) * ratio, axis=1)

    def cdfs(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(P(L <= t), P(L > t), Q(L <= t), Q(L > t)) for an array of losses t > log(1-q)."""
        t = t0 = np.asarray(t, dtype=np.float64)
        q = self.q
        if q >= 1.0:
            a = t
        else:
            t = np.maximum(t, self.lo + 1e-12)  # t <= log(1-q) is handled at the end
            big = t > 1.0
            a = np.where(
                big,
                t + np.log1p((q - 1.0) * np.exp(-np.maximum(t, 1.0))),
                np.log(np.expm1(np.minimum(t, 1.0)) + q),
            ) - math.log(q)
        k = np.sqrt(2.0 * np.abs(a))
        h, hbar = self._h(k)
        j = self._j(k)
        pos = a >= 0
        p_cdf = np.where(pos, (1 - q) * (1 - j) + q * h, (1 - q) * hbar + q * j)
        p_sf = np.where(pos, (1 - q) * j + q * hbar, (1 - q) * h + q * (1 - j))
        q_cdf = np.where(pos, 1 - j, hbar)
        q_sf = np.where(pos, j, h)
        below = t0 <= self.lo  # L > log(1-q) surely
        return (
            np.where(below, 0.0, p_cdf),
            np.where(below, 1.0, p_sf),
            np.where(below, 0.0, q_cdf),
            np.where(below, 1.0, q_sf),
        )


class BracketPLD:
    """Lower and upper bounds on delta(eps) / eps(delta) of ``steps`` compositions (module docstring)."""

    def __init__(self, loss: MixtureLoss, steps: int, *, top: float, h: float, fine_until: float, rel: float):
        q = loss.q
        start = math.floor(loss.lo / h) if q < 1.0 else math.floor(-top / h)
        idx = list(range(start, math.ceil(fine_until / h) + 1))
        i = idx[-1]
        while i * h < top:  # geometric bin ends above fine_until
            i = max(i + 1, round(i * (1 + rel)))
            idx.append(i)
        idx = np.array(idx)
        b = idx * h
        p_cdf, p_sf, q_cdf, q_sf = loss.cdfs(b)
        m = np.maximum(np.where(p_cdf[1:] <= 0.5, np.diff(p_cdf), -np.diff(p_sf)), 0.0)
        w = np.maximum(np.where(q_cdf[1:] <= 0.5, np.diff(q_cdf), -np.diff(q_sf)), 0.0)
        n = idx[-1] - idx[0] + 1
        up, low = np.zeros(n), np.zeros(n)
        pos = idx - idx[0]
        # Pessimistic: split (m, w) of bin (b_i, b_(i+1)] onto its ends preserving both masses.
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = -np.expm1(np.log(w) - np.log(m) + b[:-1]) / -np.expm1(-(b[1:] - b[:-1]))
        frac = np.where(m > 0, np.clip(np.nan_to_num(frac, nan=1.0), 0.0, 1.0), 0.0)
        np.add.at(up, pos[:-1], m * (1 - frac))
        np.add.at(up, pos[1:], m * frac)
        up[0] += max(p_cdf[0], 0.0)
        np.add.at(low, pos[:-1], m)  # mass below the grid is dropped (loss -inf: optimistic)
        low[-1] += p_sf[-1]
        self.h, self.steps = h, steps
        self.upper = self._compose(up, idx[0], p_sf[-1], steps, top, pessimistic=True)
        self.lower = self._compose(low, idx[0], 0.0, steps, top, pessimistic=False)

    def _compose(self, p, offset, inf_mass, steps, top, *, pessimistic):
        top_idx = math.floor(top / self.h)

        def mult(a, b):
            (pa, oa, ia), (pb, ob, ib) = a, b
            c = np.maximum(signal.fftconvolve(pa, pb), 0.0)
            o = oa + ob
            keep = top_idx - o + 1
            fa, fb = float(pa.sum()), float(pb.sum())
            inf = (fa + ia) * (fb + ib) - fa * fb  # a sum with an infinite term is infinite
            if keep < c.size:
                over = float(c[keep:].sum())
                c = c[:keep].copy()
                if pessimistic:
                    inf += over
                else:
                    c[-1] += over
            return c, o, inf

        result, base, k = None, (p, offset, inf_mass), steps
        while k:
            if k & 1:
                result = base if result is None else mult(result, base)
            k >>= 1
            if k:
                base = mult(base, base)
        return result

    def _delta(self, which, eps: float) -> float:
        p, o, inf = which
        losses = (o + np.arange(p.size)) * self.h
        sel = losses > eps
        return float(inf + np.sum(p[sel] * -np.expm1(eps - losses[sel])))

    def delta(self, eps: float) -> tuple[float, float]:
        return self._delta(self.lower, eps), self._delta(self.upper, eps)

    def epsilon(self, delta: float) -> tuple[float, float]:
        """(lower, upper) bracket on the smallest eps with delta(eps) <= delta."""
        out = []
        for which in (self.lower, self.upper):
            lo, hi = 0.0, (which[1] + which[0].size) * self.h
            if self._delta(which, hi) > delta:
                out.append(math.inf)
                continue
            for _ in range(80):
                mid = 0.5 * (lo + hi)
                if self._delta(which, mid) <= delta:
                    hi = mid
                else:
                    lo = mid
            out.append(hi)
        return out[0], out[1]


# -- self-checks of the oracle ----------------------------------------------------------------------


def _cdf_by_z_quadrature(sigma: float, r: int, q: float, t: float) -> float:
    # P(L <= t) = E_Z[(1-q) Phi(a/mu + mu/2) + q Phi(a/mu - mu/2)] by adaptive quadrature over log z.
    a = math.log((math.expm1(t) + q) / q) if q < 1.0 else t

    def f(u: float) -> float:
        z = math.exp(u)
        mu, w = z / sigma, r / (z * z)
        dens = math.exp(stats.chi2.logpdf(w, r)) * 2.0 * w
        return ((1 - q) * special.ndtr(a / mu + mu / 2) + q * special.ndtr(a / mu - mu / 2)) * dens

    edges = [-8.0, -1.0, 0.0, 1.0, 3.0, 40.0]
    return sum(integrate.quad(f, x, y, limit=400, epsabs=0.0, epsrel=1e-12)[0] for x, y in itertools.pairwise(edges))


@pytest.mark.parametrize(("sigma", "r", "q"), [(1.3, 4, 0.0043), (0.5, 20, 0.01), (1.0, 2, 1.0)])
def test_oracle_loss_cdf_matches_direct_quadrature(sigma, r, q):
    loss = MixtureLoss(sigma, r, q)
    ts = np.array([-0.001, 0.0, 0.003, 0.5, 3.0, 50.0]) if q < 1 else np.array([-3.0, -0.5, 0.0, 0.5, 3.0, 50.0])
    p_cdf, p_sf, _, _ = loss.cdfs(ts)
    ref = np.array([_cdf_by_z_quadrature(sigma, r, q, t) for t in ts])
    np.testing.assert_allclose(p_cdf, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(p_cdf + p_sf, 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("sigma", "r", "q", "eps"), [(1.3, 4, 1.0, 2.1), (1.0, 8, 0.05, 1.0)])
def test_oracle_bracket_contains_single_step_quadrature(sigma, r, q, eps):
    # Two independent routes to one step: the bracket from the N-integral CDFs, and adaptive
    # quadrature of the closed-form hockey-stick over z. (Large r is out of the oracle's range: the
    # chi^2 CDF becomes a step the fixed Gauss-Legendre panels do not resolve.)
    exact = single_step_delta(sigma, r, q, eps)
    lo, up = BracketPLD(MixtureLoss(sigma, r, q), 1, top=25.0, h=2e-3, fine_until=0.5, rel=2e-3).delta(eps)
    assert lo <= exact * (1 + 1e-12)  # equality up to rounding when eps is a grid point
    assert exact <= up
    assert up / lo < 1.01
