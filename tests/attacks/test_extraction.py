"""Model extraction: the query API, equation solving (Tramèr et al. 2016, §4.1), learning-based
extraction, budget accounting, saving the surrogate, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.special import softmax
from typer.testing import CliRunner

from attacks.extraction import (
    AttackerKnowledge,
    EquationSolver,
    QueryPool,
    composed_linear_parameters,
    equation_attack,
    extract,
    learning_attack,
    parameter_relative_error,
    save_surrogate,
    surrogate_spec,
)
from attacks.query_api import ApiMode, FeatureBox, PredictionAPI, QueryBudgetExceeded
from dpaudit.errors import InputError

DIGITS_D = 64  # digits' 8x8 features: equation solving needs d+1 = 65 queries

runner = CliRunner()


def _train(out, data: str, kind: str, **config):
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset(data)
    hidden = config.pop("hidden", None)
    options = {"hidden": hidden} if hidden else {}
    spec = default_spec(kind, input_shape=ds.feature_shape, n_classes=ds.n_classes, **options)
    train_run(ds, spec, TrainConfig(**config), out=out)
    return out


@pytest.fixture(scope="module")
def digits_logreg(tmp_path_factory):
    """Softmax regression on digits (10 classes, 64 features), non-private."""
    return _train(tmp_path_factory.mktemp("ext") / "logreg", "digits", "logreg", epochs=10, lr=0.1, seed=0)


@pytest.fixture(scope="module")
def binary_logreg(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("ext") / "binary", "synthetic:n=400,d=20,classes=2,seed=3", "logreg",
                  epochs=10, lr=0.1, seed=0)  # fmt: skip


@pytest.fixture(scope="module")
def digits_mlp(tmp_path_factory):
    """A small MLP on digits (one hidden layer of 32 units)."""
    return _train(tmp_path_factory.mktemp("ext") / "mlp", "digits", "mlp", hidden=(32,), epochs=10, lr=0.1, seed=0)


@pytest.fixture(scope="module")
def dp_logreg(tmp_path_factory):
    """Softmax regression on digits trained with DP-SGD at ε = 1."""
    from dpaudit.training.config import DPConfig

    return _train(tmp_path_factory.mktemp("ext") / "dp", "digits", "logreg", algo="dpsgd", epochs=5, lr=1.0, seed=0,
                  dp=DPConfig(target_epsilon=1.0))  # fmt: skip


def _load(path):
    from dpaudit.checkpoint import load_run

    return load_run(path)


def _assert_exact_to_float32(run, budget: int, api: str) -> float:
    """Equation solving recovers a float32 linear model to the precision its answers carry; returns
    the relative parameter error that ``extract`` reports.

    A fixed threshold is not a statement about the solver: the same model gave 8.7e-8 with AVX2
    kernels and 2.3e-6 with ``ATEN_CPU_CAPABILITY=default`` (another summation order in float32).
    What holds everywhere, per class k against the reference K, with A = [x_i, 1] and
    y_ik = ln(p_ik/p_iK) (or z_ik - z_iK):
    (a) least squares with a zero-residual system: θ̂_k - θ_k = A⁺δ_k for the answers' errors
        δ_ik = y_ik - A_i·θ_k, so ||θ̂_k - θ_k|| <= ||A⁺||₂·||δ_k||₂ (exact arithmetic; float64 adds
        ~κ(A)·1e-16) — a solver mistake breaks it;
    (b) the answers carry float32 rounding only: |δ_ik| <= (d + 6)·u·(S_ik + 1 + |y_ik|), u = 2^-24,
        S_ik = Σ_j (|W_kj| + |W_Kj|)|x'_ij| + |b_k| + |b_K| over the standardised x' (first-order error
        of the standardisation, a length-d dot product and the bias add, γ_n ≈ n·u, Higham 2002
        §3.1, eq. 3.5; a few more u for the softmax and log) — an API that degrades answers breaks it.
    """
    r = extract(run, budget=budget, api=api, method="equations").result
    knowledge = AttackerKnowledge.from_records(run.dataset().X[run.splits.aux])
    target = PredictionAPI.from_run(run, ApiMode.parse(api), budget=budget)
    X, A = equation_attack(target, knowledge, budget=budget, pool="synthetic", seed=0)  # extract's queries
    solver = EquationSolver(api).fit(X, A)
    W, b = composed_linear_parameters(run)
    assert parameter_relative_error(solver.coef_, solver.intercept_, W, b) == r.parameter_relative_error
    Xf = X.reshape(len(X), -1).astype(np.float64)
    design = np.hstack([Xf, np.ones((len(X), 1))])
    pinv = np.linalg.norm(np.linalg.pinv(design), 2)
    linear = next(m for m in run.model.modules() if isinstance(m, torch.nn.Linear))
    Wl, bl = linear.weight.detach().double().numpy(), linear.bias.detach().double().numpy()
    pre = run.preprocessing
    Xs = (Xf - pre.mean.astype(np.float64).ravel()) / pre.scale.astype(np.float64).ravel()
    Y = np.log(A[:, :-1]) - np.log(A[:, -1:]) if api == "probs" else A[:, :-1] - A[:, -1:]
    u, d = 2.0**-24, Xf.shape[1]
    for k in range(Y.shape[1]):
        theta = np.append(W[k] - W[-1], b[k] - b[-1])
        delta = Y[:, k] - design @ theta
        S = np.abs(Xs) @ (np.abs(Wl[k]) + np.abs(Wl[-1])) + abs(bl[k]) + abs(bl[-1])
        assert np.all(np.abs(delta) <= (d + 6) * u * (S + 1 + np.abs(Y[:, k])))  # (b)
        got = np.append(solver.coef_[k], solver.intercept_[k])
        assert np.linalg.norm(got - theta) <= pinv * np.linalg.norm(delta) * (1 + 1e-6) + 1e-12  # (a)
    return r.parameter_relative_error


# --------------------------------------------------------------------------- the query API


def _oracle_api(mode, budget=None, *, seed=0, d=5, k=3):
    """A float64 softmax regression on standardised features, in numpy (no torch), and its API."""
    rng = np.random.default_rng(seed)
    W, b = rng.normal(size=(k, d)), rng.normal(size=k)
    mu, s = rng.normal(size=d), rng.uniform(0.5, 2.0, size=d)

    def logits(X):
        return ((np.asarray(X, np.float64) - mu) / s) @ W.T + b

    api = PredictionAPI(logits, mode=mode, n_classes=k, feature_shape=(d,), budget=budget, input_dtype=np.float64)
    return api, logits, (W / s, b - W @ (mu / s))


def test_api_modes_answer_as_documented():
    X = np.random.default_rng(1).normal(size=(7, 5))
    _, logits, _ = _oracle_api("logits")
    z = logits(X)
    p = softmax(z, axis=1)
    for mode, expected in [
        ("probs", p),
        ("rounded:3", np.round(p, 3)),
        ("labels", z.argmax(axis=1)),
        ("logits", z),
    ]:
        api, _, _ = _oracle_api(mode)
        np.testing.assert_array_equal(api.query(X), expected)
    assert _oracle_api("labels")[0].query(X).dtype == np.int64
    assert str(ApiMode.parse("Rounded:4")) == "rounded:4"


@pytest.mark.parametrize("text", ["soft", "rounded", "rounded:x", "rounded:-1", "rounded:16", "probs:3", "", "labels:"])
def test_api_mode_refuses_unknown_modes(text):
    with pytest.raises(InputError, match="api mode"):
        ApiMode.parse(text)


def test_api_budget_is_counted_exactly_and_refused_whole():
    api, _, _ = _oracle_api("probs", budget=5)
    X = np.zeros((3, 5))
    api.query(X)
    api.query(X[:2])
    assert api.queries_used == 5 and api.remaining == 0
    with pytest.raises(QueryBudgetExceeded, match="budget exceeded: 1 queries asked, 0 of 5 left"):
        api.query(X[:1])
    assert api.queries_used == 5  # a refused batch is not answered, so not counted
    api2, _, _ = _oracle_api("probs", budget=4)
    with pytest.raises(QueryBudgetExceeded):
        api2.query(np.zeros((5, 5)))  # more than the whole budget: nothing answered
    assert api2.queries_used == 0
    with pytest.raises(InputError, match="expected queries of shape"):
        api2.query(np.zeros((2, 4)))


def test_api_of_a_checkpoint_applies_its_preprocessing(digits_logreg):
    """Raw features in; the API answers what (x - μ)/s through the linear layer gives."""
    run = _load(digits_logreg)
    ds = run.dataset()
    X = ds.X[run.splits.test[:20]]
    W = run.model[1].weight.detach().double().numpy()
    b = run.model[1].bias.detach().double().numpy()
    pre = run.preprocessing
    manual = ((X.reshape(20, -1) - pre.mean.ravel()) / pre.scale.ravel()) @ W.T + b
    np.testing.assert_allclose(PredictionAPI.from_run(run, "logits").query(X), manual, rtol=1e-5, atol=1e-5)
    # ... and the composed raw-space parameters reproduce it (what the attacker is compared against).
    Wr, br = composed_linear_parameters(run)
    np.testing.assert_allclose(X.reshape(20, -1).astype(np.float64) @ Wr.T + br, manual, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- equation solving


@pytest.mark.parametrize("k", [2, 4])
def test_equations_are_exact_on_a_float64_model(k):
    """Oracle: a float64 numpy model leaves only float64 rounding, so d+1 queries recover the
    parameter differences to ~1e-12 (binary: the logit ln(f/(1-f)) = w·x + b of Tramèr et al. §4.1)."""
    api, _, (W, b) = _oracle_api("probs", budget=6, d=5, k=k, seed=k)
    X0 = np.random.default_rng(0).normal(size=(50, 5))
    knowledge = AttackerKnowledge.from_records(X0)
    X, A = equation_attack(api, knowledge, budget=6)
    solver = EquationSolver("probs").fit(X, A)
    assert parameter_relative_error(solver.coef_, solver.intercept_, W, b) < 1e-12
    assert api.queries_used == 6
    # Only differences are identifiable: the reference (last) class's row is 0, the others are shifted.
    np.testing.assert_array_equal(solver.coef_[-1], 0.0)
    np.testing.assert_allclose(solver.coef_[0], W[0] - W[-1], rtol=1e-10)


def test_equations_recover_the_digits_softmax(digits_logreg):
    """Acceptance: d+1 = 65 probability queries recover the model to the precision of its float32
    answers (:func:`_assert_exact_to_float32`; measured 8.6e-8 relative here) and fidelity 100%."""
    run = _load(digits_logreg)
    for api in ("probs", "logits"):
        _assert_exact_to_float32(run, DIGITS_D + 1, api)
        r = extract(run, budget=DIGITS_D + 1, api=api, method="equations").result
        assert r.queries == DIGITS_D + 1
        assert r.fidelity == 1.0 and r.fidelity_uniform == 1.0
        assert r.surrogate_accuracy == r.target_accuracy
    # The comparison bites: against the model's own (standardised-space) layer, or against the raw
    # parameters without taking differences, the same solution is far off.
    ex = extract(run, budget=DIGITS_D + 1, method="equations")
    W_pre = run.model[1].weight.detach().double().numpy()
    b_pre = run.model[1].bias.detach().double().numpy()
    coef, intercept = ex.surrogate.linear_parameters()
    assert parameter_relative_error(coef, intercept, W_pre, b_pre) > 0.1
    Wr, _ = composed_linear_parameters(run)
    raw = np.linalg.norm(coef - Wr) / np.linalg.norm(Wr)
    assert raw > 0.1  # the shift shared by all classes is not identifiable


def test_equations_recover_a_binary_logistic_regression(binary_logreg):
    run = _load(binary_logreg)
    _assert_exact_to_float32(run, 21, "probs")
    r = extract(run, budget=21, api="probs", method="equations").result
    assert r.fidelity == 1.0 and r.fidelity_uniform == 1.0
    assert r.method == "equations" and extract(run, budget=21).result.method == "equations"  # auto


def test_rounding_needs_least_squares_and_more_queries_help(digits_logreg):
    """With probabilities rounded to 3 decimals the error is far above the exact case and falls
    monotonically as least squares gets more queries (measured 6.2e-3, 3.0e-3, 7.4e-4)."""
    run = _load(digits_logreg)
    exact = extract(run, budget=DIGITS_D + 1, method="equations").result.parameter_relative_error
    errors = []
    for budget in (130, 520, 2080):
        r = extract(run, budget=budget, api="rounded:3", method="equations", curve_points=1).result
        assert r.queries == budget
        errors.append(r.parameter_relative_error)
    assert errors[0] > errors[1] > errors[2]
    assert errors[-1] > 100 * exact
    assert errors[-1] < 1e-2
    with pytest.raises(InputError, match="usable equations"):  # d+1 rounded answers are mostly 0 and 1
        extract(run, budget=DIGITS_D + 1, api="rounded:3", method="equations")


def test_rounded_equations_do_not_depend_on_the_classes_order():
    """Metamorphic: relabelling the classes (permuting the answers' columns) permutes the extracted model and
    changes nothing else. Rounded to 1 decimal, 5.3% of these queries tie for the top probability; the solver
    anchored each query's log-ratios on the first tied class (argmax), so its logits moved by up to 0.015
    and its fidelity from 0.9950 to 0.9965 with the order (24 orders). Now every tied class is an anchor
    (weight 1/t): the logits agree to float64 rounding (measured 7e-13; normal equations, condition number
    squared, hence 1e-9) and the fidelity is 0.9965 for every order. Planted: the argmax anchor fails it."""
    api, logits, _ = _oracle_api("rounded:1", d=5, k=4, seed=0)
    rng = np.random.default_rng(0)
    X, X_test = rng.normal(size=(400, 5)), rng.normal(size=(2000, 5))
    P = api.query(X)
    assert np.sum(np.sum(P == P.max(axis=1, keepdims=True), axis=1) > 1) > 10  # ties are there to break
    target = logits(X_test).argmax(axis=1)
    base = EquationSolver("rounded:1").fit(X, P).decision_function(X_test)
    base -= base.mean(axis=1, keepdims=True)  # only differences between classes are identifiable
    for seed in range(6):
        perm = np.random.default_rng(seed).permutation(4)  # new class j is old class perm[j]
        z = np.empty_like(base)
        z[:, perm] = EquationSolver("rounded:1").fit(X, P[:, perm]).decision_function(X_test)
        np.testing.assert_allclose(z - z.mean(axis=1, keepdims=True), base, rtol=0, atol=1e-9)
        assert np.mean(z.argmax(axis=1) == target) == np.mean(base.argmax(axis=1) == target)


def test_rounded_equations_are_the_documented_weighted_least_squares_solved_densely():
    """EquationSolver on rounded answers against its docstring, written out as one dense weighted least-squares
    problem: per query, every class tied at the top probability is an anchor a (t of them), and every other class c
    with a non-zero answer gives (θ_c - θ_a)·[x, 1] = ln p_c - ln p_a with weight 1/sqrt(1/p_c² + 1/p_a²) / sqrt(t),
    the last class's θ fixed at 0. The solver's normal equations give the same logits to float64 rounding (condition
    number squared: 1e-9). Planted: every non-zero class an anchor, or the tied classes not anchors (the classes
    below the top), or ties not weighted by 1/t; a negative answer let through."""
    api, _, _ = _oracle_api("rounded:1", d=3, k=4, seed=1)
    rng = np.random.default_rng(1)
    X, X_test = rng.normal(size=(300, 3)), rng.normal(size=(50, 3))
    P = api.query(X)
    assert np.sum(np.sum(P == P.max(axis=1, keepdims=True), axis=1) > 1) > 10  # ties are there
    k, d1 = 4, 4
    rows, rhs = [], []
    for x, p in zip(X, P, strict=True):
        anchors = np.flatnonzero(p == p.max())
        for a in anchors:
            for c in np.flatnonzero(p > 0):
                if c == a:
                    continue
                w = 1.0 / np.sqrt(1.0 / p[c] ** 2 + 1.0 / p[a] ** 2) / np.sqrt(len(anchors))
                row = np.zeros((k, d1))
                row[c], row[a] = np.append(x, 1.0), -np.append(x, 1.0)
                rows.append(w * row[: k - 1].ravel())
                rhs.append(w * (np.log(p[c]) - np.log(p[a])))
    theta = np.vstack([np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)[0].reshape(k - 1, d1), np.zeros(d1)])
    expected = np.hstack([X_test, np.ones((50, 1))]) @ theta.T
    got = EquationSolver("rounded:1").fit(X, P).decision_function(X_test)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
    P[3, 1] = -0.1  # not a probability: refused, not skipped as a zero would be
    with pytest.raises(InputError, match="probabilities must be finite and non-negative"):
        EquationSolver("rounded:1").fit(X, P)


def test_a_curve_prefix_short_of_equations_does_not_abort_the_attack(binary_logreg):
    """Rounded to 1 decimal, 84 queries solve the binary logistic regression (d+1 = 21), but the curve's first
    prefix (21 queries: the axis design, whose corners answer 0 or 1) gives too few usable equations: that
    refusal aborted the whole attack (exit 2, no result; on digits, 1,000 queries at rounded:1 failed so)."""
    run = _load(binary_logreg)
    r = extract(run, budget=84, api="rounded:1", method="equations").result
    assert r.params["curve_unsolvable"] == [21]
    assert [p["queries"] for p in r.curve] == [42, 84] and r.queries == 84
    assert r.curve[-1]["parameter_relative_error"] == r.parameter_relative_error < 1.0
    with pytest.raises(InputError, match="usable equations"):  # the attack itself still refuses when it cannot
        extract(run, budget=21, api="rounded:1", method="equations")


def test_dp_does_not_protect_the_model_against_extraction(digits_logreg, dp_logreg):
    """DP-SGD (ε = 1) protects training records, not the model: equation solving recovers the DP
    model exactly as well as the non-private one."""
    for run in (_load(dp_logreg), _load(digits_logreg)):
        _assert_exact_to_float32(run, DIGITS_D + 1, "probs")
    private = extract(_load(dp_logreg), budget=DIGITS_D + 1, method="equations").result
    public = extract(_load(digits_logreg), budget=DIGITS_D + 1, method="equations").result
    assert private.fidelity == public.fidelity == 1.0
    assert private.fidelity_uniform == 1.0


def test_equations_refused_where_they_cannot_work(digits_mlp, digits_logreg):
    with pytest.raises(InputError, match=r"needs a linear model.*use --method learning"):
        extract(_load(digits_mlp), budget=500, method="equations")
    with pytest.raises(InputError, match="labels use --method learning"):
        extract(_load(digits_logreg), budget=500, api="labels", method="equations")
    with pytest.raises(InputError, match=r"minimum of equation solving: 65 queries \(d\+1 per system"):
        extract(_load(digits_logreg), budget=64, method="equations")
    with pytest.raises(InputError, match="aux pool holds"):
        extract(_load(digits_logreg), budget=5000, method="equations", pool="aux")
    with pytest.raises(InputError, match="adaptive querying is for learning"):
        extract(_load(digits_logreg), budget=100, adaptive=True, method="equations")


def test_auto_learns_where_the_budget_is_below_d_plus_1(digits_logreg):
    """`dpaudit report --extraction-budget 50` (method auto) on a digits logreg: auto chose equations, which
    need 65 queries, and the whole report stopped; learning works with 50."""
    run = _load(digits_logreg)
    r = extract(run, budget=DIGITS_D, curve_points=1, surrogate="logreg").result
    assert r.method == "learning" and r.queries == DIGITS_D
    assert extract(run, budget=DIGITS_D + 1, curve_points=1).result.method == "equations"


def test_auto_learns_from_rounded_answers_too_few_to_solve(digits_logreg):
    """`dpaudit attack extract --api rounded:2 --budget 65` (method auto) on a digits logreg: auto chose equations
    and refused (here "551 usable equations for 585 unknowns": probabilities rounded to 0 give none). Now auto trains
    the surrogate on the same 65 answers (no further query); an explicit --method equations still refuses."""
    run = _load(digits_logreg)
    r = extract(run, budget=DIGITS_D + 1, api="rounded:2", curve_points=2, surrogate="logreg").result
    assert (r.method, r.queries, r.params["method"]) == ("learning", DIGITS_D + 1, "learning")
    assert r.params["adaptive"] is False
    assert "equations unsolvable" in r.params["fallback"] and "585 unknowns" in r.params["fallback"]
    assert [p["queries"] for p in r.curve] == [(DIGITS_D + 1) // 2, DIGITS_D + 1]  # budget / 2^j, j = 1, 0
    assert r.fidelity is not None and 0.0 <= r.fidelity <= 1.0 and r.parameter_relative_error is not None
    with pytest.raises(InputError, match="usable equations"):
        extract(run, budget=DIGITS_D + 1, api="rounded:2", method="equations", curve_points=1)


def test_auto_learns_from_full_probabilities_that_underflowed_to_zero(tmp_path):
    """A digits logreg trained at --lr 1000 answers probabilities that underflow to 0 in float64 (logit gaps above
    ~745): 65 queries give 21 usable equations for 585 unknowns. Auto refused (`dpaudit report --extraction-budget
    1000` stopped: 642 equations, too few for one class), the failure the rounded-answer fallback removed; it now learns
    from the same answers. An explicit --method equations still refuses. Planted: the fallback for rounded answers
    only -> fails."""
    run = _load(_train(tmp_path / "confident", "digits", "logreg", epochs=10, lr=1000.0, seed=0))
    r = extract(run, budget=DIGITS_D + 1, api="probs", curve_points=1, surrogate="logreg").result
    assert (r.method, r.queries, r.params["adaptive"]) == ("learning", DIGITS_D + 1, False)
    assert "equations unsolvable" in r.params["fallback"] and "equations for 585 unknowns" in r.params["fallback"]
    with pytest.raises(InputError, match="usable equations"):
        extract(run, budget=DIGITS_D + 1, api="probs", method="equations", curve_points=1)


@pytest.mark.parametrize(
    ("api", "planted", "refusal"),
    [
        ("probs", None, "planted"),  # every probability above 0: no underflow to blame
        ("logits", 0.0, "planted"),  # a logit of 0 is no underflowed probability
        ("probs", np.nan, "finite"),  # a NaN beside a 0: a broken answer, nothing to learn from
        ("probs", 0.0, None),  # two 0s (no 1): 583 usable equations for 585 unknowns, learnt from
    ],
)
def test_auto_refuses_equations_that_fail_for_another_reason(digits_logreg, monkeypatch, api, planted, refusal):
    # The fallbacks' limits: auto learns only where a probability rounded or underflowed to 0 (answers otherwise
    # finite) left too few equations; any other failure of the equations is the attack's refusal. Planted: the
    # fallback without the api's kind, the finiteness or the zero test, or testing for a 1 -> fails.
    from attacks import extraction

    real_attack, real_fit = extraction.equation_attack, extraction.EquationSolver.fit

    def answers(*a, **k):
        X, A = real_attack(*a, **k)
        if planted is not None:
            A = A.copy()
            A[0, 0], A[1, 1] = planted, 0.0
        return X, A

    def fit(self, X, A):
        if planted is None or api == "logits":
            raise InputError("planted: unsolvable")
        return real_fit(self, X, A)

    monkeypatch.setattr(extraction, "equation_attack", answers)
    monkeypatch.setattr(extraction.EquationSolver, "fit", fit)
    if refusal is None:
        r = extract(_load(digits_logreg), budget=DIGITS_D + 1, api=api, curve_points=1, surrogate="logreg").result
        assert r.method == "learning" and "583 usable equations for 585 unknowns" in r.params["fallback"]
        return
    with pytest.raises(InputError, match=refusal):
        extract(_load(digits_logreg), budget=DIGITS_D + 1, api=api, curve_points=1, surrogate="logreg")


# --------------------------------------------------------------------------- learning-based extraction


def test_more_queries_give_higher_fidelity(digits_mlp):
    """More queries from the default (synthetic) pool give higher fidelity on the test split, the
    distribution the synthetic pool imitates: 0.83 -> 0.96 at seed 0 (0.90 -> 0.97 at seed 1), while
    the paired standard error of a difference of agreements on 359 test records is at most
    sqrt(1/359) / 2 ~= 0.026, so a margin of 0.05 is about two standard errors below the gap.

    Agreement on uniform inputs in the feature box (``fidelity_uniform``) measures how the surrogate
    extrapolates away from the queries' distribution and is not monotone in the budget for the
    synthetic pool (seed 0: 0.61, 0.26, 0.58 at 100, 500, 2000 queries); it is asserted below only
    where queries and evaluation share the uniform distribution."""
    run = _load(digits_mlp)
    small = extract(run, budget=100, api="probs", method="learning", curve_points=1).result
    again = extract(run, budget=100, api="probs", method="learning", curve_points=1).result
    large = extract(run, budget=2000, api="probs", method="learning", curve_points=1).result
    assert small.to_dict() == again.to_dict()  # fixed seeds: reproducible
    assert large.fidelity > small.fidelity + 0.05
    assert large.parameter_relative_error is None  # an MLP has no comparable parameters
    assert small.queries == 100 and large.queries == 2000


def test_uniform_queries_raise_uniform_fidelity(digits_mlp):
    """Queried and evaluated on the same uniform distribution, more queries fit that distribution
    better: 0.77 -> 0.94 (seed 0) and 0.77 -> 0.92 (seed 1) from 100 to 2000 queries; the agreement
    is measured on 10,000 uniform inputs (standard error <= 0.005), so a margin of 0.05 is ten
    standard errors below the gap."""
    run = _load(digits_mlp)
    small = extract(run, budget=100, api="probs", method="learning", pool="uniform", curve_points=1).result
    large = extract(run, budget=2000, api="probs", method="learning", pool="uniform", curve_points=1).result
    assert large.fidelity_uniform > small.fidelity_uniform + 0.05


def test_label_only_extraction_works(digits_mlp):
    r = extract(_load(digits_mlp), budget=1000, api="labels", method="learning", curve_points=1).result
    assert r.fidelity > 0.8  # chance agreement is ~0.1
    assert r.queries == 1000


def test_adaptive_spends_the_exact_budget_in_rounds(digits_mlp):
    run = _load(digits_mlp)
    knowledge = AttackerKnowledge.from_records(run.dataset().X[run.splits.aux])
    api = PredictionAPI.from_run(run, "probs", budget=203)
    rounds = []
    spec = surrogate_spec("logreg", input_shape=(1, 8, 8), n_classes=10)
    _, X, A = learning_attack(api, knowledge, spec, budget=203, pool="aux", adaptive=True,
                              on_round=lambda s, n: rounds.append(n))  # fmt: skip
    assert rounds == [51, 102, 153, 203]  # 203 = 51 + 51 + 51 + 50
    assert api.queries_used == len(X) == len(A) == 203
    assert len(np.unique(X.reshape(203, -1), axis=0)) == 203  # each aux record queried at most once


@pytest.mark.slow
def test_adaptive_extraction_reports_one_curve_point_per_round(digits_mlp):
    r = extract(
        _load(digits_mlp), budget=400, api="labels", method="learning", surrogate="logreg", adaptive=True
    ).result
    assert r.queries == 400 and [p["queries"] for p in r.curve] == [100, 200, 300, 400]
    assert r.curve[-1]["fidelity"] == r.fidelity
    assert r.parameter_relative_error is None  # the target is not linear


def test_learning_refuses_impossible_budgets(digits_mlp):
    run = _load(digits_mlp)
    with pytest.raises(InputError, match="minimum of learning-based extraction: 10 queries"):
        extract(run, budget=9, method="learning")
    with pytest.raises(InputError, match="aux pool holds 449 records, fewer than budget 1000"):
        extract(run, budget=1000, method="learning", pool="aux")


def test_pools_stay_in_the_box_and_are_seeded():
    X0 = np.random.default_rng(0).uniform(0, 1, size=(40, 3)).astype(np.float32)
    X0[:, 2] = 0.25  # a feature constant in aux
    knowledge = AttackerKnowledge.from_records(X0)
    for kind in ("uniform", "synthetic"):
        a = QueryPool(kind, knowledge, rng=np.random.default_rng(5), dtype=np.float32).draw(500)
        b = QueryPool(kind, knowledge, rng=np.random.default_rng(5), dtype=np.float32).draw(500)
        np.testing.assert_array_equal(a, b)
        wide = knowledge.box.widened()
        assert np.all(a >= wide.lower.astype(np.float32)) and np.all(a <= wide.upper.astype(np.float32))
    syn = QueryPool("synthetic", knowledge, rng=np.random.default_rng(5), dtype=np.float32).draw(500)
    assert syn[:, 2].std() > 0.01  # constant in aux, yet varied (identifiable weight)
    box = FeatureBox.of(X0)
    assert box.widened().upper[2] == pytest.approx(1.25)


def test_aux_draws_come_in_random_order_so_curve_prefixes_are_samples():
    """The curve refits on the first n queries; aux records in index order follow the user's file (here
    sorted by label, as many CSVs are), so a draw sorted by index made the first quarter one label."""
    labels = np.repeat(np.arange(4), 25).astype(np.float32)  # record i has feature = its label
    knowledge = AttackerKnowledge.from_records(labels[:, None])
    X = QueryPool("aux", knowledge, rng=np.random.default_rng(0), dtype=np.float32).draw(100)
    assert sorted(X[:, 0].tolist()) == labels.tolist()  # each record once
    assert len(np.unique(X[:25, 0])) == 4  # the first quarter holds every label (P(not) < 4 * 0.75^25 ≈ 3e-3)


# --------------------------------------------------------------------------- results and saving


def test_result_json_and_saved_surrogate_can_be_attacked(digits_logreg, tmp_path):
    from attacks.mia import run_mia

    run = _load(digits_logreg)
    ex = extract(run, budget=DIGITS_D + 1)
    d = json.loads(json.dumps(ex.result.to_dict()))
    for key in ("parameter_relative_error", "fidelity", "fidelity_uniform", "surrogate_accuracy", "queries"):
        assert key in d
    assert d["attack"] == "extraction-equations" and d["params"]["api"] == "probs"
    out = save_surrogate(tmp_path / "surrogate", run, ex)
    with pytest.raises(InputError, match="already exists"):
        save_surrogate(tmp_path / "surrogate", run, ex)
    sur = _load(out)
    assert sur.meta["training"]["algo"] == "extracted"
    assert sur.meta["training"]["extraction"]["queries"] == DIGITS_D + 1
    assert sur.meta["privacy"] is None
    np.testing.assert_array_equal(sur.splits.members, run.splits.members)
    X = run.dataset().X[run.splits.test]
    np.testing.assert_array_equal(sur.logits(X).argmax(1), run.logits(X).argmax(1))
    (mia,) = run_mia(sur, ["loss"], n_bootstrap=0)  # the stolen model can be attacked in turn
    assert 0.0 <= mia.to_dict()["auc"] <= 1.0


# --------------------------------------------------------------------------- CLI


def _cli(*args):
    from dpaudit.cli.main import app

    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--budget", "10", "--method", "equations"), "minimum of equation solving: 65 queries (d+1 per system"),
        (("--budget", "100", "--api", "soft"), "unknown api mode 'soft'"),
        (("--budget", "100", "--api", "rounded:x"), "rounded needs a number of decimals"),
        (("--budget", "0"), "expected --budget >= 1"),
        (("--budget", "100", "--pool", "web"), "unknown --pool 'web'"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(digits_logreg, args, message):
    r = _cli("attack", "extract", digits_logreg, *args)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output


def test_cli_refuses_equations_on_an_mlp(digits_mlp):
    r = _cli("attack", "extract", digits_mlp, "--budget", "500", "--method", "equations")
    assert r.exit_code == 2
    assert "use --method learning" in r.output and "Traceback" not in r.output


def test_cli_json_and_out(digits_logreg, tmp_path):
    out = tmp_path / "stolen"
    r = _cli("--json", "attack", "extract", digits_logreg, "--budget", "65", "--out", out)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["queries"] == 65 and data["fidelity"] == 1.0 and data["parameter_relative_error"] < 1e-6
    assert data["out"] == str(out)
    r = _cli("attack", "extract", digits_logreg, "--budget", "65", "--out", out)
    assert r.exit_code == 2 and "already exists" in r.output
    r = _cli("--json", "attack", "mia", out, "--attacks", "loss", "--bootstrap", "0")
    assert r.exit_code == 0, r.output


def test_a_huge_curve_points_is_the_whole_halving_curve_at_once():
    # Found by benchmarks/cli_fuzz.py: `attack extract --curve-points 9223372036854775808` looped over 2^63 halvings
    # of the budget (every one past its bit length is 0 queries) and never answered.
    from attacks.extraction import _prefixes

    assert _prefixes(1000, 10, 2**63) == _prefixes(1000, 10, 64) == [15, 31, 62, 125, 250, 500, 1000]
    assert _prefixes(1000, 10, 3) == [250, 500, 1000] and _prefixes(1, 1, 2**63) == [1]


def test_an_explicit_equations_method_refuses_rounded_answers_that_leave_too_few_equations(digits_logreg):
    """The fallback to learning is auto's (`chose`): `--method equations` asked for the equations, so their
    refusal is the user's to see, as auto learns from the same rounded answers. Planted: the fallback without
    `chose` (explicit equations silently learned)."""
    with pytest.raises(InputError, match="usable equations for 585 unknowns"):
        extract(_load(digits_logreg), budget=DIGITS_D + 1, api="rounded:2", method="equations", curve_points=1)
    r = extract(_load(digits_logreg), budget=DIGITS_D + 1, api="rounded:2", curve_points=1, surrogate="logreg")
    assert r.result.method == "learning" and "usable equations for 585 unknowns" in r.result.params["fallback"]
