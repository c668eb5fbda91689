"""Membership inference on in-context learning: was this record among the prompt's exemplars?

Threat model (Wu et al. 2024, arXiv:2305.01639, Sec. 5; Duan et al. 2023, "On the privacy risk of
in-context learning"): the attacker queries the deployed predictor with a candidate record and scores
how confidently it returns the record's label; an in-context learner that copies its exemplars answers
its own exemplars more confidently. Score convention (attacks/result.py): higher = member.

* One prompt, no noise (epsilon = infinity): score = predicted probability of the candidate's label.
* DP-ICL (K prompts of k disjoint exemplars, noisy vote of :mod:`dpaudit.aggregation`): the attacker
  sees only the released label, score = 1[answer == label]. The aggregator is calibrated so that *all*
  the attacker's queries of one trial together meet the target epsilon (data-independent); for
  Confident-GNMax sigma1 is kept unless its threshold step alone would cost more than half of it
  (:func:`fit_threshold_step`).

Each trial uses fresh records (members = the exemplars, non-members = as many unused records), so the
trials compose in parallel. Exemplar canaries (:func:`icl_canary_scores`) give a formal one-run audit
(Steinke, Nasr & Jagielski 2023, arXiv:2305.08846) of the aggregator's claim.
"""

from __future__ import annotations

import math

import numpy as np

from attacks.result import AttackResult
from dpaudit.aggregation import AggregatorConfig, aggregate, calibrate_aggregator, vote_histogram
from dpaudit.errors import InputError
from dpaudit.seeding import derive_seed
from dpaudit.training.icl import make_predictor
from dpaudit.validation import check_positive_int


def _private_answers(
    predictor, ex_X, ex_y, parts, queries_X, n_classes, epsilon, delta, seed, aggregator=None
) -> np.ndarray:
    """The noisy-vote answers of ``aggregator`` (its kind and settings; None: GNMax) with its answer-step noise
    calibrated to ``epsilon`` over these queries."""
    from dpaudit.training.pate import icl_votes

    hist = vote_histogram(icl_votes(predictor, ex_X, ex_y, parts, queries_X), n_classes)
    template = aggregator if aggregator is not None else AggregatorConfig("gnmax", sigma=1.0)
    template = fit_threshold_step(template, epsilon=epsilon, delta=delta, n_queries=len(queries_X))
    agg = calibrate_aggregator(
        template, target_epsilon=epsilon, delta=delta, n_queries=len(queries_X), n_classes=n_classes
    )
    return aggregate(hist, agg, seed)


def fit_threshold_step(config: AggregatorConfig, *, epsilon: float, delta: float, n_queries: int) -> AggregatorConfig:
    """Confident-GNMax's threshold step, a Gaussian of noise sigma1 on every query (Papernot et al. 2018, Alg. 1),
    costs epsilon whatever the answer step's noise; a run's sigma1 fitted to its own query count can alone exceed the
    run's epsilon over more simulated queries, and calibrating sigma2 then failed ("target epsilon ... not
    reachable"). Where the threshold step over ``n_queries`` costs more than epsilon / 2 (RDP, as the claim),
    sigma1 is raised to the smallest value costing epsilon / 2, leaving the other half to the answer step; public
    settings only. Other aggregators, and a sigma1 that fits, are returned as they are."""
    import dataclasses

    from dpaudit.accounting import epsilon_for
    from dpaudit.accounting.calibration import calibrate_noise_multiplier
    from dpaudit.events import Gaussian, SelfComposed

    if config.name != "confident-gnmax" or not math.isfinite(epsilon):
        return config
    half = epsilon / 2.0
    if epsilon_for(SelfComposed(Gaussian(config.sigma1), n_queries), delta, "rdp") <= half:
        return config
    sigma1 = calibrate_noise_multiplier(
        target_epsilon=half, delta=delta, make_event=lambda s: SelfComposed(Gaussian(s), n_queries),
        max_noise_multiplier=1e7,
    )  # fmt: skip
    return dataclasses.replace(config, sigma1=sigma1)


def icl_membership(
    X: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    *,
    shots: int,
    teachers: int = 1,
    epsilon: float = math.inf,
    delta: float = 1e-5,
    trials: int = 20,
    predictor: str = "knn",
    seed: int = 0,
    aggregator: AggregatorConfig | None = None,
    tokens: bool = False,
) -> AttackResult:
    """The ICL membership attack on records (X, y) (already preprocessed features; ``tokens``: X holds sequences of
    token ids, which the predictor compares as bags of tokens, :mod:`dpaudit.training.icl`).

    ``epsilon = inf`` with ``teachers = 1``: one non-private prompt of ``shots`` exemplars, probability
    scores. Finite ``epsilon``: DP-ICL with ``teachers`` prompts and ``aggregator``'s kind (None: GNMax),
    its answer-step noise calibrated to ``epsilon`` over
    the 2 * teachers * shots queries of a trial. Up to ``trials`` trials on disjoint records."""
    shots, teachers, trials = (check_positive_int(shots=shots), check_positive_int(teachers=teachers),
                               check_positive_int(trials=trials))  # fmt: skip
    X, y = np.asarray(X), np.asarray(y, dtype=np.int64)
    per_trial = 2 * shots * teachers
    n_trials = min(trials, len(X) // per_trial)
    if n_trials < 1:
        raise InputError(f"the ICL attack needs {per_trial} records per trial, the data has {len(X)}")
    pred = make_predictor(predictor, n_classes, tokens=tokens)
    perm = np.random.default_rng(derive_seed(seed, stream=10)).permutation(len(X))
    scores, member, ids = [], [], []
    for r in range(n_trials):
        idx = perm[r * per_trial : (r + 1) * per_trial]
        ex, out = idx[: per_trial // 2], idx[per_trial // 2 :]
        cand = np.concatenate([ex, out])
        parts = [np.arange(t * shots, (t + 1) * shots) for t in range(teachers)]
        if math.isinf(epsilon):
            if teachers != 1:
                raise InputError("the non-private ICL attack uses one prompt (teachers = 1)")
            proba = pred.predict_proba(X[ex], y[ex], X[cand])
            s = proba[np.arange(len(cand)), y[cand]]
        else:
            answers = _private_answers(pred, X[ex], y[ex], parts, X[cand], n_classes, epsilon, delta,
                                       derive_seed(seed, stream=1000 + r), aggregator)  # fmt: skip
            s = (answers == y[cand]).astype(np.float64)
        scores.append(s)
        member.append(np.r_[np.ones(len(ex), bool), np.zeros(len(out), bool)])
        ids.append(cand)
    kind = None if math.isinf(epsilon) else (aggregator.name if aggregator is not None else "gnmax")
    params = {"shots": shots, "teachers": teachers, "epsilon": epsilon, "delta": delta, "trials": n_trials,
              "predictor": predictor, "aggregator": kind}  # fmt: skip
    return AttackResult.from_scores(
        "icl", np.concatenate(scores), np.concatenate(member), np.concatenate(ids), params, seed=seed
    )


def icl_canary_scores(
    X: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    *,
    canaries: int,
    shots: int,
    teachers: int = 1,
    epsilon: float = math.inf,
    delta: float = 1e-5,
    predictor: str = "knn",
    seed: int = 0,
    aggregator: AggregatorConfig | None = None,
    tokens: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Scores and inclusion bits of mislabeled exemplar canaries in (DP-)ICL, for a one-run audit
    (:func:`dpaudit.workflows.icl.icl_canary_audit`; Steinke, Nasr & Jagielski 2023, Thm. 3.1).

    ``teachers * shots`` ordinary exemplars fill the prompts; then ``canaries`` further records get a
    random wrong label and a fixed teacher each (chosen before inclusion), and each is added to its
    teacher's prompt independently with probability 1/2. Every canary is queried once; the score is
    1[answer == the canary's wrong label] (probability of that label for the non-private one prompt).
    Adding a canary changes one teacher's prompt, which the aggregator's one-vote analysis covers.
    ``tokens``: X holds sequences of token ids. Returns ``(scores, included)`` (higher = member)."""

    m = check_positive_int(canaries=canaries)
    n_ex = shots * teachers
    if n_ex + m > len(X):
        raise InputError(f"{n_ex} exemplars + {m} canaries exceed the {len(X)} records")
    rng = np.random.default_rng(derive_seed(seed, stream=20))
    perm = rng.permutation(len(X))
    ex, can = perm[:n_ex], perm[n_ex : n_ex + m]
    y_can = (y[can] + rng.integers(1, n_classes, size=m)) % n_classes  # a wrong label (mislabeled canary)
    owner = rng.integers(0, teachers, size=m)
    included = rng.random(m) < 0.5
    ex_X = np.concatenate([X[ex], X[can][included]])
    ex_y = np.concatenate([y[ex], y_can[included]])
    own = np.concatenate([np.repeat(np.arange(teachers), shots), owner[included]])
    parts = [np.flatnonzero(own == t) for t in range(teachers)]
    pred = make_predictor(predictor, n_classes, tokens=tokens)
    if math.isinf(epsilon):
        if teachers != 1:
            raise InputError("the non-private ICL audit uses one prompt (teachers = 1)")
        scores = pred.predict_proba(ex_X, ex_y, X[can])[np.arange(m), y_can]
    else:
        answers = _private_answers(pred, ex_X, ex_y, parts, X[can], n_classes, epsilon, delta,
                                   derive_seed(seed, stream=21), aggregator)  # fmt: skip
        scores = (answers == y_can).astype(np.float64)
    return scores, included
