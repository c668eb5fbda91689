"""Per-step white-box audit of DP-SGD (Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini &
Terzis 2023, "Tight auditing of differentially private machine learning", arXiv:2302.07956, §3–4).

Set-up (:class:`dpaudit.training.dpsgd.GradientCanary` with ``per_step=True``): a Dirac gradient
canary C·e_j is offered at each of the T steps of one run independently with probability 1/2 (the
auditor's coin c_t) and, when offered, Poisson-sampled at rate q like any record. The auditor reads
o_t = (noisy update)_j / C. With the data's gradients vanishing at j, o_t ~ N(b·B_t, σ²) with
B_t ~ Bernoulli(q) when c_t = 1 and o_t ~ N(0, σ²) when c_t = 0 (b = 1 for a correct implementation).

Two results:

(a) Formal, per step. With respect to the coin c_t the whole transcript is one step of DP-SGD (the
    Poisson-sampled Gaussian, claimed curve f_step) followed by post-processing with independent
    randomness, so the T coins are exactly the one-run game with m = T canaries. The one-run f-DP test
    (Mahloujifar, Melis & Chaudhuri 2025, arXiv:2410.22235; :mod:`dpaudit.audit.fdp_one_run`) with
    the family of one-step curves (noise multiplier varied) gives a formal lower bound on the per-step
    ε and refutes the per-step claim when the implementation leaks more than one step may. No
    independence between steps is assumed.
(b) Estimate, composed over T steps. Assuming the per-step observations are Gaussian as above (Nasr et
    al. 2023, §4: "we assume the per-step trade-off is Gaussian"), b/σ is estimated with a confidence
    bound (Bonferroni α/2 for the shift, α/2 for σ) and the composed ε(δ) is that of DP-SGD with
    noise multiplier σ/b, rate q and T steps: for q = 1, μ_total = √T · b/σ (Dong, Roth & Su 2022,
    arXiv:1905.02383, Cor. 3.3); for q < 1 the Poisson mixture is accounted exactly with the PLD
    accountant (no CLT). Labelled "estimate (assumes Gaussian per-step trade-off)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special, stats

from dpaudit import numfmt
from dpaudit.accounting import dpsgd_event, epsilon_for
from dpaudit.accounting.gdp import gdp_epsilon_lower
from dpaudit.audit.bounds import _alpha, audit_scores
from dpaudit.audit.fdp_one_run import sampled_gaussian_step_family
from dpaudit.audit.result import AuditResult
from dpaudit.errors import InputError
from dpaudit.validation import check_in_interval, check_non_negative

ESTIMATE_LABEL = "estimate (assumes Gaussian per-step trade-off)"
_U52 = 2.0**-52  # an ulp of 1
_PLD_MAX_RATIO = 20.0
# With q < 1 one run cannot pin the canary's shift b down (E[o | offered] = q·b: its standard error is
# about 2σ/(q√T), e.g. 1.6 for σ = 1, q = 0.05, T = 600), so the composed estimate takes b = 1 (the
# canary's clipped norm, added unscaled when sampled) and the claimed q, and estimates the noise σ.
ESTIMATE_LABEL_SAMPLED = "estimate (assumes Gaussian per-step trade-off, the claimed sampling rate and b = 1)"


def composed_epsilon(ratio: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε(δ) of T steps of DP-SGD whose per-step observation has shift/noise ratio ``ratio`` = b/σ.

    q = 1: μ-GDP composition, μ_total = √T · ratio (Dong, Roth & Su 2022, arXiv:1905.02383, Cor. 3.3),
    ε from Dong et al. Cor. 2.13 rounded down (:func:`dpaudit.accounting.gdp.gdp_epsilon_lower`). q < 1: the
    Poisson-sampled Gaussian with noise multiplier 1/ratio composed T times, PLD accountant (pessimistic, add/remove);
    above ratio 20 one step's exact ε (a lower bound on the composition's; see the code).
    """
    if ratio <= 0.0:
        return 0.0
    if sample_rate >= 1.0:
        # A lower estimate compared with the claim: μ (two roundings, each ≤ 2^-53 relative) and ε rounded down.
        return gdp_epsilon_lower(math.sqrt(steps) * ratio * (1.0 - 2.0**-51), delta)
    if ratio > _PLD_MAX_RATIO:
        # σ/b below 1/20: the PLD grid would need millions of bins. One step's ε(δ) (exact, closed form)
        # is a lower bound on the T-fold composition's, and already far above any sensible claim.
        return sampled_gaussian_step_family(sample_rate).epsilon(ratio, delta)
    event = dpsgd_event(noise_multiplier=1.0 / ratio, sample_rate=sample_rate, steps=steps)
    return float(epsilon_for(event, delta, "pld"))


@dataclass(frozen=True)
class RatioEstimate:
    """Per-step shift b (in clipping norms) and noise σ, their ratio and its lower confidence bound."""

    shift: float
    shift_lower: float
    sigma: float
    sigma_upper: float
    ratio: float
    ratio_lower: float


def estimate_ratio(observations, inserted, sample_rate: float, alpha: float) -> RatioEstimate:
    """b/σ from the two samples, with a lower confidence bound at level alpha (Gaussian model).

    σ̂: the sample SD of the not-inserted steps (N(0, σ²)); its upper bound from the χ² quantile at α/2.
    b̂ = (mean_in − mean_out)/q (E[o | c=1] = q·b); its lower bound is b̂ − z_{1−α/2}·SE with the
    Welch standard error (the inserted sample's variance σ² + q(1−q)b² is estimated, not assumed).
    Bonferroni over the two bounds: ratio ≥ b_lo/σ_hi with probability ≥ 1 − α (asymptotically in b̂).
    """
    o, c = np.asarray(observations, float), np.asarray(inserted, bool)
    o_in, o_out = o[c], o[~c]
    if len(o_in) < 2 or len(o_out) < 2:
        raise InputError(f"need at least 2 inserted and 2 not-inserted steps, got {len(o_in)} and {len(o_out)}")
    n0 = len(o_out)
    s0 = float(np.std(o_out, ddof=1))
    # Rounding, in the safe direction (benchmarks/stats_rounding.py, ``whitebox``): numpy's pairwise sums carry a
    # relative error of about (log2 n + 4) 2^-52 (Higham 2002, §4.2), so each mean and variance below is off by
    # that relative to its terms' magnitudes (mean |o| for a mean, the variance itself for a variance); 8 of those.
    g = 8.0 * (math.log2(len(o)) + 4.0) * _U52
    # χ² upper bound on σ. scipy's chi2.ppf was measured up to 20 ulps above the exact quantile (df 1, α 1e-15),
    # which would lower σ's bound: the quantile is taken 80 ulps lower (4x), and s0's own rounding (g) added.
    chi2_lo = float(stats.chi2.ppf(alpha / 2.0, n0 - 1)) * (1.0 - 80.0 * _U52)
    sigma_up = s0 * math.sqrt((n0 - 1) / chi2_lo) * (1.0 + g)
    shift = float(o_in.mean() - o_out.mean()) / sample_rate
    se = math.sqrt(o_in.var(ddof=1) / len(o_in) + o_out.var(ddof=1) / n0) / sample_rate
    # z_{1−α/2} = −Φ⁻¹(α/2): the argument α/2 is exact, where 1 − α/2 rounded (at α = 1e-10 that moved z, and the
    # bound, by 1e8 ulps); ndtri's own error (≤ 2 ulps measured) and se's (g) are covered by 8 ulps of z and g·z·se,
    # the means' (g times their magnitude, divided by q, amplified by the difference's cancellation) by the rest.
    z = -float(special.ndtri(alpha / 2.0)) * (1.0 + 8.0 * _U52)
    means_err = g * (float(np.abs(o_in).mean()) + float(np.abs(o_out).mean())) / sample_rate
    shift_lo = shift - z * se - (g * (abs(shift) + z * se) + means_err)
    ratio = max(shift, 0.0) / s0 if s0 > 0 else math.inf
    ratio_lo = max(shift_lo, 0.0) / sigma_up * (1.0 - 2.0 * _U52) if sigma_up > 0 else math.inf
    return RatioEstimate(shift, shift_lo, s0, sigma_up, ratio, ratio_lo)


@dataclass(frozen=True)
class StepAudit:
    """Result of the per-step white-box audit: (a) formal per step, (b) composed estimate."""

    per_step: AuditResult  # one-run f-DP on the T coins against one step's curve: a formal curve refutation
    per_step_claimed_epsilon: float
    ratio: RatioEstimate
    composed_epsilon_estimate: float  # ε(δ) over T steps at the lower confidence bound of b/σ
    composed_epsilon_point: float  # ... at the point estimate
    claimed_epsilon: float | None
    composed_verdict: str | None  # "estimate-exceeds-claim" | "consistent" | None
    steps: int
    sample_rate: float
    noise_multiplier: float
    delta: float
    confidence: float
    label: str = ESTIMATE_LABEL
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_step": self.per_step.to_dict(),
            "per_step_claimed_epsilon": self.per_step_claimed_epsilon,
            "ratio": self.ratio.__dict__,
            "composed_epsilon_estimate": self.composed_epsilon_estimate,
            "composed_epsilon_point": self.composed_epsilon_point,
            "claimed_epsilon": self.claimed_epsilon,
            "composed_verdict": self.composed_verdict,
            "steps": self.steps,
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
            "delta": self.delta,
            "confidence": self.confidence,
            "label": self.label,
            "notes": list(self.notes),
        }

    @property
    def verdicts(self) -> tuple[str | None, ...]:
        """Both verdicts: (a) the per-step curve refutation (formal) and (b) the composed estimate's."""
        return (self.per_step.verdict, self.composed_verdict)

    def summary(self) -> str:
        ps = self.per_step
        # dpaudit.numfmt: bounds (">=") rounded down, claims up, point estimates to nearest.
        step_bound, step_claim = numfmt.ordered(ps.epsilon_lower_bound, self.per_step_claimed_epsilon, left_digits=4)
        # The composed estimate beside the claim its verdict compares it with (numfmt.against): lower(7.999957, 4)
        # read "epsilon >= 7.999 ... claimed epsilon: 7.99996 -> composed verdict: estimate-exceeds-claim".
        claimed, (composed,), _ = numfmt.against(self.claimed_epsilon, [self.composed_epsilon_estimate], digits=4)
        shown = ps.refutation["statement"] if ps.refutation else f"epsilon_step >= {step_bound}"
        lines = [
            f"(a) per step, formal: {shown} (verdict {ps.verdict}; {self.steps} trials); epsilon_step estimate "
            f"{step_bound} vs claimed per step {step_claim}",
            f"(b) composed over {self.steps} steps, {self.label}: epsilon >= "
            f"{composed} "
            f"(point {numfmt.nearest(self.composed_epsilon_point, 4)}; "
            f"shift/sigma >= {numfmt.lower(self.ratio.ratio_lower, 4)}, point {numfmt.nearest(self.ratio.ratio, 4)})",
        ]
        if self.claimed_epsilon is not None:
            lines.append(f"claimed epsilon: {claimed}  ->  composed verdict: {self.composed_verdict}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def audit_steps(
    observations,
    inserted,
    *,
    sample_rate: float,
    noise_multiplier: float,
    delta: float = 1e-5,
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
    steps: int | None = None,
    seed: int = 0,
) -> StepAudit:
    """Per-step white-box audit from one run's observations o_t and coins c_t (see module docstring).

    Args:
        observations: o_t = (noisy update at the canary's coordinate) / C, one per step.
        inserted: the auditor's coin c_t per step (True: canary offered at step t).
        sample_rate: the claimed Poisson rate q; noise_multiplier: the claimed σ.
        delta, confidence: as in :func:`dpaudit.audit.audit_scores`; α is split in half between (a)
            and (b) so that both hold at once with probability ≥ confidence.
        claimed_epsilon: the claim over ``steps`` (default: the number of observations).
    """
    o = np.asarray(observations, dtype=float)
    c = np.asarray(inserted, dtype=bool)
    if o.ndim != 1 or o.shape != c.shape:
        raise InputError(f"observations and inserted must be 1-D of equal length, got {o.shape} and {c.shape}")
    if not np.all(np.isfinite(o)):
        raise InputError("observations must be finite")
    q = check_in_interval(0.0, 1.0, hi_open=False, sample_rate=sample_rate)
    sigma = check_non_negative(noise_multiplier=noise_multiplier)
    if sigma == 0.0:
        raise InputError("the per-step audit needs a private claim (noise_multiplier > 0)")
    check_in_interval(0.0, 1.0, delta=delta)
    check_in_interval(0.0, 1.0, confidence=confidence)
    T = len(o) if steps is None else int(steps)
    alpha = _alpha(confidence)
    half_conf = 1.0 - alpha / 2.0
    step_claim = float(epsilon_for(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=1), delta, "pld"))
    per_step = audit_scores(
        o, c, method="one-run-fdp", design="canaries", tradeoff=sampled_gaussian_step_family(q), delta=delta,
        confidence=half_conf, claimed_epsilon=step_claim, threshold_selection="bonferroni", seed=seed,
    )  # fmt: skip
    est = estimate_ratio(o, c, q, alpha / 2.0)
    notes: list[str] = []
    if q >= 1.0:
        r_lo, r_pt, label = est.ratio_lower, est.ratio, ESTIMATE_LABEL
    else:
        r_lo, r_pt, label = 1.0 / est.sigma_upper, 1.0 / est.sigma, ESTIMATE_LABEL_SAMPLED
        if est.shift_lower > 1.0:
            notes.append(
                f"the canary's estimated shift b is above 1 (lower bound {numfmt.lower(est.shift_lower)}): the canary "
                "is sampled more often, or added with a larger norm, than claimed"
            )
    eps_lo = composed_epsilon(r_lo, q, T, delta)
    eps_pt = composed_epsilon(r_pt, q, T, delta) if math.isfinite(r_pt) else math.inf
    verdict = None
    if claimed_epsilon is not None:
        verdict = "estimate-exceeds-claim" if eps_lo > claimed_epsilon else "consistent"
    return StepAudit(
        per_step, step_claim, est, eps_lo, eps_pt, claimed_epsilon, verdict, T, q, sigma, delta, confidence, label,
        tuple(notes),
    )  # fmt: skip
