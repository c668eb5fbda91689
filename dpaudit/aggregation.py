"""Private aggregation of teacher votes (PATE, DP-ICL): noisy argmax of a vote histogram, and its accounting.

One implementation serves PATE (teachers are models trained on disjoint partitions; Papernot et al.
2017, arXiv:1610.05755; 2018, arXiv:1802.08908) and DP-ICL (teachers are in-context predictors, each
prompted with a disjoint subset of the private exemplars; Wu et al. 2024, arXiv:2305.01639). Only the
teachers differ; every query is answered from the histogram ``n(x)`` of the K teachers' votes:

* ``lnmax``: argmax_j n_j(x) + Lap(b) (Papernot et al. 2017, Eq. 1, b = 1/gamma).
* ``gnmax``: argmax_j n_j(x) + N(0, sigma^2) (Papernot et al. 2018, Sec. 4.1).
* ``confident-gnmax``: answer only if max_j n_j(x) + N(0, sigma1^2) >= T, then GNMax with sigma2
  (Papernot et al. 2018, Alg. 1); unanswered queries are reported as -1.
* ``argmax``: no noise (the non-private baseline, epsilon = infinity).

Privacy unit: one record of the private set. Records are assigned to teachers by position in a seeded
permutation, so replacing one record (replace-one neighbours, the relation recorded in the claim) changes
one teacher and that teacher's single vote per query: the histogram moves by at most 1 in two coordinates
(sqrt(2) in L2, 2 in L1) and max_j n_j by at most 1. The events are therefore accounted in units of one
changed vote (the threshold's Gaussian with C = 1 under the accountant's add/remove convention, i.e. no
factor 2), which is what ``privacy_record["event"]`` means; recomputing it with replace-one would only
over-state the threshold's cost.

Accounting (pure numpy/scipy, no torch):

* Data-independent (the claim): events from :mod:`dpaudit.events` accounted by the RDP accountant,
  and for LNMax also pure-DP basic composition (the smaller epsilon is claimed; both are formal).
  Confident-GNMax's threshold step is a Gaussian mechanism on a sensitivity-1 scalar, run on every
  query; its GNMax step runs only on answered queries, at most ``max_answers`` of them (the aggregator
  stops answering after that). Composing only the answered GNMax steps with a cap fixed in advance is
  the Rényi filter of Feldman & Zrnic 2021 (arXiv:2008.11193, Thm. 3.1), applied at each order.
* Data-dependent (Papernot et al. 2018, Thm. 6, Prop. 7 and 10; LNMax: Papernot et al. 2017, Thm. 3):
  smaller on consensus histograms, but a function of the private votes, so *not itself differentially
  private*. ``claim="data-dependent"`` releases it sanitised with smooth sensitivity (ibid. Sec. 4.3 and
  App. C; :mod:`dpaudit.accounting.pate_smooth`), which is then the claim; the raw values are kept out
  of the checkpoint unless asked for (:func:`private_diagnostics`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dpaudit.accounting.pate_smooth import (
    SanitiserConfig,
    choose_sanitiser,
    log_q_gnmax,
    log_q_lnmax,
    rdp_gnmax_data_dependent,
    rdp_lnmax_data_dependent,
    rdp_threshold_data_dependent,
    sanitised_claim,
)
from dpaudit.errors import InputError
from dpaudit.events import Composed, Event, Gaussian, GNMax, LNMax, NonPrivate, PoissonSampled, SelfComposed
from dpaudit.validation import check_choice, check_in_interval, check_non_negative, check_positive, check_positive_int

__all__ = [
    "AGGREGATORS",
    "AggregatorConfig",
    "aggregate",
    "aggregator_event",
    "calibrate_aggregator",
    "check_data_dependent_claim",
    "data_dependent_epsilon",
    "data_dependent_rdp",
    "log_q_gnmax",
    "privacy_record",
    "private_diagnostics",
    "rdp_gnmax_data_dependent",
    "rdp_threshold_data_dependent",
    "vote_histogram",
]

AGGREGATORS = ("lnmax", "gnmax", "confident-gnmax", "argmax")
NEIGHBOURING_NOTE = (
    "one record changes at most one teacher's vote per query: records are assigned to teachers by their "
    "position in a seeded permutation, so replacing one record changes one teacher's data (replace-one); "
    "adding or removing one exemplar of a fixed teacher is covered too"
)
DATA_DEPENDENT_NOTE = (
    "data-dependent analysis (Papernot et al. 2018, arXiv:1802.08908, Thm. 6 with Prop. 7/10; LNMax: Papernot "
    "et al. 2017, Thm. 3): computed from the private vote histograms, so these values are themselves NOT "
    "differentially private (not sanitised); kept only with --keep-private-diagnostics"
)
SUBSAMPLED_NOTE = (
    "each private record has a fixed, data-independent teacher (an i.i.d. uniform draw) and joins that teacher's "
    "prompt for a query with probability q, independently per query: adding or removing one record changes at "
    "most one vote per query, and only on the queries that sampled it (add/remove neighbours)"
)
SANITISER_RULE_NOTE = (
    "settings given as null were chosen by the public rule dpaudit.accounting.pate_smooth.choose_sanitiser (the "
    "expected claim minimised on a prior vote histogram built from the public settings: T votes on top for "
    "confident-gnmax, prior_top of the teachers otherwise); settings given as numbers were fixed by the user"
)
SANITISED_NOTE = (
    "data-dependent, sanitised (Papernot et al. 2018, arXiv:1802.08908, Sec. 4.3 and App. C): the data-dependent "
    "RDP at one order is released with Gaussian noise scaled by its smooth sensitivity (GNSS, Thm. 23), raised "
    "by a margin from a released bound on that sensitivity so that it is not below the data-dependent RDP except "
    "with probability delta/2; both releases are charged, and RDP is converted at delta/2 (formal for this "
    "dataset's neighbours: the claim holds with the stated delta). The sanitiser's settings not fixed by the user "
    "were chosen by a public rule (a function of the public settings only, never of the votes: "
    "sanitised.chosen_by_public_rule); settings fixed by the user are honest only if fixed before the votes were seen."
)


@dataclass(frozen=True)
class AggregatorConfig:
    """Settings of the noisy aggregator (all privacy-relevant).

    ``sigma``: the noise of the answer step: Laplace scale b = 1/gamma for ``lnmax``, the Gaussian
    sigma for ``gnmax``, sigma2 for ``confident-gnmax``; ignored (must be None) for ``argmax``.
    ``sigma1`` and ``threshold`` T: Confident-GNMax's noisy threshold check (only for it).
    ``max_answers``: Confident-GNMax stops answering after this many answers (None: no cap, i.e. the
    claim assumes every query may be answered).
    ``sample_rate`` q (GNMax only; DP-ICL): every query is answered by teachers that see a fresh Poisson
    sample of the private records (each kept with probability q; Wu et al. 2024, arXiv:2305.01639, Sec. 3),
    accounted with amplification by subsampling under add/remove neighbours (:func:`aggregator_event`).
    """

    name: str
    sigma: float | None = None
    sigma1: float | None = None
    threshold: float | None = None
    max_answers: int | None = None
    sample_rate: float | None = None

    def __post_init__(self) -> None:
        check_choice(AGGREGATORS, aggregator=self.name)
        if self.name == "argmax":
            if self.sigma is not None:
                raise InputError("the argmax aggregator adds no noise; give no --sigma")
        else:
            if self.sigma is None:
                raise InputError(f"the {self.name} aggregator needs --sigma (its noise scale)")
            check_positive(finite=True, sigma=self.sigma)
        confident = self.name == "confident-gnmax"
        if confident:
            if self.sigma1 is None or self.threshold is None:
                raise InputError("confident-gnmax needs --sigma1 and --threshold")
            check_positive(finite=True, sigma1=self.sigma1)
            check_non_negative(threshold=self.threshold)
        elif self.sigma1 is not None or self.threshold is not None or self.max_answers is not None:
            raise InputError("--sigma1, --threshold and --max-answers apply only to confident-gnmax")
        if self.max_answers is not None:
            check_positive_int(max_answers=self.max_answers)
        if self.sample_rate is not None:
            if self.name != "gnmax":
                raise InputError(f"--subsample applies to the gnmax aggregator, not {self.name}")
            check_in_interval(0.0, 1.0, hi_open=False, sample_rate=self.sample_rate)

    def check_teachers(self, n_teachers: int) -> None:
        """The threshold must lie in [0, K] (a count of teacher votes)."""
        if self.threshold is not None and self.threshold > n_teachers:
            raise InputError(
                f"expected threshold in [0, {n_teachers}] (the number of teachers), got {self.threshold:g}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def vote_histogram(votes: np.ndarray, n_classes: int) -> np.ndarray:
    """(n_queries, n_classes) counts from a (n_teachers, n_queries) array of class votes in [0, n_classes)."""
    v = np.asarray(votes)
    if v.ndim != 2 or not np.issubdtype(v.dtype, np.integer):
        raise InputError(f"expected votes as a 2-D integer array (teachers, queries), got {v.dtype} {v.shape}")
    if v.size and (v.min() < 0 or v.max() >= n_classes):
        raise InputError(f"expected votes in [0, {n_classes}), got values in [{v.min()}, {v.max()}]")
    hist = np.zeros((v.shape[1], n_classes), dtype=np.int64)
    for t in range(v.shape[0]):
        np.add.at(hist, (np.arange(v.shape[1]), v[t]), 1)
    return hist


def _check_hist(hist: np.ndarray) -> np.ndarray:
    h = np.asarray(hist)
    if h.ndim != 2 or h.shape[1] < 2:
        raise InputError(f"expected a (queries, classes >= 2) vote histogram, got shape {h.shape}")
    if np.any(h < 0) or not np.all(np.isfinite(h)):
        raise InputError("vote counts must be finite and non-negative")
    return h.astype(np.float64)


def aggregate(hist: np.ndarray, config: AggregatorConfig, seed: int | np.random.Generator) -> np.ndarray:
    """Noisy answers (class index, or -1 when Confident-GNMax declines) for each row of ``hist``.

    The noise is drawn in one fixed order from ``np.random.default_rng(seed)`` (deterministic).
    Ties of the noisy argmax (probability 0 with continuous noise) go to the smallest class index.
    """
    h = _check_hist(hist)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    q, c = h.shape
    if config.name == "argmax":
        return h.argmax(1).astype(np.int64)
    if config.name == "lnmax":
        # Papernot et al. 2017 (arXiv:1610.05755), Eq. 1: argmax_j n_j + Lap(1/gamma).
        return (h + rng.laplace(0.0, config.sigma, size=(q, c))).argmax(1).astype(np.int64)
    if config.name == "gnmax":
        # Papernot et al. 2018 (arXiv:1802.08908), Sec. 4.1: argmax_j n_j + N(0, sigma^2).
        return (h + rng.normal(0.0, config.sigma, size=(q, c))).argmax(1).astype(np.int64)
    # Confident-GNMax, Papernot et al. 2018, Alg. 1: if max_j n_j + N(0, sigma1^2) >= T then
    # argmax_j n_j + N(0, sigma2^2) else decline. All noise drawn up front (fixed order).
    check_noise = rng.normal(0.0, config.sigma1, size=q)
    answer_noise = rng.normal(0.0, config.sigma, size=(q, c))
    passed = h.max(1) + check_noise >= config.threshold
    answers = np.where(passed, (h + answer_noise).argmax(1), -1).astype(np.int64)
    if config.max_answers is not None:
        answered = np.flatnonzero(answers >= 0)
        answers[answered[config.max_answers :]] = -1  # the cap: stop answering (queries are sequential)
    return answers


# ------------------------------------------------------------------------- data-independent claim


def aggregator_event(config: AggregatorConfig, n_queries: int, n_classes: int) -> Event:
    """The data-independent mechanism of answering ``n_queries`` queries (what the claim accounts)."""
    n_queries = check_positive_int(n_queries=n_queries)
    if config.name == "argmax":
        return NonPrivate()
    if config.name == "lnmax":
        return SelfComposed(LNMax(config.sigma, n_classes), n_queries)
    if config.name == "gnmax" and config.sample_rate is not None:
        # One added record joins its (data-independent) teacher's prompt only when sampled; that teacher's vote
        # moves the histogram by at most sqrt(2) in L2, so GNMax is post-processing of a Gaussian release of
        # the histogram with noise multiplier sigma / sqrt(2) (Papernot et al. 2018, Prop. 8), Poisson-
        # subsampled per query: the sampled Gaussian mechanism (Mironov, Talwar & Zhang 2019), add/remove.
        return SelfComposed(PoissonSampled(config.sample_rate, Gaussian(config.sigma / math.sqrt(2.0))), n_queries)
    if config.name == "gnmax":
        return SelfComposed(GNMax(config.sigma, n_classes), n_queries)
    # The threshold check: Gaussian noise on max_j n_j, which one record moves by at most 1 (sensitivity 1
    # under either neighbouring relation; accounted as add/remove with C = 1: alpha / (2 sigma1^2) RDP).
    answers = n_queries if config.max_answers is None else min(config.max_answers, n_queries)
    return Composed(
        (SelfComposed(Gaussian(config.sigma1), n_queries), SelfComposed(GNMax(config.sigma, n_classes), answers))
    )


def data_independent_epsilon(config: AggregatorConfig, n_queries: int, n_classes: int, delta: float) -> dict[str, Any]:
    """(epsilon, how) of the data-independent analysis. Formal guarantee.

    LNMax: the smaller of pure-DP basic composition n_queries * 2/b at delta = 0 (Papernot et al. 2017,
    Sec. 3: one query is (2 gamma, 0)-DP; Dwork & Roth 2014, Thm. 3.16) and the RDP accountant at delta.
    GNMax / Confident-GNMax: the RDP accountant (Papernot et al. 2018, Prop. 8: alpha / sigma^2 per query).
    """
    from dpaudit.accounting import epsilon_for

    delta = check_in_interval(0.0, 1.0, delta=delta)
    event = aggregator_event(config, n_queries, n_classes)
    if config.name == "argmax":
        return {"epsilon": math.inf, "accountant": None, "event": event.to_dict()}
    eps_rdp = float(epsilon_for(event, delta, "rdp"))
    out = {"epsilon": eps_rdp, "accountant": "rdp", "event": event.to_dict()}
    if config.name == "lnmax":
        pure = n_queries * 2.0 / config.sigma  # basic composition of (2/b, 0)-DP queries
        out["pure_dp_epsilon"] = pure
        if pure <= eps_rdp:
            out.update(epsilon=pure, accountant="pure-dp basic composition")
    return out


def calibrate_aggregator(
    config: AggregatorConfig, *, target_epsilon: float, delta: float, n_queries: int, n_classes: int
) -> AggregatorConfig:
    """The config with the smallest answer-step noise ``sigma`` meeting ``target_epsilon`` (verified).

    For Confident-GNMax ``sigma1`` is kept; the target must exceed the threshold step's own cost.
    """
    import dataclasses

    from dpaudit.accounting.calibration import calibrate_noise_multiplier

    if config.name == "argmax":
        raise InputError("the argmax aggregator is not private; a target epsilon needs lnmax, gnmax or confident-gnmax")

    def make(s: float) -> Event:  # calibrate_noise_multiplier only tries s > 0
        return aggregator_event(dataclasses.replace(config, sigma=s), n_queries, n_classes)

    # The claim is never above the RDP epsilon (LNMax claims min(pure, RDP)), so meeting the target under
    # RDP meets it for the claim.
    sigma = calibrate_noise_multiplier(
        target_epsilon=target_epsilon, delta=delta, make_event=make, max_noise_multiplier=1e7
    )
    return dataclasses.replace(config, sigma=sigma)


# ------------------------------------------------------------------------- data-dependent analysis


def data_dependent_rdp(hist: np.ndarray, answers: np.ndarray, config: AggregatorConfig, orders) -> np.ndarray:
    """Total data-dependent RDP curve of answering the rows of ``hist`` (:mod:`dpaudit.accounting.pate_smooth`).

    Confident-GNMax: every query pays the threshold check, answered ones (``answers >= 0``) also GNMax.
    LNMax: Papernot et al. 2017, Thm. 3 per query with Lemma 4's q (pure eps = 2/b per query)."""
    h = _check_hist(hist)
    orders = np.asarray(orders, dtype=np.float64)
    answers = np.asarray(answers)
    if config.name not in ("gnmax", "confident-gnmax", "lnmax"):
        raise InputError(f"the data-dependent analysis covers lnmax, gnmax and confident-gnmax, not {config.name}")
    total = np.zeros_like(orders)
    if config.name == "lnmax":
        for lq in log_q_lnmax(h, config.sigma):
            total += rdp_lnmax_data_dependent(float(lq), 2.0 / config.sigma, orders)
        return total
    if config.name == "confident-gnmax":
        for m in h.max(1):
            total += rdp_threshold_data_dependent(float(m), config.threshold, config.sigma1, orders)
        rows = np.flatnonzero(answers >= 0)
    else:
        rows = np.arange(len(h))
    if len(rows):
        for lq in log_q_gnmax(h[rows], config.sigma):
            total += rdp_gnmax_data_dependent(float(lq), config.sigma, orders)
    return total


def data_dependent_epsilon(hist: np.ndarray, answers: np.ndarray, config: AggregatorConfig, delta: float) -> float:
    """epsilon(delta) of :func:`data_dependent_rdp` (RDP-to-DP conversion of the accounting layer).
    NOT a differential-privacy guarantee by itself: it depends on the private votes."""
    from dpaudit.accounting.rdp import DEFAULT_ORDERS, rdp_to_epsilon

    orders = np.asarray(DEFAULT_ORDERS)
    return float(rdp_to_epsilon(orders, data_dependent_rdp(hist, answers, config, orders), delta)[0])


CLAIMS = ("data-independent", "data-dependent")


def check_data_dependent_claim(config: AggregatorConfig) -> None:
    """Refuse ``--claim data-dependent`` where the sanitiser has no analysis: it covers GNMax and Confident-GNMax on
    fixed teachers (Papernot et al. 2018, Sec. 4.3 and App. C), not LNMax nor per-query subsampled teachers."""
    if config.name not in ("gnmax", "confident-gnmax"):
        raise InputError(
            f"--claim data-dependent needs gnmax or confident-gnmax (the smooth-sensitivity sanitiser of Papernot "
            f"et al. 2018 covers those), not {config.name}"
        )
    if config.sample_rate is not None:
        raise InputError(
            "--claim data-dependent does not cover --subsample (the smooth-sensitivity sanitiser of Papernot et al. "
            "2018 is analysed for fixed teachers); use the data-independent claim"
        )


def check_sanitiser_applies(
    config: AggregatorConfig, *, n_queries: int, n_classes: int, n_teachers: int, delta: float,
    sanitiser: SanitiserConfig | None = None,
) -> None:  # fmt: skip
    """Before any vote: the sanitiser's public rule at these public settings (what :func:`privacy_record` will
    choose; cached), so that a setting where its analysis does not hold (an order where conditions C5-C6 of
    Papernot et al. 2018 fail, :func:`dpaudit.accounting.pate_smooth.conditions_hold`) is refused before the
    teachers train, not after."""
    check_data_dependent_claim(config)
    params = _sanitiser_params(config)
    choose_sanitiser(
        config.name, n_queries=n_queries, max_answers=params["max_answers"], n_classes=n_classes,
        n_teachers=n_teachers, params=params, delta=delta, fixed=sanitiser or SanitiserConfig(),
    )  # fmt: skip


def _sanitiser_params(config: AggregatorConfig) -> dict[str, Any]:
    """The aggregator's public settings as :func:`dpaudit.accounting.pate_smooth.sanitised_claim` takes them."""
    return {
        "sigma": config.sigma, "sigma1": config.sigma1 or 0.0, "threshold": config.threshold or 0.0,
        "max_answers": config.max_answers,
    }  # fmt: skip


def privacy_record(
    config: AggregatorConfig,
    hist: np.ndarray,
    answers: np.ndarray,
    *,
    delta: float,
    n_teachers: int,
    claim: str = "data-independent",
    sanitiser: SanitiserConfig | None = None,
    seed: int | np.random.Generator = 0,
) -> dict[str, Any] | None:
    """The checkpoint's privacy claim (None for the non-private ``argmax`` aggregator).

    ``claim="data-independent"`` (default): the formal data-independent epsilon; nothing computed from the
    votes is recorded (see :func:`private_diagnostics`). ``claim="data-dependent"``: the data-dependent
    analysis released through smooth sensitivity (:func:`dpaudit.accounting.pate_smooth.sanitised_claim`,
    Papernot et al. 2018, Sec. 4.3 and App. C; GNMax / Confident-GNMax), with its own (epsilon, delta): the
    sanitiser's releases are charged, and the claimed value is not below the data-dependent epsilon except
    with probability delta/2 (inside the claim's delta). The data-independent epsilon is recorded beside it.
    ``seed``: the sanitiser's noise.
    """
    check_choice(CLAIMS, claim=claim)
    if config.name == "argmax":
        return None
    h = _check_hist(hist)
    n_queries, n_classes = h.shape
    di = data_independent_epsilon(config, n_queries, n_classes, delta)
    answered = np.asarray(answers) >= 0
    record: dict[str, Any] = {
        "epsilon": di["epsilon"],
        "delta": delta,
        "accountant": di["accountant"],
        "neighbouring": "replace_one" if config.sample_rate is None else "add_remove",
        "event": di["event"],
        "aggregator": config.to_dict(),
        "n_teachers": int(n_teachers),
        "n_queries": int(n_queries),
        "n_answered": int(answered.sum()),
        "claim": claim,
        "analysis": "data-independent (formal): "
        + (NEIGHBOURING_NOTE if config.sample_rate is None else SUBSAMPLED_NOTE),
    }
    if "pure_dp_epsilon" in di:
        record["pure_dp_epsilon"] = di["pure_dp_epsilon"]
    if claim == "data-independent":
        return record
    check_data_dependent_claim(config)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    s = sanitised_claim(
        config.name, h, answered, n_teachers=n_teachers, params=_sanitiser_params(config), delta=delta,
        config=sanitiser or SanitiserConfig(), rng=rng,
    )  # fmt: skip
    record.update(
        epsilon=s["public"]["epsilon"],
        accountant="rdp, data-dependent, sanitised with smooth sensitivity",
        data_independent_epsilon=di["epsilon"],
        sanitised=s["public"],
        sanitiser={**(sanitiser or SanitiserConfig()).to_dict(), "rule": SANITISER_RULE_NOTE},
        analysis=SANITISED_NOTE + " " + NEIGHBOURING_NOTE,
    )
    return record


def private_diagnostics(config: AggregatorConfig, hist: np.ndarray, answers: np.ndarray, *, delta: float,
                        n_teachers: int, sanitiser: SanitiserConfig | None = None) -> dict[str, Any]:  # fmt: skip
    """Values computed from the private votes, NOT differentially private (for the experimenter only; a run
    keeps them only when asked, ``--keep-private-diagnostics``): the raw data-dependent epsilon (Papernot et
    al. 2018, Thm. 6 with Prop. 7/10; LNMax: Papernot et al. 2017, Thm. 3) and, for GNMax / Confident-GNMax,
    the raw RDP and smooth sensitivity the sanitiser hid."""
    out: dict[str, Any] = {"private": False, "note": DATA_DEPENDENT_NOTE}
    if config.name == "argmax":
        return out
    h = _check_hist(hist)
    di = data_independent_epsilon(config, h.shape[0], h.shape[1], delta)["epsilon"]
    out["data_dependent_epsilon"] = min(data_dependent_epsilon(h, answers, config, delta), di)
    if config.name in ("gnmax", "confident-gnmax"):
        s = sanitised_claim(
            config.name, h, np.asarray(answers) >= 0, n_teachers=n_teachers, params=_sanitiser_params(config),
            delta=delta, config=sanitiser or SanitiserConfig(), rng=np.random.default_rng(0),
        )  # fmt: skip
        out.update(s["private"], order=s["public"]["order"])
    return out
