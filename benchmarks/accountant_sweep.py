"""Metamorphic and oracle sweep of every public accountant entry point, over wide parameter ranges.

    nice python benchmarks/accountant_sweep.py                 # every section, default budget (a few minutes)
    nice python benchmarks/accountant_sweep.py --seed 1 --scale 2 --sections gauss,rdp

Where benchmarks/accounting_fuzz.py compares against peers where users work (sigma 0.3..50, q 1e-5..1,
delta 1e-12..0.1), this sweep draws the parameters log-uniformly over the whole accepted range, extremes
included: sigma 1e-3..1e4, q 1e-8..1 (q = 1 exactly in 1/8 of draws), steps 1..1e7, delta 1e-300..0.5,
epsilon 0 or 1e-6..1e3, fractional orders. It checks properties that must hold whatever the numbers:

* monotonicity: epsilon non-decreasing in steps and q, non-increasing in sigma and delta; delta(epsilon)
  non-increasing; calibrated sigma non-increasing in the target epsilon;
* consistency: k1 then k2 steps = k1 + k2 steps; q = 1 = no subsampling; GDP mu composes as sqrt(k) mu;
  delta(epsilon(d)) <= d; zCDP's CKS conversion <= Bun-Steinke Prop. 1.3; advanced composition's closed form;
* soundness against exact values (mpmath, precision raised until two precisions agree): Balle & Wang 2018
  Thm. 8 for the Gaussian (every formal accountant's epsilon >= it), the hockey-stick of one
  Poisson-subsampled Gaussian step; dp_accounting's optimistic PLD (a lower bound on the true epsilon);
* hygiene: no NaN/inf where a finite value is due, epsilon >= 0, delta in [0, 1], no warnings other than the
  documented ones (PLD below delta 1e-12, GDP's CLT), no exception other than dpaudit's own errors;
* calibration round trip: the sigma returned meets the target and sigma (1 - 2 tol) does not.

Every check is counted; a violation prints its setting. The summary prints checks and violations per
section. Violations of "sound" checks are under-reported privacy claims.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
import warnings
from collections import defaultdict

import mpmath
import numpy as np

# The exact hockey-stick δ(ε) of one Poisson-subsampled Gaussian step (Zhu, Dong & Wang 2022), 60 digits: one
# implementation, in the accountants' fuzzer beside this file (run as a script, this folder is sys.path[0]).
from accounting_fuzz import mp_sgm_delta

import dpaudit.accounting as A
from dpaudit.accounting.rdp import RdpAccountant, rdp_to_delta, rdp_to_epsilon
from dpaudit.accounting.zcdp import ZcdpAccountant, zcdp_delta
from dpaudit.errors import DPAuditError
from dpaudit.events import Gaussian, PoissonSampled, SelfComposed

logging.getLogger("absl").setLevel(logging.ERROR)

EXPECTED_WARNINGS = ("below delta", "central limit theorem", "delta < 1e-12", "1e-12")

CHECKS: dict[str, int] = defaultdict(int)
VIOLATIONS: dict[str, list[str]] = defaultdict(list)
INFO: dict[str, list[str]] = defaultdict(list)


def check(name: str, ok: bool, setting: str) -> None:
    CHECKS[name] += 1
    if not ok:
        VIOLATIONS[name].append(setting)


def guarded(name: str, setting: str, fn, *args, **kw):
    """Call fn; an exception other than DPAuditError or a warning outside the documented ones is a violation.
    Returns (value or None, exception or None)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn(*args, **kw)
            exc = None
        except DPAuditError as e:
            out, exc = None, e
        except Exception as e:  # the point is to catch what should not happen
            out, exc = None, e
            check(f"{name}: no foreign exception", False, f"{setting}: {type(e).__name__}: {e}")
    bad = [str(w.message) for w in caught if not any(s in str(w.message) for s in EXPECTED_WARNINGS)]
    check(f"{name}: no unexpected warning", not bad, f"{setting}: {bad[:2]}")
    return out, exc


def composed_eps(acc, delta, *events):
    """epsilon(delta) of ``acc`` after composing ``events`` in order."""
    for ev in events:
        acc.compose(ev)
    return acc.epsilon(delta)


def lu(rng, lo, hi) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def draw_sigma(rng):
    return lu(rng, 1e-3, 1e4)


def draw_q(rng):
    return 1.0 if rng.random() < 0.125 else lu(rng, 1e-8, 1.0)


def draw_steps(rng, hi=1e7):
    return max(1, round(lu(rng, 1.0, hi)))


def draw_delta(rng, lo=1e-300):
    return lu(rng, lo, 0.5)


def draw_eps(rng):
    return 0.0 if rng.random() < 0.1 else lu(rng, 1e-6, 1e3)


# ---------------------------------------------------------------------------------------------- oracles


def mp_gauss_delta(mu: float, eps: float) -> mpmath.mpf:
    """Balle & Wang 2018 Thm. 8, delta = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu), at a precision raised until
    two precisions agree to 1e-25 relative (cancellation can eat many digits at small mu)."""
    prev = None
    base = 50 + max(0, int(-math.log10(mu))) if mu > 0 else 50  # Phi(mu/2) - Phi(-mu/2) ~ mu: digits lost
    for dps in (base, 2 * base, 4 * base, 8 * base):
        with mpmath.workdps(dps):
            m, e = mpmath.mpf(mu), mpmath.mpf(eps)
            d = mpmath.ncdf(m / 2 - e / m) - mpmath.exp(e) * mpmath.ncdf(-m / 2 - e / m)
            d = max(d, mpmath.mpf(0))
            if prev is not None and d > 0 and abs(d - prev) <= mpmath.mpf(10) ** -25 * abs(d):
                return +d
            prev = d
    return prev


def mp_gauss_eps(mu: float, delta: float) -> float:
    """Exact epsilon(delta) of mu-GDP by bisection on mp_gauss_delta; returns an interval (lo, hi) around it."""
    if mp_gauss_delta(mu, 0.0) <= delta:
        return 0.0, 0.0
    lo, hi = 0.0, max(1.0, mu * (45 + mu))
    while mp_gauss_delta(mu, hi) > delta:
        lo, hi = hi, 2 * hi
    for _ in range(120):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if mp_gauss_delta(mu, mid) > delta:
            lo = mid
        else:
            hi = mid
    return lo, hi


def le(a: float, b: float, rel: float = 0.0, abs_: float = 0.0) -> bool:
    return a <= b + rel * abs(b) + abs_


# ---------------------------------------------------------------------------------------------- sections


def sec_gauss(rng, n: int) -> None:
    """gdp_delta / gdp_epsilon / analytic_gaussian_* / gdp_mu_from_epsilon_delta against Balle & Wang Thm. 8."""
    for _ in range(n):
        sigma, eps, delta = draw_sigma(rng), draw_eps(rng), draw_delta(rng)
        mu = 1.0 / sigma
        s = f"sigma={sigma!r},eps={eps!r},delta={delta!r}"
        d, _ = guarded("gauss", s, A.analytic_gaussian_delta, sigma, eps)
        # the exact delta at sensitivity 1 and this sigma: mu = 1/sigma in exact arithmetic
        with mpmath.workdps(60):
            mu_exact = 1 / mpmath.mpf(sigma)
        exact = mp_gauss_delta(float(mu_exact), eps)  # float(mu) rounded to nearest; checked with the up-rounded
        exact_up = mp_gauss_delta(float(np.nextafter(float(mu_exact), np.inf)), eps)
        if d is not None:
            check("analytic_gaussian_delta in [0,1]", 0.0 <= d <= 1.0, s)
            check("analytic_gaussian_delta >= exact (sound)", d >= float(min(exact, exact_up)) * (1 - 1e-15), s)
            check("analytic_gaussian_delta <= exact (1+1e-9) (tight)", le(d, float(exact_up), 1e-9, 1e-320), s)
            d2, _ = guarded("gauss", s, A.gdp_delta, mu, eps * 1.5 + 1e-3)
            check("gdp_delta non-increasing in eps", d2 is not None and d2 <= d, s)
            d3, _ = guarded("gauss", s, A.gdp_delta, mu * 1.5, eps)
            if d3 is not None:
                gd, _ = guarded("gauss", s, A.gdp_delta, mu, eps)
                check("gdp_delta non-decreasing in mu", gd is not None and d3 >= gd, s)
        e, _ = guarded("gauss", s, A.analytic_gaussian_epsilon, sigma, delta)
        if e is not None:
            check("analytic_gaussian_epsilon finite, >= 0", math.isfinite(e) and e >= 0.0, s)
            _, hi = mp_gauss_eps(float(np.nextafter(mu, np.inf)), delta)
            if math.isfinite(e):
                # sound: the exact delta at the returned epsilon (mu rounded either way) is <= delta
                check(
                    "analytic_gaussian_epsilon: exact delta at it <= delta (sound)", mp_gauss_delta(mu, e) <= delta, s
                )
                check("analytic_gaussian_epsilon <= exact (1+1e-9) (tight)", le(e, hi, 1e-9, 1e-300), s)
            e2, _ = guarded("gauss", s, A.gdp_epsilon, mu, min(0.9, delta * 10))
            check("gdp_epsilon non-increasing in delta", e2 is not None and e2 <= e, s)
            e3, _ = guarded("gauss", s, A.gdp_epsilon, mu * 1.1, delta)
            ge, _ = guarded("gauss", s, A.gdp_epsilon, mu, delta)
            check("gdp_epsilon non-decreasing in mu", e3 is not None and ge is not None and e3 >= ge, s)
            if math.isfinite(e):
                dd, _ = guarded("gauss", s, A.gdp_delta, mu, ge)
                check("gdp_delta(gdp_epsilon(d)) <= d", dd is not None and dd <= delta, s)
        # sigma search (Balle & Wang Alg. 1)
        eps_t = lu(rng, 1e-4, 1e3) if rng.random() < 0.9 else 0.0
        dt = draw_delta(rng)
        st = f"eps={eps_t!r},delta={dt!r}"
        sg, _ = guarded("gauss", st, A.analytic_gaussian_sigma, eps_t, dt)
        if sg is not None:
            check(
                "analytic_gaussian_sigma: exact delta at it <= delta (sound)", mp_gauss_delta(1 / sg, eps_t) <= dt, st
            )
            check(
                "analytic_gaussian_sigma: sigma (1 - 1e-9) fails (tight)",
                mp_gauss_delta(1 / (sg * (1 - 1e-9)), eps_t) > dt,
                st,
            )
            sg2, _ = guarded("gauss", st, A.analytic_gaussian_sigma, eps_t * 1.3 + 1e-6, dt)
            check("analytic_gaussian_sigma non-increasing in eps", sg2 is not None and sg2 <= sg, st)
        # mu implied by an (eps, delta) point
        mu_i, _ = guarded("gauss", st, A.gdp_mu_from_epsilon_delta, eps_t, dt)
        if mu_i is not None:
            check(
                "gdp_mu_from_epsilon_delta: exact delta(mu) within 1e-9 of delta",
                abs(mp_gauss_delta(mu_i, eps_t) / dt - 1) <= 1e-9 or dt < 1e-290,
                f"{st}: mu={mu_i!r} exact={mpmath.nstr(mp_gauss_delta(mu_i, eps_t), 8)}",
            )


def sec_zcdp(rng, n: int) -> None:
    """zCDP conversions: CKS (Cor. 13) <= Bun-Steinke Prop. 1.3; >= the exact Gaussian epsilon at mu = sqrt(2 rho);
    zcdp_delta(zcdp_epsilon(d)) <= d; monotone; the accountant composes rho."""
    for _ in range(n):
        rho, delta = lu(rng, 1e-12, 1e6), draw_delta(rng)
        s = f"rho={rho!r},delta={delta!r}"
        e, _ = guarded("zcdp", s, A.zcdp_epsilon, rho, delta)
        es, _ = guarded("zcdp", s, A.zcdp_epsilon_simple, rho, delta)
        if e is None or es is None:
            continue
        check("zcdp_epsilon finite >= 0", math.isfinite(e) and e >= 0, s)
        check("zcdp_epsilon <= zcdp_epsilon_simple", e <= es, s)
        mu = math.sqrt(2 * rho)
        check(
            "zcdp_epsilon >= exact Gaussian at mu=sqrt(2 rho) (sound)", mp_gauss_delta(mu, e) <= delta * (1 + 1e-9), s
        )
        e2, _ = guarded("zcdp", s, A.zcdp_epsilon, rho * 1.5, delta)
        check("zcdp_epsilon non-decreasing in rho", e2 is not None and e2 >= e, s)
        e3, _ = guarded("zcdp", s, A.zcdp_epsilon, rho, min(0.9, delta * 10))
        check("zcdp_epsilon non-increasing in delta", e3 is not None and e3 <= e, s)
        dd, _ = guarded("zcdp", s, zcdp_delta, rho, e)
        if dd is not None:
            check("zcdp_delta(zcdp_epsilon(d)) <= d (1+1e-6)", dd <= delta * (1 + 1e-6), f"{s}: {dd!r}")
            check("zcdp_delta >= exact Gaussian delta (sound)", dd >= float(mp_gauss_delta(mu, e)) * (1 - 1e-9), s)
        # accountant: k Gaussians of sigma compose to rho = k / (2 sigma^2)
        sigma, k = draw_sigma(rng), draw_steps(rng, 1e6)
        sk = f"sigma={sigma!r},k={k},delta={delta!r}"
        acc = ZcdpAccountant()
        ea, _ = guarded("zcdp", sk, composed_eps, acc, delta, SelfComposed(Gaussian(sigma), k))
        er, _ = guarded("zcdp", sk, A.zcdp_epsilon, k / (2 * sigma * sigma), delta)
        if ea is not None and er is not None:
            check(
                "ZcdpAccountant(k Gaussians) = zcdp_epsilon(k/(2 s^2)) (1e-9)",
                abs(ea - er) <= 1e-9 * max(er, 1e-300),
                sk,
            )


def sec_classic(rng, n: int) -> None:
    """Advanced composition (Dwork & Roth Thm. 3.20) closed form in mpmath; amplification monotone, identity at q=1."""
    for _ in range(n):
        eps, dl, k, dp = lu(rng, 1e-6, 1e3), draw_delta(rng), draw_steps(rng, 1e7), draw_delta(rng)
        s = f"eps={eps!r},delta={dl!r},k={k},dp={dp!r}"
        out, _ = guarded("classic", s, A.advanced_composition, eps, dl, k, dp)
        if out is None:
            continue
        with mpmath.workdps(50):
            e_ = mpmath.mpf(eps)
            ref = mpmath.sqrt(2 * k * mpmath.log(1 / mpmath.mpf(dp))) * e_ + k * e_ * mpmath.expm1(e_)
        check("advanced_composition eps >= closed form (1-1e-14) (sound)", out[0] >= float(ref) * (1 - 1e-14), s)
        check("advanced_composition delta = min(1, k d + d')", out[1] >= min(1.0, k * dl + dp) * (1 - 1e-15), s)
        out2, _ = guarded("classic", s, A.advanced_composition, eps, dl, k + 1, dp)
        check("advanced_composition non-decreasing in k", out2 is not None and out2[0] >= out[0], s)
        q = draw_q(rng)
        am, _ = guarded("classic", s, A.amplification_by_subsampling, eps, dl, q)
        if am is not None:
            with mpmath.workdps(50):
                ref = mpmath.log1p(mpmath.mpf(q) * mpmath.expm1(mpmath.mpf(eps)))
            check("amplification eps >= exact (1-1e-14) (sound)", am[0] >= float(ref) * (1 - 1e-14), f"{s},q={q!r}")
            check("amplification eps <= eps", am[0] <= eps, f"{s},q={q!r}")
        am1, _ = guarded("classic", s, A.amplification_by_subsampling, eps, dl, 1.0)
        check("amplification at q=1 is the identity", am1 is not None and am1[0] == eps and am1[1] == dl, s)


def _acc_eps(name: str, sigma, q, steps, delta, setting):
    ev = A.dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps)
    return guarded(name, setting, A.epsilon_for, ev, delta, name)


def sec_accountant(rng, n: int, name: str, step_hi: float, delta_lo: float) -> None:
    """RDP or PLD accountant: hygiene, monotonicity, composition, q = 1, soundness against exact values."""
    refusals = 0
    for _ in range(n):
        sigma, q, steps, delta = draw_sigma(rng), draw_q(rng), draw_steps(rng, step_hi), draw_delta(rng, delta_lo)
        if rng.random() < 0.15:
            steps = 1  # one step: the exact Poisson-subsampled Gaussian is the oracle
        if name == "pld":
            sigma = max(sigma, 0.3)  # small sigma: minutes a PLD (checked at sigma >= 0.05 once: 419 checks, 0 flags)
        s = f"{name}:sigma={sigma!r},q={q!r},T={steps},delta={delta!r}"
        e, _ = _acc_eps(name, sigma, q, steps, delta, s)
        if e is None:
            refusals += 1
            continue
        check(f"{name}: eps >= 0, not NaN", e >= 0.0 and not math.isnan(e), s)
        # soundness: q = 1 against the exact Gaussian (mu = sqrt(T)/sigma); T = 1 against the exact SGM step
        if q == 1.0 and math.isfinite(e):
            mu = math.sqrt(steps) / sigma
            check(f"{name}: eps >= exact Gaussian (q=1) (sound)", mp_gauss_delta(mu, e) <= delta * (1 + 1e-12), s)
        if steps == 1 and q < 1.0 and math.isfinite(e) and delta > 1e-200:
            check(
                f"{name}: eps >= exact SGM step (T=1) (sound)", mp_sgm_delta(q, 1 / sigma, e) <= delta * (1 + 1e-12), s
            )
        # monotonicity
        for label, args in (
            ("steps", (sigma, q, steps * 2)),
            ("q", (sigma, min(1.0, q * 2), steps)),
            ("sigma", (sigma / 1.5, q, steps)),
        ):
            e2, _ = _acc_eps(name, *args, delta, s + f" vs {label}")
            if e2 is not None:
                check(
                    f"{name}: eps non-decreasing in {label} (more {label} or less sigma)",
                    e2 >= e * (1 - 1e-12),
                    f"{s}: {e!r} -> {e2!r}",
                )
        e4, _ = _acc_eps(name, sigma, q, steps, min(0.5, delta * 10), s + " vs delta")
        if e4 is not None:
            check(f"{name}: eps non-increasing in delta", e4 <= e * (1 + 1e-12) + 1e-300, f"{s}: {e!r} -> {e4!r}")
        # q = 1 vs the bare Gaussian
        if q == 1.0:
            acc = A.make_accountant(name)
            e5, _ = guarded(name, s, composed_eps, acc, delta, SelfComposed(Gaussian(sigma), steps))
            if e5 is not None:
                check(
                    f"{name}: PoissonSampled(q=1) = bare Gaussian (1e-9)",
                    abs(e5 - e) <= 1e-9 * max(e, 1e-300),
                    f"{s}: {e!r} vs {e5!r}",
                )
        # composition: k1 then k2 = k1 + k2
        if steps > 1:
            k1 = int(rng.integers(1, steps))
            acc = A.make_accountant(name)
            inner = PoissonSampled(q, Gaussian(sigma)) if q < 1.0 else PoissonSampled(1.0, Gaussian(sigma))

            e6, _ = guarded(name, s, composed_eps, acc, delta, SelfComposed(inner, k1), SelfComposed(inner, steps - k1))
            if e6 is not None and math.isfinite(e) and math.isfinite(e6):
                tol = 1e-9 if name == "rdp" else 0.05  # PLD: two grids composed differently (discretisation)
                check(
                    f"{name}: k1 then k2 steps = k1+k2 steps (rel {tol})",
                    abs(e6 - e) <= tol * max(e, 1e-12) + 1e-12,
                    f"{s},k1={k1}: {e!r} vs {e6!r}",
                )
                if e6 < e * (1 - 1e-9):
                    INFO[f"{name}: split composition below the joint one"].append(f"{s},k1={k1}: {e!r} vs {e6!r}")
        # delta(eps) non-increasing and delta(eps(d)) <= d
        if math.isfinite(e):
            acc = A.make_accountant(name).compose(A.dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps))
            d1, _ = guarded(name, s, acc.delta, e)
            d2, _ = guarded(name, s, acc.delta, e * 1.5 + 0.01)
            if d1 is not None:
                check(f"{name}: delta in [0,1]", 0.0 <= d1 <= 1.0, s)
                check(f"{name}: delta(eps(d)) <= d (1+1e-6)", d1 <= delta * (1 + 1e-6), f"{s}: {d1!r}")
            if d1 is not None and d2 is not None:
                check(f"{name}: delta non-increasing in eps", d2 <= d1, f"{s}: {d1!r} -> {d2!r}")
    INFO[f"{name}: refusals (DPAuditError)"].append(str(refusals))


def sec_rdp_orders(rng, n: int) -> None:
    """rdp_to_epsilon/rdp_to_delta on random curves with fractional orders: consistency and monotonicity."""
    for _ in range(n):
        orders = np.sort(rng.uniform(1.0, 300.0, size=int(rng.integers(1, 40))))
        orders = np.unique(np.concatenate([orders, [1.5, 2.0]]))
        sigma, q, steps = draw_sigma(rng), draw_q(rng), draw_steps(rng)
        delta = draw_delta(rng)
        s = f"sigma={sigma!r},q={q!r},T={steps},delta={delta!r},orders={len(orders)}"
        acc = RdpAccountant(orders=orders)
        e, _ = guarded(
            "rdp_orders",
            s,
            composed_eps,
            acc,
            delta,
            A.dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps),
        )
        if e is None:
            continue
        acc_d = RdpAccountant().compose(A.dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps))
        r = acc.rdp
        check("rdp_orders: curve >= 0 (no NaN)", bool(np.all(r >= 0)), s)
        if math.isfinite(e):
            d, _ = guarded("rdp_orders", s, rdp_to_delta, acc.orders, r, e)
            if d is not None:
                check("rdp_to_delta(rdp_to_epsilon(d)) <= d (1+1e-9)", d[0] <= delta * (1 + 1e-9), f"{s}: {d[0]!r}")
            if steps == 1 or q == 1.0:
                mu = math.sqrt(steps) / sigma
                if q == 1.0:
                    check("rdp_orders: eps >= exact Gaussian (sound)", mp_gauss_delta(mu, e) <= delta * (1 + 1e-12), s)
        e0 = acc_d.epsilon(delta)
        check("rdp_orders: finite at default orders when finite at custom (info)", True, s)
        _ = e0
        _ = rdp_to_epsilon


def sec_peer(rng, n: int) -> None:
    """dp_accounting (Google) for the Poisson-subsampled Gaussian over the wider range: its optimistic PLD is a
    lower bound on the true epsilon (ours must not be below it); its RDP computes the same bound as ours."""
    import dp_accounting as dpa
    from dp_accounting.pld import privacy_loss_distribution as pldm

    worst = {"rdp": math.inf, "pld": math.inf}
    loose = {"rdp": 0.0, "pld": 0.0}
    for _ in range(n):
        sigma, q, steps = lu(rng, 0.1, 1e3), draw_q(rng), draw_steps(rng, 1e5)
        delta = draw_delta(rng, 1e-12)
        s = f"sigma={sigma!r},q={q!r},T={steps},delta={delta!r}"
        ev = A.dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps)
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # dp_accounting: optimistic PLD (a lower bound on the true ε), pessimistic (connect-the-dots)
                lower, upper = (
                    float(
                        pldm.from_gaussian_mechanism(
                            sigma,
                            pessimistic_estimate=pessimistic,
                            use_connect_dots=pessimistic,
                            sampling_prob=q,
                            value_discretization_interval=1e-3,
                        )
                        .self_compose(steps)
                        .get_epsilon_for_delta(delta)
                    )
                    for pessimistic in (False, True)
                )
                racc = dpa.rdp.RdpAccountant()
                inner = dpa.GaussianDpEvent(sigma)
                racc.compose(dpa.SelfComposedDpEvent(inner if q == 1.0 else dpa.PoissonSampledDpEvent(q, inner), steps))
                their_rdp = float(racc.get_epsilon(delta))
        except (OverflowError, ValueError, MemoryError) as ex:
            INFO["peer: dp_accounting refused"].append(f"{s}: {type(ex).__name__}")
            continue
        for name in ("rdp", "pld"):
            e, _ = guarded(f"peer-{name}", s, A.epsilon_for, ev, delta, name)
            if e is None:
                continue
            check(
                f"peer: {name} eps >= dp_accounting optimistic PLD (sound)",
                e >= lower,
                f"{s}: ours={e!r} lower={lower!r}",
            )
            if lower > 0:
                worst[name] = min(worst[name], e / lower)
                loose[name] = max(loose[name], e / lower)
            if name == "rdp" and their_rdp > 0 and math.isfinite(their_rdp) and abs(e / their_rdp - 1) > 1e-6:
                # Same bound on other orders (dp_accounting's default grid): either may be tighter; info only.
                INFO["peer: rdp differs from dp_accounting RDP (its default orders) by > 1e-6"].append(
                    f"{s}: ours={e!r} theirs={their_rdp!r}"
                )
            if name == "pld" and upper > 0 and e > upper * 1.05 + 1e-6:
                INFO["peer: pld > 1.05 x dp_accounting pessimistic PLD"].append(f"{s}: ours={e!r} theirs={upper!r}")
    for name in worst:
        INFO[f"peer: {name} / optimistic-PLD ratio (min, max)"].append(f"{worst[name]:.6g}, {loose[name]:.6g}")


def sec_calib(rng, n: int) -> None:
    """Calibration round trips (noise multiplier, steps, sample rate) with the RDP accountant (PLD on a few)."""
    for i in range(n):
        q, steps, delta = draw_q(rng), draw_steps(rng, 1e5), lu(rng, 1e-12, 0.1)
        target = lu(rng, 1e-2, 1e2)
        name = "pld" if i % 8 == 0 else "rdp"
        if name == "pld":
            steps = min(steps, 300)
        s = f"{name}:q={q!r},T={steps},delta={delta!r},target={target!r}"

        def make(sig, q=q, steps=steps):
            return A.dpsgd_event(noise_multiplier=sig, sample_rate=q, steps=steps)

        sg, exc = guarded(
            "calib",
            s,
            A.calibrate_noise_multiplier,
            target_epsilon=target,
            delta=delta,
            make_event=make,
            accountant=name,
        )
        if sg is None:
            INFO["calib: refused"].append(f"{s}: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        achieved = A.epsilon_for(make(sg), delta, name)
        check("calib sigma: achieved eps <= target", achieved <= target, f"{s}: sigma={sg!r} eps={achieved!r}")
        if name == "rdp":  # exact achieved eps is also >= the exact Gaussian when q = 1
            below = A.epsilon_for(make(sg * (1 - 2e-4)), delta, name)
            check(
                "calib sigma: sigma (1 - 2 tol) misses the target (not conservative)",
                below > target,
                f"{s}: sigma={sg!r} eps below={below!r}",
            )
            sg2, _ = guarded(
                "calib",
                s,
                A.calibrate_noise_multiplier,
                target_epsilon=target * 1.5,
                delta=delta,
                make_event=make,
                accountant=name,
            )
            if sg2 is not None:
                check("calib sigma non-increasing in target", sg2 <= sg * (1 + 1e-4), f"{s}: {sg!r} -> {sg2!r}")
        if i % 4 == 1:
            sigma = lu(rng, 0.3, 20)
            st = f"sigma={sigma!r},q={q!r},delta={delta!r},target={target!r}"
            t, exc = guarded(
                "calib",
                st,
                A.calibrate_steps,
                target_epsilon=target,
                delta=delta,
                make_event=lambda t, sigma=sigma, q=q: A.dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=t),
                max_steps=10**6,
            )
            if t is not None:
                et = A.epsilon_for(A.dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=t), delta)
                check("calib steps: achieved <= target", et <= target, st)
                if t < 10**6:
                    e1 = A.epsilon_for(A.dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=t + 1), delta)
                    check("calib steps: t+1 exceeds target (largest)", e1 > target, st)
            qq, exc = guarded(
                "calib",
                st,
                A.calibrate_sample_rate,
                target_epsilon=target,
                delta=delta,
                make_event=lambda x, sigma=sigma, steps=steps: A.dpsgd_event(
                    noise_multiplier=sigma, sample_rate=x, steps=steps
                ),
            )
            if qq is not None:
                eq = A.epsilon_for(A.dpsgd_event(noise_multiplier=sigma, sample_rate=qq, steps=steps), delta)
                check("calib q: achieved <= target", eq <= target, st)


def sec_gdp_acc(rng, n: int) -> None:
    """GdpAccountant: k Gaussians compose to mu = sqrt(k)/sigma; epsilon >= exact Gaussian; GDP never below RDP's
    exact-Gaussian soundness."""
    for _ in range(n):
        sigma, k, delta = draw_sigma(rng), draw_steps(rng), draw_delta(rng)
        s = f"sigma={sigma!r},k={k},delta={delta!r}"
        acc = A.GdpAccountant()
        e, _ = guarded("gdp_acc", s, composed_eps, acc, delta, SelfComposed(Gaussian(sigma), k))
        if e is None:
            continue
        with mpmath.workdps(60):
            mu = float(mpmath.sqrt(k) / mpmath.mpf(sigma))
        check("GdpAccountant mu = sqrt(k)/sigma (1e-14)", abs(acc.mu / mu - 1) <= 1e-14, s)
        if math.isfinite(e):
            check("GdpAccountant eps >= exact Gaussian (sound)", mp_gauss_delta(mu, e) <= delta, s)


def _cli_check(runner, app, command: str, args: list[str]):
    """Run ``dpaudit account COMMAND ...`` and check it exits 0 or 2 without a traceback: (result, command line)."""
    res = runner.invoke(app, args)
    s = " ".join(args)
    check(
        f"cli account {command}: exit 0/2, no traceback",
        res.exit_code in (0, 2)
        and "Traceback" not in res.output
        and not (res.exception and not isinstance(res.exception, SystemExit)),
        f"{s}: rc={res.exit_code} {res.output[-200:]!r} {res.exception!r}",
    )
    return res, s


def sec_cli(rng, n: int) -> None:
    """`dpaudit account dpsgd/calibrate` at extreme inputs: exit code 0 or 2, never a traceback."""
    from typer.testing import CliRunner

    from dpaudit.cli.main import app

    runner = CliRunner()
    for _ in range(n):
        sigma, q, steps, delta = draw_sigma(rng), draw_q(rng), draw_steps(rng), lu(rng, 1e-300, 0.2)
        accountant = str(rng.choice(["rdp", "pld", "gdp", "all"]))
        if accountant in ("pld", "all"):
            steps = min(steps, 10**3)
        args = [
            "account",
            "dpsgd",
            "--noise-multiplier",
            repr(sigma),
            "--sample-rate",
            repr(q),
            "--steps",
            str(steps),
            "--delta",
            repr(delta),
            "--accountant",
            accountant,
        ]
        res, s = _cli_check(runner, app, "dpsgd", args)
        if res.exit_code == 2:
            check(
                "cli account dpsgd: error is one line",
                len([x for x in res.output.strip().splitlines() if x.strip()]) <= 2,
                f"{s}: {res.output!r}",
            )
        target = lu(rng, 1e-3, 1e3)
        args = [
            "account",
            "calibrate",
            "--epsilon",
            repr(target),
            "--sample-rate",
            repr(q),
            "--steps",
            str(min(steps, 10**5)),
            "--delta",
            repr(delta),
        ]
        res, s = _cli_check(runner, app, "calibrate", args)


def mp_pure_composition_delta(eps0: float, k: int, eps: float) -> mpmath.mpf:
    """Exact delta(eps) of k adaptive eps0-DP mechanisms (Kairouz, Oh & Viswanath 2015, arXiv:1311.0776, Thm. 3.3
    via randomized response; Murtagh & Vadhan 2016, Thm. 1.5):
        delta = sum_i C(k, i) max(0, e^(eps0 (k - i)) - e^eps e^(eps0 i)) / (1 + e^eps0)^k."""
    with mpmath.workdps(60):
        e0, e = mpmath.mpf(eps0), mpmath.mpf(eps)
        tot = mpmath.fsum(
            mpmath.binomial(k, i) * max(mpmath.mpf(0), mpmath.exp(e0 * (k - i)) - mpmath.exp(e + e0 * i))
            for i in range(k + 1)
        )
        return tot / (1 + mpmath.exp(e0)) ** k


def sec_pure(rng, n: int) -> None:
    """k-fold Laplace / EpsilonDelta(eps0, 0) through every accountant against the exact optimal composition of eps0-DP
    (Kairouz et al. 2015), which no formal accountant may beat; Laplace(b) is exactly (1/b)-DP and its own exact
    delta(eps) = 1 - e^((eps - 1/b)/2) for one step (Laplace hockey-stick)."""
    from dpaudit.events import EpsilonDelta, Laplace

    for _ in range(n):
        eps0, k, delta = lu(rng, 1e-3, 5.0), max(1, round(lu(rng, 1, 500))), draw_delta(rng, 1e-12)
        s = f"eps0={eps0!r},k={k},delta={delta!r}"
        for name in ("rdp", "pld", "zcdp"):
            for ev in (SelfComposed(EpsilonDelta(eps0, 0.0), k), SelfComposed(Laplace(1.0 / eps0), k)):
                e, _ = guarded(f"pure-{name}", s, composed_eps, A.make_accountant(name), delta, ev)
                if e is None:
                    continue
                if e > k * eps0 * (1 + 1e-12):  # a formal bound, but looser than basic composition (tightness)
                    INFO[f"pure: {name} eps > k eps0 (looser than basic composition)"].append(f"{s}: {e!r}")
                if math.isfinite(e) and isinstance(ev.event, EpsilonDelta):  # RR is the worst eps0-DP mechanism
                    check(
                        f"pure: {name} eps >= exact optimal composition of eps0-DP (sound)",
                        mp_pure_composition_delta(eps0, k, e) <= delta,
                        f"{s}: {e!r}",
                    )
        if k == 1:
            for name in ("rdp", "pld"):
                e, _ = guarded(f"pure-{name}", s, composed_eps, A.make_accountant(name), delta, Laplace(1.0 / eps0))
                if e is not None:
                    exact = max(0.0, eps0 + 2 * math.log1p(-delta))
                    check(
                        f"pure: {name} Laplace eps >= exact one step (sound)", e >= exact * (1 - 1e-12), f"{s}: {e!r}"
                    )


def sec_pate(rng, n: int) -> None:
    """PATE's data-dependent GNMax RDP (Papernot et al. 2018, Thm. 6 with Prop. 10): finite, >= 0, never above the
    data-independent alpha / sigma^2, non-decreasing in q (the bound is increasing in q where it applies)."""
    from dpaudit.accounting.pate_smooth import rdp_gnmax_data_dependent

    orders = np.concatenate([np.linspace(1.1, 10.9, 50), np.arange(11, 256, dtype=np.float64)])
    for _ in range(n):
        sigma, logq = lu(rng, 0.5, 1e3), -lu(rng, 1e-8, 700.0)
        s = f"sigma={sigma!r},logq={logq!r}"
        r, _ = guarded("pate", s, rdp_gnmax_data_dependent, logq, sigma, orders)
        if r is None:
            continue
        check("pate: gnmax dd finite >= 0", bool(np.all(np.isfinite(r) & (r >= 0))), s)
        check("pate: gnmax dd <= data-independent alpha/sigma^2", bool(np.all(r <= orders / sigma**2 * (1 + 1e-12))), s)
        r2, _ = guarded("pate", s, rdp_gnmax_data_dependent, logq / 1.5, sigma, orders)
        if r2 is not None:
            check("pate: gnmax dd non-decreasing in q", bool(np.all(r2 >= r * (1 - 1e-9))), s)


SECTIONS = {
    "gauss": lambda rng, k: sec_gauss(rng, 150 * k),
    "zcdp": lambda rng, k: sec_zcdp(rng, 150 * k),
    "classic": lambda rng, k: sec_classic(rng, 300 * k),
    "gdp_acc": lambda rng, k: sec_gdp_acc(rng, 150 * k),
    "rdp": lambda rng, k: sec_accountant(rng, 150 * k, "rdp", 1e7, 1e-300),
    "rdp_orders": lambda rng, k: sec_rdp_orders(rng, 100 * k),
    "pld": lambda rng, k: sec_accountant(rng, 12 * k, "pld", 300, 1e-12),
    "peer": lambda rng, k: sec_peer(rng, 20 * k),
    "calib": lambda rng, k: sec_calib(rng, 12 * k),
    "cli": lambda rng, k: sec_cli(rng, 8 * k),
    "pure": lambda rng, k: sec_pure(rng, 40 * k),
    "pate": lambda rng, k: sec_pate(rng, 300 * k),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--sections", default=",".join(SECTIONS))
    args = p.parse_args()
    unknown = [n for n in args.sections.split(",") if n not in SECTIONS]
    if unknown:
        p.error(f"unknown section(s) {', '.join(unknown)}; valid: {', '.join(SECTIONS)}")
    t0 = time.time()
    for name in args.sections.split(","):
        t = time.time()
        SECTIONS[name](np.random.default_rng([args.seed, list(SECTIONS).index(name)]), args.scale)
        print(f"[{name}] {time.time() - t:.1f} s", file=sys.stderr, flush=True)
    total_c, total_v = sum(CHECKS.values()), sum(len(v) for v in VIOLATIONS.values())
    for name in sorted(CHECKS):
        v = VIOLATIONS.get(name, [])
        print(f"{'VIOLATED' if v else 'ok      '} {CHECKS[name]:6d} checks {len(v):4d} violations  {name}")
        for x in v[:3]:
            print(f"           e.g. {x}")
    for name, xs in INFO.items():
        print(f"info: {name}: {len(xs)}" + (f"  e.g. {xs[:2]}" if xs else ""))
    print(f"total: {total_c} checks, {total_v} violations, {time.time() - t0:.0f} s")
    return 1 if total_v else 0


if __name__ == "__main__":
    sys.exit(main())
