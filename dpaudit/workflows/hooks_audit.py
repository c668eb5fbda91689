"""Audit what gradient-canary hooks saw in a user's own training loop (``dpaudit audit canaries DIR``).

One training run with :class:`dpaudit.hooks.GradientCanaries` leaves the canaries' per-step
observations and a summary of the noise actually added. Against the user's claim (ε, δ) and, when
given, its mechanism (σ, q, T) this runs:

1. the one-run (ε, δ) audit of the canaries (Steinke, Nasr & Jagielski 2023, arXiv:2305.08846,
   Theorem 3.1) — formal for an add/remove claim: each canary's presence is one add/remove change;
2. with σ known, the one-run f-DP audit against DP-SGD's own curve at the claim's q and T
   (Mahloujifar, Melis & Chaudhuri 2025, arXiv:2410.22235) — formal;
3. with σ known, the noise check (:mod:`dpaudit.audit.noise`) — formal: a test of the claim that
   N(0, σ²C²) was added independently on every coordinate at every step.

Canaries with a fresh coin per step (``inclusion="step"``) get, instead of 1 and 2, the per-step audit
(:func:`_per_step_record`: formal against one step's curve, with a composed estimate), beside 3.

Multiplicity: the level α = 1 − confidence is split evenly (Bonferroni) between the tests run, so the
chance that a correct pipeline gets any "violation" is at most α.

With σ known the claim is also checked against what (σ, q, T) account to (:func:`claim_accounting`): a
claimed ε below the accountant's is reported as a claim the mechanism's analysis does not support, one far
above it is noted; the audits test the claim as given either way, and neither is a verdict.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit import numfmt
from dpaudit.audit.noise import NoiseCheck, noise_check
from dpaudit.audit.one_run import MIN_HOLDOUT_CANARIES, check_inclusion_mixed
from dpaudit.audit.result import tests_formally
from dpaudit.errors import InputError
from dpaudit.hooks.core import SIGMA_MAX, SIGMA_MIN, cross_pair_counts, dirac_scores
from dpaudit.validation import check_in_interval, check_non_negative, check_positive, check_positive_int
from dpaudit.workflows.result import AuditRecord


@dataclass(frozen=True)
class CanaryRunAudit:
    """The audits of one run with gradient canaries: formal records, the noise check, the verdict."""

    path: Path
    claim: dict[str, Any]
    audits: tuple[AuditRecord, ...]
    noise: NoiseCheck | None
    verdict: str  # "violation" (a formal ε bound or the noise check refutes the claim) | "curve-refuted" | ...
    steps: int
    count: int
    accounting: dict[str, Any] | None = None  # :func:`claim_accounting`, with σ known; also in ``claim``
    run: dict[str, Any] | None = None  # the run whose training the canaries observed (:func:`link_run`), if named

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``kind`` marks a saved result that ``dpaudit report`` reads like any other audit
        (:func:`dpaudit.report.build.canary_run_entry`)."""
        return {
            "kind": KIND,
            "canaries": str(self.path),
            "claim": self.claim,
            "verdict": self.verdict,
            # formal when every record is a formal bound or a formal curve refutation (inclusion bits that are no
            # fair coins make the one-run records estimates); the noise check is formal whenever it runs
            "formal": all(tests_formally(a.result) for a in self.audits),
            "steps": self.steps,
            "count": self.count,
            "audits": [a.to_dict() for a in self.audits],
            "noise_check": None if self.noise is None else noise_check_entry(self.noise),
            **({"run": self.run} if self.run is not None else {}),
        }

    def summary(self) -> str:
        lines = [f"{self.path}: {self.count} gradient canaries over {self.steps} steps -> verdict: {self.verdict}"]
        if self.run is not None:
            lines.append(f"run: {self.run['path']} (`dpaudit report {self.run['path']} AUDIT.json` shows one model)")
        if self.accounting is not None:
            lines.append(f"claim check: {self.accounting['statement']}")
        for a in self.audits:
            lines += ["", f"[{a.attack}] {a.description}", a.result.summary()]
        no_check = "noise check: not run (give --noise-multiplier)"
        lines += ["", self.noise.summary() if self.noise is not None else no_check]
        return "\n".join(lines)


KIND = "gradient-canary-audit"  # the ``kind`` of a saved :class:`CanaryRunAudit`

# The claim's fields a run (checkpoint.json ``privacy``) and a canary audit (``claim``) must both state alike.
_LINKED_CLAIM = ("epsilon", "delta", "noise_multiplier", "sample_rate", "steps")


def run_claim(run: Path | str) -> dict[str, Any]:
    """The privacy claim a run records (checkpoint.json ``privacy``), for ``audit canaries --run``: the claim its
    options default to; a run without one is refused in one line."""
    from dpaudit.checkpoint import read_meta

    privacy = read_meta(Path(run)).get("privacy")
    if not privacy:
        raise InputError(
            f"--run {run}: the run records no privacy claim, so no audit of a claim is its audit; import it with the "
            "claim the canaries were audited against (--noise-multiplier, --sample-rate, --steps, --delta)"
        )
    return privacy


def link_run(result: CanaryRunAudit, run: Path | str) -> CanaryRunAudit:
    """``result`` naming ``run``, the run (``dpaudit import``) whose training its canaries observed, by its path and
    the sha256 of its checkpoint.json: ``dpaudit report RUN AUDIT.json`` then shows both as one model (its attacks and
    these formal audits), and only that run, unchanged since. The run's claim must be the one audited: the same ε
    and δ, and the same σ, q and T where the run records them (another claim's audit is no audit of this model's:
    a bound just below a larger audited ε would read "consistent" beside a smaller claim it refutes); else one line
    naming both."""
    from dpaudit.checkpoint import CHECKPOINT_FILE
    from dpaudit.fileio import sha256_file

    run = Path(run)
    privacy = run_claim(run)
    for key in _LINKED_CLAIM:
        theirs, ours = privacy.get(key), result.claim.get(key)
        if theirs is None and key in ("epsilon", "delta"):
            raise InputError(f"--run {run}: the run's claim states no {key}")
        if theirs is None or ours is None or math.isclose(float(theirs), float(ours), rel_tol=1e-9, abs_tol=0.0):
            continue  # σ, q or T stated on one side only: nothing to compare
        if key in ("sample_rate", "steps"):  # what the canaries observed, not an option: another run's training
            raise InputError(
                f"--run {run}: the run's claim has {key} = {numfmt.exact(theirs)}, but the canaries observed "
                f"{numfmt.exact(ours)}: they did not watch this run's training as its claim states it"
            )
        flag = {"epsilon": "--claimed-epsilon"}.get(key, "--" + key.replace("_", "-"))
        raise InputError(
            f"--run {run}: the run's claim has {key} = {numfmt.exact(theirs)}, this audit's {numfmt.exact(ours)}: "
            f"audit the run's own claim (leave {flag} out: --run then takes the run's), or leave --run out"
        )
    return dataclasses.replace(result, run={"path": str(run), "checkpoint_sha256": sha256_file(run / CHECKPOINT_FILE)})


def noise_check_entry(noise: NoiseCheck) -> dict[str, Any]:
    """The noise check as the report (and :func:`dpaudit.workflows.result.headline`) reads it: its numbers
    and ``statement``, one sentence saying what it showed."""
    worst = min(noise.groups, key=lambda g: g.p_value, default=None)
    if noise.verdict == "violation":
        what = f"the noise check rejects the claimed noise std σC = {noise.noise_std:.4g}"
        if worst is not None and noise.variance_p_value <= noise.details.get("alpha_variance", noise.alpha):
            what += f" (group {worst.name}: estimated std / σC = {worst.ratio:.3g}, variance test "
            what += f"{numfmt.p_value(noise.variance_p_value)})"
        elif noise.independence_p_value is not None and noise.independence_p_value <= noise.details.get(
            "alpha_independence", noise.alpha / 2.0
        ):
            what += f" (noise not independent across steps, {numfmt.p_value(noise.independence_p_value)})"
        elif noise.cross_group_p_value is not None:
            what += f" (noise not independent across parameter groups, {numfmt.p_value(noise.cross_group_p_value)})"
    else:
        what = f"the noise check finds no less noise than the claimed σC = {noise.noise_std:.4g}"
    statement = f"{what} (formal, gradient-canaries noise check, level {noise.alpha:.3g})"
    return {**noise.to_dict(), "source": "gradient-canaries", "statement": statement}


# A claim within this fraction below the accountant's ε is taken as the same claim: numerical accountants of
# one mechanism differ by their discretisation (dpaudit's PLD is pessimistic on a 1e-4-nat grid; other tools'
# PLD/PRV grids and bounds differ), and users round the ε they state.
CLAIM_RTOL = 0.01
FAR_ABOVE = 1.5  # a claim above this multiple of the accountant's ε is noted: the audit tests a much weaker claim


def claim_accounting(claimed: float, delta: float, noise_multiplier: float, sample_rate: float, steps: int):
    """What the DP-SGD mechanism (σ, q, T) accounts to at ``delta``, compared with the ``claimed`` ε.

    The accounted ε is dpaudit's PLD accountant's for SelfComposed(PoissonSampled(q, Gaussian(σ)), T) under
    add/remove neighbours (Abadi et al. 2016, Alg. 1; the PLD of the Poisson-subsampled Gaussian's dominating
    pair, Zhu, Dong & Wang 2022, arXiv:2106.08567, composed by FFT) — the claim DP-SGD makes for these
    settings. ``relation``:

    - "below" (claimed < (1 − CLAIM_RTOL)·accounted): the mechanism's analysis does not support the claim. Not a
      violation by itself: the accountant's ε is an upper bound on the mechanism's (a sufficient condition, with
      pessimistic discretisation), so the mechanism's true ε may still be at most the claim; only a formal test
      of the mechanism refutes a claim. The audits test the claim as given;
    - "far-above" (claimed > FAR_ABOVE·accounted): the claim is much weaker than what (σ, q, T) support, so the
      audits test a weaker claim than the mechanism's (a refutation is still one; a pass says less);
    - "above" (accounted·(1 + CLAIM_RTOL) < claimed ≤ FAR_ABOVE·accounted): a weaker claim than (σ, q, T) support,
      as an RDP accountant (Opacus' default) gives for the same mechanism; the audits test the claim as given;
    - "matches" otherwise (within CLAIM_RTOL of the accountant's ε).
    """
    from dpaudit.accounting import dpsgd_event, epsilon_for

    event = dpsgd_event(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
    accounted = float(epsilon_for(event, delta, "pld"))
    # Both upper bounds on ε (a claim; an accountant's ε), rounded up, in the order computed (dpaudit.numfmt).
    shown, acc = numfmt.ordered(claimed, accounted, left_digits=numfmt.CLAIM_DIGITS, right_digits=4, left_up=True)
    what = (
        f"(σ = {numfmt.exact(noise_multiplier)}, q = {numfmt.exact(sample_rate)}, T = {steps}) account to ε = {acc} at "
        f"δ = {numfmt.exact(delta)}"
    )
    if claimed < (1.0 - CLAIM_RTOL) * accounted:
        relation = "below"
        statement = (
            f"the claimed ε = {shown} is below what {what} (PLD accountant): the mechanism's analysis does not "
            "support this claim. Not a violation by itself (the accountant's ε is an upper bound, so the true ε may "
            "be lower; only a formal audit refutes a claim); the audits test the claim as given"
        )
    elif claimed > FAR_ABOVE * accounted:
        relation = "far-above"
        statement = (
            f"the claimed ε = {shown} is far above what {what} (PLD accountant): the audits test this weaker "
            f"claim, not the ε = {acc} the mechanism supports"
        )
    elif claimed > (1.0 + CLAIM_RTOL) * accounted:
        relation = "above"
        statement = (
            f"the claimed ε = {shown} is above what {what} (PLD accountant; RDP accountants, Opacus' default, give "
            "more for the same mechanism): the audits test this claim, a little weaker than the mechanism's"
        )
    else:
        relation = "matches"
        statement = f"the claimed ε = {shown} matches what {what} (PLD accountant)"
    return {"accountant": "pld", "epsilon": accounted, "relation": relation, "statement": statement}


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def audit_canaries(
    directory: Path | str,
    *,
    claimed_epsilon: float | None = None,
    delta: float | None = None,
    noise_multiplier: float | None = None,
    sample_rate: float | None = None,
    steps: int | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    run: Path | str | None = None,
) -> CanaryRunAudit:
    """Audit a directory written by :meth:`dpaudit.hooks.GradientCanaries.save` (see the module docstring).

    ``sample_rate`` and ``steps`` default to the canaries' own (q) and the number of steps observed;
    given, they must agree with them (a claim for another q or T is not the run that was observed).
    ``noise_multiplier`` (σ, the claim's) enables the f-DP audit against DP-SGD's curve and the noise
    check. Add/remove neighbours (each canary is one record present or absent).

    ``run``: the run (``dpaudit import``) whose training the canaries observed; the claim left out
    (``claimed_epsilon``, ``delta``, ``noise_multiplier``) is the run's, and the result names the run
    (:func:`link_run`). Without it, ``claimed_epsilon`` and ``delta`` are required."""
    from dpaudit.hooks import load_observations
    from dpaudit.workflows.checkpoint import claim_tradeoff, one_run_records

    if run is not None:  # the run's claim, for what the caller leaves out
        privacy = run_claim(run)
        claimed_epsilon = privacy["epsilon"] if claimed_epsilon is None else claimed_epsilon
        delta = privacy["delta"] if delta is None else delta
        noise_multiplier = privacy.get("noise_multiplier") if noise_multiplier is None else noise_multiplier
    for flag, value in (("--claimed-epsilon", claimed_epsilon), ("--delta", delta)):
        if value is None:
            raise InputError(f"give {flag} (the claim audited), or --run RUN to audit the claim that run records")
    claimed = check_non_negative(claimed_epsilon=claimed_epsilon)  # as every audit: ε = 0 is a claim too
    delta = check_in_interval(0.0, 1.0, delta=delta)
    confidence = check_in_interval(0.0, 1.0, confidence=confidence)
    obs = load_observations(directory)
    if steps is not None and check_positive_int(steps=steps) != obs.steps:
        raise InputError(f"the claim says T = {steps} steps, but the canaries observed {obs.steps} noisy steps")
    q = obs.sample_rate
    if sample_rate is not None and not _close(check_in_interval(0.0, 1.0, hi_open=False, sample_rate=sample_rate), q):
        # compared in float64: NumPy 2 compares a float32 with a Python float in float32
        rounded = float(np.float32(sample_rate)) == q
        f32 = " (the claim's q rounded to float32: give the canaries a Python float)" if rounded else ""
        if float(np.float32(q)) == float(sample_rate):  # the other way round: a float32 q computed in torch/NumPy
            f32 = " (this q is the canaries' q rounded to float32: pass the Python float the canaries were given)"
        raise InputError(
            # Both as they are (dpaudit.numfmt.exact): they differ beyond 1e-9, often beyond the 6 digits of :g.
            f"the claim says q = {numfmt.exact(sample_rate)}, but the canaries were Poisson-sampled at "
            f"q = {numfmt.exact(q)}{f32}: "
            "they would not behave like the run's records"
        )
    sigma = None if noise_multiplier is None else check_positive(noise_multiplier=noise_multiplier)
    lo, hi = obs.meta.get(SIGMA_MIN), obs.meta.get(SIGMA_MAX)  # recorded by the Opacus adapter
    scheduled = isinstance(lo, int | float) and isinstance(hi, int | float) and lo < hi
    if sigma is not None and scheduled and sigma > lo and not _close(sigma, lo):
        # The noise check and the f-DP curve test one σ at every step; a schedule's later steps had less noise, so a
        # correct loop read "violation" (Opacus' ExponentialNoise(gamma=0.8), σ 1 -> 0.512 by the 4th epoch: noise
        # ratio 0.77).
        raise InputError(
            f"{directory}: the run's noise multiplier changed during training (from {numfmt.exact(hi)} down to "
            f"{numfmt.exact(lo)}: a noise schedule), but the audit tests one σ at every step: give --noise-multiplier "
            f"{numfmt.exact(lo)} (the smallest), or audit without it"
        )
    if sigma is not None and not np.any(obs.noise_count > 0):  # (was the noise check's own, with no way out)
        raise InputError(
            f"{directory}: every parameter coordinate carries a canary ({obs.count}), so the noise check has no "
            "coordinate to test: audit without --noise-multiplier (the one-run audit only), and give GradientCanaries "
            "fewer canaries than parameters next time"
        )
    claim = {"epsilon": claimed, "delta": delta, "neighbouring": "add_remove", "sampling": "poisson",
             "sample_rate": q, "steps": obs.steps, "noise_multiplier": sigma, "clip": obs.clip}  # fmt: skip
    # With σ the mechanism is fully stated (q and T are the observed ones, which a given --sample-rate/--steps
    # must equal): say whether the claimed ε is what it accounts to. Reported, never a verdict.
    accounting = None if sigma is None else claim_accounting(claimed, delta, sigma, q, obs.steps)
    if accounting is not None:
        claim["accounting"] = accounting
    if obs.inclusion == "step":
        if sigma is None:
            raise InputError(
                f"{directory}: per-step canaries are audited against one step's claimed curve: give --noise-multiplier"
            )
        alpha = (1.0 - confidence) / 2  # Bonferroni: the per-step audit and the noise check
        records = [_per_step_record(obs, q, sigma, delta, 1.0 - alpha, claimed, seed)]
    else:
        # (audit_scores said "holdout guess-count selection needs at least 4 canaries")
        if obs.count < MIN_HOLDOUT_CANARIES:
            raise InputError(
                f"{directory}: {obs.count} gradient canaries: the one-run audit needs at least {MIN_HOLDOUT_CANARIES} "
                "(hundreds to refute a small ε: `dpaudit audit plan`); give GradientCanaries a larger count"
            )
        check_inclusion_mixed(
            obs.included, str(directory), "GradientCanaries draws such bits unless given included=: use another seed"
        )
        curve = claim_tradeoff(claim) if sigma is not None else None
        n_tests = 1 + (curve is not None) + (sigma is not None)
        alpha = (1.0 - confidence) / n_tests  # Bonferroni over the formal tests run
        # Scores fixed before the bits are looked at: the per-step likelihood ratio at the claimed σ (Σ_t o_t
        # without σ).
        scores = dirac_scores(obs.observations, q, 0.0 if sigma is None else sigma)
        what = (
            f"{obs.count} white-box gradient canaries from the user's training loop, each included w.p. 1/2, "
            f"{obs.steps} noisy steps observed"
        )
        common = {"delta": delta, "confidence": 1.0 - alpha, "claimed_epsilon": claimed, "seed": seed}
        records = one_run_records("gradient-canaries", what, scores, obs.included, common, curve, None)
        records = [dataclasses.replace(r, family="white-box") for r in records]
    noise = None
    if sigma is not None:
        pairs = None if obs.cross is None else obs.steps * cross_pair_counts(obs.param_shapes, obs.coordinates)
        noise = noise_check(
            obs.noise_ss, obs.noise_count, obs.projections, noise_std=sigma * obs.clip, alpha=alpha,
            names=list(obs.param_shapes), cross=obs.cross, cross_counts=pairs,
        )  # fmt: skip
    verdicts = {r.result.verdict for r in records} | ({noise.verdict} if noise is not None else set())
    if "violation" in verdicts:
        verdict = "violation"
    elif "curve-refuted" in verdicts:  # only the claimed DP-SGD curve is refuted (issue 27): said so
        verdict = "curve-refuted"
    elif "estimate-exceeds-claim" in verdicts:  # e.g. inclusion bits that are no fair coins: evidence, no proof
        verdict = "estimate-exceeds-claim"
    elif all(r.result.verdict == "inconclusive" for r in records) and noise is None:
        verdict = "inconclusive"
    else:
        verdict = "consistent"
    result = CanaryRunAudit(Path(directory), claim, tuple(records), noise, verdict, obs.steps, obs.count, accounting)
    return result if run is None else link_run(result, run)


def _per_step_record(obs, q: float, sigma: float, delta: float, confidence: float, claimed: float, seed: int):
    """The per-step audit (:func:`dpaudit.audit.whitebox.audit_steps`) of canaries with a fresh coin per step.

    Formal part: with respect to coin c_{t,k} the whole transcript is one step of DP-SGD (canary k offered
    at step t only) followed by post-processing with independent randomness, so each of the T·M coins is
    one canary of the one-run f-DP game against the one-step curve (Nasr et al. 2023, arXiv:2302.07956,
    §3; Mahloujifar, Melis & Chaudhuri 2025, arXiv:2410.22235) — M canaries per step change nothing, as
    the game needs f-DP with respect to each canary alone. The composed part is an estimate, labelled."""
    from dpaudit.audit.whitebox import audit_steps
    from dpaudit.workflows.whitebox import steps_record

    stats = audit_steps(
        obs.observations.reshape(-1), obs.coins.reshape(-1), sample_rate=q, noise_multiplier=sigma, delta=delta,
        confidence=confidence, claimed_epsilon=claimed, steps=obs.steps, seed=seed,
    )  # fmt: skip
    what = (
        f"{obs.count} white-box gradient canaries from the user's training loop, each offered at each of "
        f"{obs.steps} steps w.p. 1/2 ({int(obs.coins.sum())} of {obs.coins.size} offered)"
    )
    return steps_record("gradient-canaries", what, stats)
