"""MI-FACE (Fredrikson et al. 2015, Algorithm 1): stopping rule, argmin, query counting, digits quality."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attacks.inversion import MIFace, QueryCounter, as_black_box, mi_face, parse_classes, run_inversion, ssim
from dpaudit.errors import InputError

# --------------------------------------------------------------------------- the stopping rule on known trajectories


def scripted(costs: list[float], **kw):
    """x_i = i exactly (gradient -1, step 1, PROCESS the identity), so c(x_i) = costs[i] is scripted."""
    table = np.asarray(costs, dtype=np.float64)
    return mi_face(
        lambda x: float(table[round(float(x[0]))]),
        lambda x: -np.ones(1),
        np.zeros(1),
        step=1.0,
        **{"iterations": len(costs) - 1, **kw},
    )


def test_stops_when_no_improvement_over_the_window():
    # i=3: 0.8 < max(1, .9, .8)?  no: 0.8 < 1.0 -> go on; i=4: 0.8 < max(.9, .8, .8) -> go on;
    # i=5: 0.8 >= max(.8, .8, .8) -> stop (Algorithm 1, line 6).
    t = scripted([1.0, 0.9, 0.8, 0.8, 0.8, 0.8, 0.1, 0.1], window=3, threshold=0.0)
    assert t.stop_reason == "no-improvement"
    assert t.n_iterations == 5
    assert t.best_iteration == 2 and t.cost == pytest.approx(0.8)


def test_stops_at_threshold_and_keeps_stepping_while_improving():
    t = scripted([1.0, 0.5, 0.2, 0.05, 0.01, 0.0], window=2, threshold=0.1)
    assert (t.stop_reason, t.n_iterations, t.best_iteration) == ("threshold", 3, 3)
    # an inverted rule (break when the cost improves) would stop at i = 1 here
    t = scripted([1.0, 0.9, 0.8, 0.7, 0.6], window=1, threshold=0.0)
    assert (t.stop_reason, t.n_iterations) == ("max-iterations", 4)


def test_flat_start_of_a_low_confidence_class_does_not_stop_at_the_first_step():
    # c(x_1) = c(x_0): "c has not improved over the last beta steps" needs beta earlier costs.
    t = scripted([1.0, 1.0, 1.0, 1.0, 0.5, 0.05, 0.0], window=5, threshold=0.1)
    assert (t.stop_reason, t.n_iterations, t.best_iteration) == ("threshold", 5, 5)
    t = scripted([1.0] * 12, window=5, threshold=0.1)
    assert (t.stop_reason, t.n_iterations, t.best_iteration) == ("no-improvement", 5, 0)


def test_returns_the_argmin_not_the_last_iterate():
    t = scripted([1.0, 0.3, 0.5, 0.6, 0.7, 0.8], window=3, threshold=0.0)
    assert t.stop_reason == "no-improvement" and t.n_iterations == 4  # 0.7 >= max(.3, .5, .6)
    assert t.best_iteration == 1 and t.cost == pytest.approx(0.3)
    np.testing.assert_allclose(t.x, [1.0])
    np.testing.assert_allclose(t.costs, [1.0, 0.3, 0.5, 0.6, 0.7])


def two_class_model(bias: float):
    """logits (0, x_0 + x_1 - bias): class 1 has probability sigmoid(sum(x) - bias)."""

    def probs(x: torch.Tensor) -> torch.Tensor:
        z = x.reshape(len(x), -1).sum(dim=1) - bias
        return torch.softmax(torch.stack([torch.zeros_like(z), z], dim=1), dim=1)

    return probs


BOX = np.array([[0.0, 0.0], [5.0, 5.0]])


def test_white_box_on_a_toy_model_with_a_known_trajectory():
    # Class 1 with bias 40: p = sigmoid(-40) ~ 4e-18, so 1 - p == 1.0 in float64: the cost is flat.
    # The rule must wait for the full window (not stop at i = 1) and return x_0.
    seed_alg = dict(variant="mi-face", restarts=1)  # the published Algorithm 1 from x_0 = PROCESS(0)
    t = MIFace(iterations=100, window=7, threshold=0.01, step=0.5, **seed_alg).fit(BOX).invert(two_class_model(40.0), 1)
    assert (t.stop_reason, t.n_iterations, t.best_iteration) == ("no-improvement", 7, 0)
    # Bias 3: gradient ascent on p reaches p >= 0.99 (x_0 + x_1 >= 3 + log 99 ~ 7.6) inside the box.
    t = (
        MIFace(iterations=2000, window=50, threshold=0.01, step=5.0, **seed_alg)
        .fit(BOX)
        .invert(two_class_model(3.0), 1)
    )
    assert t.stop_reason == "threshold" and t.cost <= 0.01
    assert float(t.x.sum()) >= 3 + np.log(99) - 1e-9
    assert np.all(np.diff(t.costs) <= 0)  # ascending a sigmoid of a linear function: monotone


BIG_BOX = np.array([[0.0, 0.0], [30.0, 30.0]])


@pytest.mark.parametrize("black_box", [False, True])
def test_default_variant_inverts_a_confident_model_where_the_seed_algorithm_stalls(black_box):
    # Bias 40: f_1(x_0) = sigmoid(-40) ~ 4e-18, so 1 - f_1 is flat in float64 and its gradient ~0: the published
    # cost never moves. -log f_1 has gradient ~ -1 per coordinate whatever f_1 is, and reaches f_1 >= 0.99
    # (x_0 + x_1 >= 40 + log 99 ~ 44.6) inside the box; the stopping rule and the reported cost are MI-FACE's.
    kw = dict(
        iterations=400, window=20, threshold=0.01, step=1.0, restarts=1, black_box=black_box, directions=8, seed=0
    )
    model = two_class_model(40.0)
    target = QueryCounter(as_black_box(model)) if black_box else model
    stalled = MIFace(variant="mi-face", **kw).fit(BIG_BOX).invert(target, 1)
    assert stalled.stop_reason == "no-improvement" and stalled.cost == 1.0 and stalled.best_iteration == 0
    for variant in ("log-softmax", "margin"):
        t = MIFace(variant=variant, **kw).fit(BIG_BOX).invert(target, 1)
        assert t.stop_reason == "threshold" and t.cost <= 0.01
        p1 = float(model(torch.as_tensor(t.x)[None])[0, 1])
        assert t.cost == pytest.approx(1.0 - p1, abs=1e-12)  # reported in MI-FACE's terms, not -log f_1
        assert float(t.x.sum()) >= 40 + np.log(99) - 1e-6
        if variant == "log-softmax":
            assert t.objective == pytest.approx(-np.log(p1), rel=1e-9)


def test_restarts_start_at_process_zero_then_in_the_box_and_return_the_best():
    attack = MIFace(restarts=5, seed=3).fit(BIG_BOX)
    starts = attack.starts()
    assert len(starts) == 5 and np.array_equal(starts[0], np.zeros(2))
    assert all(np.all((s >= 0) & (s <= 30)) for s in starts)
    assert all(
        np.array_equal(a, b) for a, b in zip(starts, MIFace(restarts=5, seed=3).fit(BIG_BOX).starts(), strict=True)
    )
    # Bias 55 and few steps: no start reaches the threshold, so the best is the one that started highest.
    t = MIFace(iterations=3, window=50, step=0.5, restarts=5, seed=3).fit(BIG_BOX).invert(two_class_model(55.0), 1)
    singles = [MIFace(iterations=3, window=50, step=0.5).fit(BIG_BOX) for _ in starts]
    costs = [mi_face_from(a, s) for a, s in zip(singles, starts, strict=True)]
    assert t.cost == pytest.approx(min(costs), rel=1e-12)


def test_starts_run_together_give_each_start_its_own_run():
    """White-box restarts run as rows of one batch, each stopping by its own rule: every row's trace equals the
    run from that start alone (a row's gradient must stay its own after other rows stop)."""
    centre = torch.tensor([20.0, 5.0], dtype=torch.float64)

    def bowl(x: torch.Tensor) -> torch.Tensor:  # class 1's logit 8 - |x - centre|^2: the gradient depends on x
        z = 8.0 - ((x.reshape(len(x), -1) - centre) ** 2).sum(dim=1)
        return torch.softmax(torch.stack([torch.zeros_like(z), z], dim=1), dim=1)

    attack = MIFace(iterations=60, window=5, threshold=0.01, step=0.2, restarts=6, seed=1).fit(BIG_BOX)
    attack.invert(bowl, 1)
    assert len({t.n_iterations for t in attack.traces_}) >= 3  # the rows stop at different iterations
    for x0, together in zip(attack.starts(), attack.traces_, strict=True):
        alone = MIFace(iterations=60, window=5, threshold=0.01, step=0.2).fit(BIG_BOX)
        alone.starts = lambda x0=x0: [x0]
        t = alone.invert(bowl, 1)
        assert (t.stop_reason, t.n_iterations, t.best_iteration) == (
            together.stop_reason, together.n_iterations, together.best_iteration)  # fmt: skip
        np.testing.assert_allclose(together.costs, t.costs, rtol=1e-12)
        np.testing.assert_allclose(together.x, t.x, rtol=1e-12)


def mi_face_from(attack, x0):
    """The cost MIFace reaches from one given start (the oracle for the restart choice)."""
    attack.starts = lambda: [x0]
    return attack.invert(two_class_model(55.0), 1).cost


@pytest.mark.parametrize(("budget", "directions"), [(1, 3), (50, 3), (101, 5), (1000, 2)])
def test_black_box_query_counter_is_exact(budget, directions):
    counter = QueryCounter(as_black_box(two_class_model(40.0)))
    attack = MIFace(iterations=10**6, window=10**6, threshold=-1.0, black_box=True, budget=budget,
                    directions=directions, restarts=1, seed=0)  # fmt: skip
    t = attack.fit(BOX).invert(counter, 1)
    per_step = 2 * directions + 1
    assert t.stop_reason == "budget"
    assert t.n_iterations == (budget - 1) // per_step
    assert counter.queries == attack.queries_ == 1 + t.n_iterations * per_step <= budget


def test_black_box_gradient_estimate_moves_towards_the_class():
    counter = QueryCounter(as_black_box(two_class_model(3.0)))
    attack = MIFace(iterations=500, window=50, step=5.0, black_box=True, budget=5000, directions=8, seed=1)
    t = attack.fit(BOX).invert(counter, 1)
    assert t.cost < 0.05 and counter.queries <= 5000


def test_settings_are_validated_with_names():
    with pytest.raises(InputError, match="budget >= 1"):
        MIFace(black_box=True, budget=0).fit(BOX)
    with pytest.raises(InputError, match="black-box"):
        MIFace(budget=10).fit(BOX)
    with pytest.raises(InputError, match="window >= 1"):
        MIFace(window=0).fit(BOX)
    with pytest.raises(InputError, match="image-shaped"):
        MIFace(prior="tv", prior_weight=1.0).fit(BOX)
    from dpaudit.data import load_dataset

    digits = load_dataset("digits")  # labels 0..9: a label is its index
    with pytest.raises(InputError, match=r"'10' is not a label of digits \(its labels: 0, 1, .*9\)"):
        parse_classes("0,10", digits)
    assert parse_classes(None, digits) == tuple(range(10)) and parse_classes("2, 0", digits) == (2, 0)


def test_the_cost_asked_about_is_restarts_times_iterations_steps():
    # dpaudit.budget's estimate per class: restarts x iterations x STEP_SECONDS (1e-4 s). 30 starts of 1000 steps
    # (3 s) start; 1e5 of them (1e4 s, past the hour) ask for --yes. Planted: a start costing `iterations` seconds
    # (the 30 starts refused) or STEP_SECONDS (the 1e5 starts let through) -> fails.
    from dpaudit.budget import allow_long_work
    from dpaudit.errors import BudgetError

    with allow_long_work(False):
        MIFace(iterations=1000, restarts=30).check()
        with pytest.raises(BudgetError, match=r"^model inversion: 1e\+05 starts would take about 2\.78 hours"):
            MIFace(iterations=1000, restarts=10**5).check()


# --------------------------------------------------------------------------- SSIM


def naive_ssim(a: np.ndarray, b: np.ndarray, k: int, L: float = 1.0) -> float:
    """Wang et al. 2004, eq. 13 per k x k window by explicit loops, averaged (eq. 17)."""
    c1, c2 = (0.01 * L) ** 2, (0.03 * L) ** 2
    vals = []
    for r in range(a.shape[0] - k + 1):
        for c in range(a.shape[1] - k + 1):
            x, y = a[r : r + k, c : c + k].ravel(), b[r : r + k, c : c + k].ravel()
            mx, my = x.mean(), y.mean()
            sxy = np.mean((x - mx) * (y - my))
            vals.append((2 * mx * my + c1) * (2 * sxy + c2) / ((mx**2 + my**2 + c1) * (x.var() + y.var() + c2)))
    return float(np.mean(vals))


def test_ssim_matches_a_loop_oracle_and_its_identities():
    rng = np.random.default_rng(0)
    a, b = rng.random((8, 8)), rng.random((8, 8))
    assert ssim(a, b) == pytest.approx(naive_ssim(a, b, 7), rel=1e-12)
    assert ssim(a[None], b[None], win_size=3) == pytest.approx(naive_ssim(a, b, 3), rel=1e-12)
    assert ssim(a, a) == pytest.approx(1.0)
    assert ssim(a, b) == pytest.approx(ssim(b, a))
    assert ssim(a, b) < 0.5 < ssim(a, a + 0.01 * rng.standard_normal((8, 8)))
    v, w = a.ravel(), b.ravel()  # non-images: one window over everything
    assert ssim(v, w) == pytest.approx(naive_ssim(v.reshape(8, 8), w.reshape(8, 8), 8), rel=1e-12)


# --------------------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def digits_run_dir(tmp_path_factory):
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    out = tmp_path_factory.mktemp("digits") / "run"
    train_run(ds, spec, TrainConfig(epochs=8, batch_size=32, lr=0.1, seed=0), out=out)
    return out


def test_digits_inversions_are_identified_and_near_their_class_mean(digits_run_dir):
    from dpaudit.checkpoint import load_run

    r = run_inversion(load_run(digits_run_dir), attack=MIFace(seed=0))
    d = r.to_dict()
    assert d["eval_classifier_accuracy"] > 0.9
    assert d["identification_accuracy"] >= 0.4  # chance: 0.1
    # Observed 0.7 (seed 0). One class more or less is a step of 0.1, so ">= 0.7" failed on any machine where
    # one inversion lands differently. Against chance (each inversion nearest its own of 10 class means with
    # probability 1/10), P(Bin(10, 0.1) >= 5) = 1.6e-3: 0.5 still rejects inversions without class content.
    assert d["nearest_mean_accuracy"] >= 0.5
    own = np.array([c["mse"] for c in d["per_class"]])
    other = np.array([c["mse_other"] for c in d["per_class"]])
    assert np.mean(own < other) >= 0.8 and own.mean() < other.mean() - 0.01
    assert all(c["confidence"] >= 0.99 - 1e-9 for c in d["per_class"])  # threshold gamma = 0.01 reached
    assert r.inversions.shape == (10, 1, 8, 8) and np.all((r.inversions >= 0) & (r.inversions <= 1))
    json.dumps(d)


def test_a_model_that_learned_nothing_gives_unidentifiable_inversions(digits_run_dir, tmp_path):
    """The wrong thing fails: shuffled labels -> inversions no longer land on their own class mean."""
    from dpaudit.checkpoint import load_run

    run = load_run(digits_run_dir)
    with torch.no_grad():
        for p in run.model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.01)
    d = run_inversion(run, attack=MIFace(seed=0)).to_dict()
    assert d["nearest_mean_accuracy"] <= 0.5


# --------------------------------------------------------------------------- CLI


def cli(*args):
    from dpaudit.cli.main import app

    return CliRunner().invoke(app, list(args))


def test_cli_inversion_json_and_png(digits_run_dir, tmp_path):
    res = cli("attack", "inversion", str(digits_run_dir), "--classes", "0,1,2", "--iterations", "50",
              "--out", str(tmp_path / "png"), "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["classes"] == [0, 1, 2] and 0 <= d["identification_accuracy"] <= 1
    assert {"mse", "ssim", "mse_nonmembers", "ssim_nonmembers"} <= set(d["per_class"][0])
    assert (tmp_path / "png" / "inversions.png").stat().st_size > 0


def test_cli_inversion_with_a_grid_loads_the_data_once(digits_run_dir, tmp_path, monkeypatch):
    """`attack inversion --out` loaded and sha256-hashed the run's data twice: for the attack, then for the grid's
    members' class means (7-15 s a load at 50,000 CIFAR-sized images); now one load serves both
    (:meth:`dpaudit.checkpoint.Run.dataset_held`)."""
    from dpaudit import checkpoint

    loads = []
    original = checkpoint.load_dataset
    monkeypatch.setattr(checkpoint, "load_dataset", lambda *a, **k: loads.append(1) or original(*a, **k))
    res = cli("attack", "inversion", str(digits_run_dir), "--classes", "0", "--iterations", "2", "--restarts", "1",
              "--out", str(tmp_path / "grid"))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (tmp_path / "grid" / "inversions.png").stat().st_size > 0 and len(loads) == 1


def test_cli_inversion_out_dir_is_a_deprecated_spelling_of_out(digits_run_dir, tmp_path):
    """Every other command writes to --out/-o; inversion alone took --out-dir. --out-dir still works, with a
    notice; both at once is one line, exit 2, before any work."""
    res = cli("attack", "inversion", str(digits_run_dir), "--classes", "0", "--iterations", "2", "--restarts", "1",
              "--out-dir", str(tmp_path / "old"))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "--out-dir is deprecated; use --out" in res.stderr
    assert (tmp_path / "old" / "inversions.png").stat().st_size > 0
    res = cli("attack", "inversion", str(digits_run_dir), "-o", str(tmp_path / "a"), "--out-dir", str(tmp_path / "b"))
    assert res.exit_code == 2 and res.stderr.strip().splitlines() == [
        "error: give the folder once, as --out (--out-dir is its deprecated spelling)"
    ]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_cli_black_box_counts_queries(digits_run_dir):
    res = cli("attack", "inversion", str(digits_run_dir), "--classes", "3", "--black-box", "--budget", "205",
              "--directions", "10", "--restarts", "1", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    c = json.loads(res.stdout)["per_class"][0]
    assert c["queries"] == 1 + 21 * c["iterations"] <= 205


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--classes", "0,10"), "'10' is not a label of digits"),
        (("--classes", "-1"), "'-1' is not a label of digits"),
        (("--classes", "3,3"), "labels repeat"),
        (("--black-box", "--budget", "0"), "--budget >= 1"),
        (("--budget", "10"), "black-box"),
        (("--window", "0"), "--window >= 1"),
        (("--threshold", "1"), "expected --threshold < 1, got 1: the cost 1 - f_y is at most 1"),
    ],
)
def test_cli_bad_input_exits_2(digits_run_dir, args, message):
    res = cli("attack", "inversion", str(digits_run_dir), *args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output


@pytest.mark.slow  # trains two digits models for 30 epochs
@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_defaults_identify_classes_of_confidently_trained_models(tmp_path, kind):
    """Issue 28's acceptance: `--algo adam --epochs 30` (confident) models, attack defaults: identification
    >= 0.5 (chance 0.1); the published variant stays well below that on the same models."""
    from dpaudit.checkpoint import load_run
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import NONPRIVATE_RECIPE, TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset("digits")
    spec = default_spec(kind, input_shape=ds.feature_shape, n_classes=ds.n_classes)
    r = NONPRIVATE_RECIPE
    config = TrainConfig(algo="adam", epochs=30, batch_size=r.batch_size, lr=r.lr, seed=0)
    train_run(ds, spec, config, out=tmp_path / "run")
    run = load_run(tmp_path / "run")
    d = run_inversion(run, seed=0).to_dict()
    assert d["params"]["variant"] == "log-softmax" and d["identification_accuracy"] >= 0.5
    seed_alg = run_inversion(run, attack=MIFace(variant="mi-face", restarts=1, seed=0), seed=0).to_dict()
    assert seed_alg["identification_accuracy"] <= 0.3


@pytest.mark.parametrize("prior", ["mean", "tv"])
def test_aux_terms_are_per_start(prior):
    """AUXTERM of a stack of starts is each start's own (a mean over the whole stack would couple the rows
    that run together), against numpy formulas in box units."""
    rng = np.random.default_rng(0)
    aux = rng.uniform(0.0, 4.0, size=(30, 1, 5, 6))
    attack = MIFace(prior=prior, prior_weight=0.7).fit(aux)
    X = rng.uniform(0.0, 4.0, size=(3, 1, 5, 6))
    z = (X - attack.lower_) / attack.width_
    if prior == "mean":
        m = (attack.mean_ - attack.lower_) / attack.width_
        expected = 0.7 * ((z - m) ** 2).reshape(3, -1).mean(axis=1)
    else:
        dh, dw = np.diff(z, axis=-2), np.diff(z, axis=-1)
        expected = 0.7 * (np.sqrt(dh**2 + 1e-8).reshape(3, -1).mean(1) + np.sqrt(dw**2 + 1e-8).reshape(3, -1).mean(1))
    np.testing.assert_allclose(attack._aux_terms(torch.as_tensor(X)).numpy(), expected, rtol=1e-12)
    assert attack.aux_term(X[1]) == pytest.approx(expected[1], rel=1e-12)


def test_tv_prior_refuses_channels_last_images():
    """The TV prior differences a record's last two axes as (height, width): on CIFAR stored channels-last
    (N x 32 x 32 x 3) it smoothed along width and colour instead, silently. Refused with the cnn's message;
    channels-first, greyscale (N x H x W) and the mean prior still fit."""
    with pytest.raises(InputError, match=r"prior 'tv' reads a record as .* looks channels-last .* N x 3 x 32 x 32"):
        MIFace(prior="tv").fit(np.zeros((4, 32, 32, 3)))
    MIFace(prior="tv").fit(np.zeros((4, 3, 32, 32)))
    MIFace(prior="tv").fit(np.zeros((4, 28, 28)))
    MIFace(prior="mean").fit(np.zeros((4, 32, 32, 3)))


def test_threshold_is_inclusive_and_no_prior_adds_nothing():
    # Algorithm 1, line 8: stop when c(x_i) <= gamma, equality included (0.5 is exact in float64).
    t = scripted([1.0, 0.5, 0.25], window=5, threshold=0.5)
    assert (t.stop_reason, t.n_iterations) == ("threshold", 1)
    # prior="none" is no AUXTERM whatever prior_weight says (it must not fall through to total variation).
    attack = MIFace(prior="none", prior_weight=0.7).fit(np.zeros((3, 1, 4, 4)) + np.arange(3)[:, None, None, None])
    X = torch.as_tensor(np.random.default_rng(0).uniform(0.0, 2.0, size=(2, 1, 4, 4)))
    assert torch.equal(attack._aux_terms(X), torch.zeros(2, dtype=torch.float64))
    for bad in ({"iterations": 0}, {"window": 0}, {"step": math.inf}):  # a direct caller's settings are checked too
        kw = {"iterations": 1, "window": 1, "threshold": 0.0, "step": 1.0, **bad}
        with pytest.raises(InputError, match=next(iter(bad))):
            mi_face(lambda x: 0.0, lambda x: np.zeros(1), np.zeros(1), **kw)


@pytest.mark.parametrize("label", [0, 2, 3])
def test_objectives_per_row_against_numpy_with_four_classes(label):
    # d of each variant, row by row: 1 - p_l (MI-FACE's cost), -log p_l, and the margin max_{j != l} log p_j -
    # log p_l over every other class (two-class models, as elsewhere here, have one other class, so max = min).
    # Planted: max over the others as min, over the rows, a class skipped or the label kept; 1 - p_l shifted -> fails.
    P = np.random.default_rng(label).dirichlet(np.ones(4), size=5)
    logp = np.log(P)
    others = np.delete(logp, label, axis=1)
    expected = {"mi-face": 1.0 - P[:, label], "log-softmax": -logp[:, label], "margin": others.max(1) - logp[:, label]}
    for variant, want in expected.items():
        got = MIFace(variant=variant)._objectives(torch.as_tensor(P), label).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-12)


# --------------------------------------------------------------------------- classes named by the data's labels


@pytest.fixture(scope="module")
def threes_and_eights_run(tmp_path_factory):
    """digits:3,8: the labels are 3 and 8 (class indices 0 and 1); a logistic regression, 4 epochs (~0.3 s)."""
    from dpaudit.checkpoint import load_run
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset("digits:3,8")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    out = tmp_path_factory.mktemp("digits38") / "run"
    train_run(ds, spec, TrainConfig(epochs=4, batch_size=32, lr=0.1, seed=0), out=out)
    return load_run(out)


def test_the_default_attack_and_the_callers_progress_one_step_per_class(threes_and_eights_run):
    # A run given by its path is loaded; without `attack` the default MIFace(seed=seed) inverts (its settings
    # recorded); the caller's progress reporter gets one task of len(classes) steps, advanced once per class. Planted:
    # the path not loaded, the default replaced by None or the caller's attack test negated, directions recorded for a
    # white-box run, the caller's progress ignored, advance(0) or (2) or none -> fails.
    import contextlib

    from attacks.inversion import MIFace

    calls = []

    class Recording:
        @contextlib.contextmanager
        def task(self, description, total, **k):
            calls.append((description, total))
            yield lambda n=1: calls.append(n)

    r = run_inversion(str(threes_and_eights_run.path), "3,8", seed=0, progress=Recording())  # a path, as a notebook's
    assert r.params["directions"] is None  # white-box: no black-box directions recorded
    default = MIFace(seed=0)
    assert (r.params["iterations"], r.params["restarts"], r.params["variant"]) == (
        default.iterations, default.restarts, default.variant,
    )  # fmt: skip
    assert calls == [("MI-FACE inversion", 2), 1, 1]


def test_classes_are_the_datas_labels_not_indices(threes_and_eights_run):
    """`--classes 8` inverts the eights (index 1), and says so by label; index 1 (a label of no record) is refused
    instead of silently inverting the eights, and index 0 instead of the threes."""
    run = threes_and_eights_run
    r = run_inversion(run, "8", attack=MIFace(iterations=100, restarts=1, seed=0))
    d = r.to_dict(include_inversions=False)
    assert d["classes"] == [1] and d["labels"] == [3, 8]
    c = d["per_class"][0]
    assert c["class"] == 1 and c["label"] == 8
    assert c["nearest_class"] == 1 and c["mse"] < c["mse_other"]  # the inversion looks like the eights
    assert run_inversion(run, [3], attack=MIFace(iterations=1, restarts=1, seed=0)).classes == (0,)
    for index in ("1", "0"):
        with pytest.raises(InputError, match=rf"'{index}' is not a label of digits:3,8 \(its labels: 3, 8\)"):
            run_inversion(run, index)


def test_cli_table_names_classes_by_label(threes_and_eights_run):
    res = cli("attack", "inversion", str(threes_and_eights_run.path), "--classes", "8,3", "--iterations", "20",
              "--restarts", "1")  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = [line.split() for line in res.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["8", "3"]


def test_a_class_missing_from_a_split_gives_no_comparison_not_a_crash(tmp_path):
    """Imbalanced data: label 3 has members but no holdout record, label 4 holdout records but no member. The
    table and JSON crashed (None + float in the mean over classes); the comparisons that have no records are
    None, the means are over the classes that have them, and the JSON holds no NaN or inf."""
    from dpaudit.checkpoint import load_run
    from dpaudit.data import Splits, load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    rng = np.random.default_rng(0)
    y = np.r_[np.full(40, 1), np.full(40, 2), np.full(4, 3), np.full(4, 4)]
    X = (rng.standard_normal((len(y), 3)) + y[:, None]).astype(np.float32)
    np.savez(tmp_path / "imb.npz", X=X, y=y)
    ds = load_dataset(str(tmp_path / "imb.npz"))
    idx = {k: np.flatnonzero(y == k) for k in (1, 2, 3, 4)}
    splits = Splits(
        members=np.r_[idx[1][:15], idx[2][:15], idx[3]], holdout=np.r_[idx[1][15:25], idx[2][15:25], idx[4]],
        aux=np.r_[idx[1][25:35], idx[2][25:35]], test=np.r_[idx[1][35:], idx[2][35:]], seed=0, fractions=(),
    )  # fmt: skip
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=4)
    train_run(ds, spec, TrainConfig(epochs=2, batch_size=16, lr=0.1, seed=0), out=tmp_path / "run", splits=splits)
    r = run_inversion(load_run(tmp_path / "run"), "1,3,4", attack=MIFace(iterations=5, restarts=1, seed=0))
    d = r.to_dict(include_inversions=False)
    by = {c["label"]: c for c in d["per_class"]}
    assert by[3]["mse_nonmembers"] is None and by[3]["mse"] is not None
    assert by[4]["mse"] is None and by[4]["ssim"] is None and by[4]["mse_nonmembers"] is not None
    assert d["mean_mse_nonmembers"] == pytest.approx(np.mean([by[1]["mse_nonmembers"], by[4]["mse_nonmembers"]]))
    # MSE and SSIM in box units: each feature minus its aux minimum (here below 0), over its aux range. Planted: the
    # range multiplied or not divided, the minimum added or not subtracted (SSIM moves) -> fails.
    aux = X[splits.aux].astype(np.float64)
    lo, width = aux.min(0), aux.max(0) - aux.min(0)
    x, m = (r.inversions[0] - lo) / width, (X[idx[1][:15]].astype(np.float64).mean(0) - lo) / width
    assert lo.min() < 0 and by[1]["mse"] == pytest.approx(np.mean((x - m) ** 2), rel=1e-9)
    assert by[1]["ssim"] == pytest.approx(ssim(x, m), rel=1e-9)
    json.dumps(d, allow_nan=False)
    from dpaudit.cli.inversion import inversion_table

    assert "—" in inversion_table(r)


def test_an_aux_split_of_a_single_class_is_refused_with_a_named_error(tmp_path):
    """A label so rare that the aux split holds none of it: the identification classifier (trained on aux) raised
    scikit-learn's ValueError "needs samples of at least 2 classes", an internal error; now a one-line InputError."""
    from dpaudit.checkpoint import load_run
    from dpaudit.data import Splits, load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    rng = np.random.default_rng(0)
    y = np.r_[np.full(40, 5), np.full(2, 7)]
    X = (rng.standard_normal((len(y), 3)) + y[:, None]).astype(np.float32)
    np.savez(tmp_path / "rare.npz", X=X, y=y)
    ds = load_dataset(str(tmp_path / "rare.npz"))
    splits = Splits(members=np.r_[0:15, 40], holdout=np.r_[15:25, 41], aux=np.r_[25:35], test=np.r_[35:40], seed=0,
                    fractions=())  # fmt: skip
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=2)
    train_run(ds, spec, TrainConfig(epochs=1, batch_size=16, lr=0.1, seed=0), out=tmp_path / "run", splits=splits)
    with pytest.raises(InputError, match=r"aux split holds a single class \(5\).*at least 2 classes"):
        run_inversion(load_run(tmp_path / "run"), attack=MIFace(iterations=2, restarts=1, seed=0))


def test_inversion_reads_a_memory_mapped_x_a_split_at_a_time(tmp_path, monkeypatch):
    """`attack inversion` on a memory-mapped CIFAR-shaped X.npy (600 MB) made the whole X float64 (1.2 GB; a
    2.9 GB peak RSS) and copied the members' and holdout's rows again for their class means. Now only the aux
    split is made float64 (the attacker's data) and the rest is read a block of rows at a time; the answer is
    bit for bit the one from the whole float64 array. numpy reports its buffers to tracemalloc."""
    import tracemalloc

    from sklearn import linear_model, pipeline, preprocessing  # noqa: F401  (imported before the tracing)

    from attacks.inversion import member_class_means
    from dpaudit import data
    from dpaudit.checkpoint import as_run
    from dpaudit.data import load_dataset, make_splits
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    rng = np.random.default_rng(0)
    y = np.arange(4000) % 2
    X = (rng.normal(size=(4000, 1, 8, 8)) + y[:, None, None, None]).astype(np.float32)  # X as float64: 2 MB
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "X.npy", X)
    np.save(tmp_path / "d" / "y.npy", y)
    ds = load_dataset(str(tmp_path / "d"))
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=2)
    split = (0.45, 0.45, 0.05, 0.05)  # a small aux (the float64 copy kept) beside large members and holdout
    train_run(ds, spec, TrainConfig(epochs=1, batch_size=256, lr=0.1), out=tmp_path / "run", fractions=split)
    run = as_run(tmp_path / "run")
    monkeypatch.setattr(data, "FIT_BLOCK_BYTES", 1 << 14, raising=False)  # blocks of 32 rows
    monkeypatch.setattr(data, "RELEASE_EVERY_BYTES", 1 << 14)  # and the data hash's chunks (run.dataset())
    tracemalloc.start()
    try:
        result = run_inversion(run, "1", attack=MIFace(iterations=2, restarts=1))
        means = member_class_means(run)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < X.nbytes / 2  # the old route: 2 X.nbytes for X as float64, then members' and holdout's copies
    members = make_splits(4000, 0, split).members
    whole = X[members].astype(np.float64)
    for k in (0, 1):
        assert np.array_equal(means[k], whole[y[members] == k].mean(axis=0))
    assert result.per_class[0]["class"] == 1


def test_the_oracles_accuracy_read_in_blocks_is_its_score_on_the_whole_split():
    """The identification oracle's test accuracy is now counted a block of rows at a time (a memory-mapped X is
    never made float64 whole); it is the same count over the same rows as ``clf.score`` on the whole split (two
    mutants, a row skipped per block and a denominator off by one, went unseen by the inversion tests)."""
    from attacks.inversion import _accuracy_in_blocks, eval_classifier
    from dpaudit.data import load_dataset

    ds = load_dataset("digits")
    idx = np.arange(300, 403)  # 103 rows: blocks of 10 leave a partial one
    clf = eval_classifier(ds.X[:300].astype(np.float64), ds.y[:300])
    whole = clf.score(ds.X[idx].astype(np.float64).reshape(len(idx), -1), ds.y[idx])
    assert _accuracy_in_blocks(clf, ds, idx, block=10) == whole


class _CastsItsInput(torch.nn.Module):
    """A user's module outside the zoo whose forward casts its input to float32 (``x.float()``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.float())


def test_a_user_module_that_casts_its_input_is_attacked_in_its_own_dtype():
    # Before: raw_probabilities ran a float64 copy, and x.float() @ float64 weights raised "mat1 and mat2 must
    # have the same dtype": `dpaudit attack inversion` / `attack attribute` stopped with an internal error.
    from types import SimpleNamespace

    from attacks.attribute import AttributeInference
    from attacks.inversion import raw_probabilities
    from dpaudit.data import Standardizer

    module = _CastsItsInput()
    pre = Standardizer(np.array([1.0, 2.0, 3.0], np.float32), np.array([2.0, 4.0, 0.5], np.float32))
    run = SimpleNamespace(model=module, preprocessing=pre, spec=SimpleNamespace(input_shape=(3,)))
    probs = raw_probabilities(run)
    X = np.random.default_rng(0).normal(size=(50, 3)) * 3
    with torch.no_grad():  # the deployed model: float32 standardisation and forward, softmax
        expected = torch.softmax(module(torch.as_tensor(pre.transform(X))).double(), dim=1).numpy()
    got = as_black_box(probs)(X)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)  # float32 forward: ~1e-7 apart
    t = MIFace(iterations=30, window=5, step=1.0, restarts=1).fit(X).invert(probs, 1)  # autograd through the cast
    assert t.n_iterations > 0 and t.objective < t.costs[0]
    y = (X[:, 0] > 1).astype(int)
    att = AttributeInference(0).fit(X, y, as_black_box(probs))
    assert att.predict(X, y, as_black_box(probs)).shape == (50,)
