"""Audit workflows on real training: one answer per checkpoint, formal vs estimate, multi-run audits."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.cli.main import app
from dpaudit.data import load_dataset
from dpaudit.models import default_spec
from dpaudit.training.config import DPConfig, TrainConfig
from dpaudit.workflows import audit_checkpoint, audit_training

runner = CliRunner()


@pytest.fixture(scope="module")
def canary_run(tmp_path_factory):
    """A non-private MLP that memorises its 60 mislabeled canaries (about half included)."""
    out = tmp_path_factory.mktemp("runs") / "canary"
    args = ["train", "--out", str(out), "--canaries", "60", "--canary-kind", "mislabeled", "--epochs", "60"]
    r = runner.invoke(app, [*args, "--hidden", "256", "--batch-size", "32"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """A non-private logistic regression without canaries (members vs holdout: estimates only)."""
    out = tmp_path_factory.mktemp("runs") / "plain"
    assert runner.invoke(app, ["train", "--out", str(out), "--epochs", "30", "--lr", "1"]).exit_code == 0
    return out


def test_canaries_recorded_and_reloaded(canary_run):
    from dpaudit.checkpoint import load_run

    run = load_run(canary_run)
    c = run.canaries()
    assert len(c) == 60 and run.meta["canaries"]["n_included"] == int(c.included.sum())
    # Members of the run are unchanged by the canaries (they are extra records, not part of the data).
    assert run.meta["split"]["sizes"]["members"] == len(run.splits.members)


def test_false_claim_is_a_formal_violation_exit_1(canary_run, tmp_path):
    args = ["audit", "checkpoint", str(canary_run), "--claimed-epsilon", "0.5", "--attacks", "none"]
    r = runner.invoke(app, [*args, "--fail-on-violation", "--json"])
    assert r.exit_code == 1, r.output
    d = json.loads(r.stdout)
    (a,) = d["audits"]
    assert a["verdict"] == "violation" and a["method"] == "one-run" and a["formal"] is True
    assert a["design"] == "canaries" and a["epsilon_lower_bound"] > 0.5
    assert d["verdict"] == "violation" and d["formal"]["attack"] == "canaries"
    assert d["headline"].startswith("violation: ε ≥")
    # Without --fail-on-violation the command succeeds and still says "violation".
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and "violation" in r.output
    # Beside an estimate (a loss attack) the formal canary audit still gates: exit 1, never 2 as on estimates only.
    r = runner.invoke(app, [*args[:-1], "loss", "--fail-on-violation"])
    assert r.exit_code == 1, r.output


def test_an_estimate_never_exits_1_without_opt_in(plain_run, tmp_path):
    """An attack on the model's own members is an estimate: above the claim it is estimate-exceeds-claim,
    never exit 1 under --fail-on-violation (exit 2: with estimates only, that gate could never fail), exit 1 only
    with --fail-on-estimate."""
    args = ["audit", "checkpoint", str(plain_run), "--attacks", "loss", "--claimed-epsilon", "0.0"]
    r = runner.invoke(app, [*args, "--fail-on-violation", "--json"])
    assert r.exit_code == 2 and "every result here is an estimate" in r.stderr, r.output
    d = json.loads(r.stdout)
    (a,) = d["audits"]
    assert a["formal"] is False and a["design"] == "membership"
    assert a["epsilon_lower_bound"] > 0.0, "the planted claim must be exceeded for this test to bite"
    assert a["verdict"] == "estimate-exceeds-claim" and d["verdict"] is None
    assert "not a formal violation" in d["headline"]
    r = runner.invoke(app, [*args, "--fail-on-estimate"])
    assert r.exit_code == 1, r.output
    assert "estimate" in r.output


def test_attacks_as_the_cli_spells_them_give_the_cli_answer(plain_run):
    """A notebook passing the CLI's vocabulary, ``attacks="loss"``, got "unknown attack method 'l'" (the string
    was read as a sequence of one-letter names); now it is the CLI's ``--attacks loss``, with the same JSON."""
    r = runner.invoke(app, ["audit", "checkpoint", str(plain_run), "--attacks", "loss", "--json"])
    assert r.exit_code == 0, r.output
    lib = audit_checkpoint(plain_run, attacks="loss").to_dict()
    assert lib == audit_checkpoint(plain_run, attacks=("loss",)).to_dict()
    assert json.loads(json.dumps(lib)) == json.loads(r.stdout)
    with pytest.raises(Exception, match="nothing to audit"):  # "none": no attack, and this run has no canaries
        audit_checkpoint(plain_run, attacks="none")


def test_one_checkpoint_one_answer(canary_run, tmp_path):
    """Acceptance (issue 10): `audit checkpoint`, `report` and the demo's evaluation of the same
    checkpoint give identical bounds and verdicts, and the same headline."""
    from dpaudit.demo import QUICK, evaluate
    from dpaudit.report import build_report, model_entry_from

    cache = tmp_path / "cache"
    settings = ["--attacks", "loss,lira", "--reference-models", str(QUICK.reference_models)]
    r = runner.invoke(app, ["audit", "checkpoint", str(canary_run), *settings, "--cache-dir", str(cache), "--json"])
    assert r.exit_code == 0, r.output
    cli = json.loads(r.stdout)
    out = tmp_path / "report"
    r = runner.invoke(app, ["report", str(canary_run), *settings, "--cache-dir", str(cache), "--out", str(out)])
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "report.json").read_text())["models"][0]
    demo = build_report([model_entry_from(evaluate(canary_run, QUICK, name="canary", cache_dir=cache))], title="t")
    demo = demo["models"][0]

    def key(audits):
        return [
            (a["source"]["attack"], a["method"], a["formal"], a["epsilon_lower_bound"], a["verdict"]) for a in audits
        ]

    assert key(cli["audits"]) == key(rep["audits"]) == key(demo["audits"])
    assert [a["source"]["attack"] for a in cli["audits"]] == ["canaries", "loss", "lira"]
    assert cli["headline"] == rep["summary"]["headline"] == demo["summary"]["headline"]
    assert cli["headline"].startswith("leaks: ε ≥")  # non-private: what was shown, not "inconclusive"


def test_multi_run_black_box_flags_non_private_training():
    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=10)
    config = TrainConfig(algo="sgd", epochs=20, batch_size=20, lr=0.5)
    d = audit_training(ds, spec, config, runs=25, train_size=100, claimed_epsilon=0.5, seed=0)
    a = d.result
    assert a.formal is True and a.method == "clopper-pearson" and a.design == "multi-run"
    assert a.epsilon_lower_bound > 0.5 and a.verdict == "violation"


def _spy_fits(monkeypatch):
    """Record what each multi-run training fits its preprocessing on and trains on (a preprocessing given fitted:
    the records :func:`dpaudit.data.fit_preprocessing` fitted it on)."""
    import dpaudit.data as data_mod
    import dpaudit.training.run as run_mod

    calls = []
    fitted_on = {}
    real, real_fit = run_mod.fit_model, data_mod.fit_preprocessing

    def fit_preprocessing(dataset, idx):
        pre = real_fit(dataset, idx)
        fitted_on[id(pre)] = np.asarray(idx).copy()
        return pre

    def fit_model(dataset, train_idx, spec, config, perf=None, **kw):
        pre_idx = kw.get("preprocessing_idx")
        if kw.get("preprocessing") is not None:
            pre_idx = fitted_on[id(kw["preprocessing"])]
        calls.append((np.asarray(train_idx).copy(), None if pre_idx is None else pre_idx.copy(), config))
        return real(dataset, train_idx, spec, config, perf, **kw)

    monkeypatch.setattr(data_mod, "fit_preprocessing", fit_preprocessing)
    monkeypatch.setattr(run_mod, "fit_model", fit_model)
    return calls


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_multi_run_trains_the_claimed_pipeline(monkeypatch, sampling):
    """The wire from the audit design into training: IN and OUT runs share the preprocessing (public aux
    split, never a set holding the canary), the step count and σ; the neighbouring relation follows the
    claim (add/remove for Poisson; replace-one — same size, canary swapped for a record — for shuffle)."""
    from dpaudit.data import make_splits

    calls = _spy_fits(monkeypatch)
    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=10)
    dp = DPConfig(clip=1.0, target_epsilon=2.0, delta=1e-5, sampling=sampling)
    config = TrainConfig(algo="dpsgd", epochs=1, batch_size=50, lr=1.0, dp=dp)
    d = audit_training(ds, spec, config, runs=2, train_size=100, seed=0)
    aux = make_splits(len(ds), 0).aux
    assert len(calls) == 4
    for _, pre_idx, _ in calls:
        np.testing.assert_array_equal(pre_idx, aux)
    (in1, _, c_in), (in2, _, _), (out1, _, c_out), (out2, _, _) = calls
    np.testing.assert_array_equal(in1, in2)
    np.testing.assert_array_equal(out1, out2)
    assert c_in.steps == c_out.steps and c_in.dp.noise_multiplier == c_out.dp.noise_multiplier
    assert c_in.dp.target_epsilon is None
    canary = len(ds)  # appended after the dataset's records
    assert canary in in1 and canary not in out1
    if sampling == "poisson":
        assert d.neighbouring == "add_remove" and len(out1) == len(in1) - 1
        # q fixed for both neighbours (B / N would differ between N and N + 1 records).
        assert c_in.dp.sample_rate == c_out.dp.sample_rate == pytest.approx(50 / len(in1))
        assert set(out1) == set(in1) - {canary}
    else:
        assert d.neighbouring == "replace_one" and len(out1) == len(in1)
        assert len(set(in1) ^ set(out1)) == 2
    assert d.result.design == "multi-run" and d.result.formal


def test_multi_run_preprocessing_never_sees_the_canary_without_aux(monkeypatch):
    """With no public split, preprocessing is fitted on the records common to both neighbours."""
    import dpaudit.workflows.training as wt
    from dpaudit.data import make_splits

    real = make_splits

    def no_aux(n, seed, *a, **k):
        s = real(n, seed, *a, **k)
        import dataclasses

        return dataclasses.replace(s, aux=np.array([], dtype=np.int64))

    monkeypatch.setattr("dpaudit.data.make_splits", no_aux)
    calls = _spy_fits(monkeypatch)
    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=10)
    config = TrainConfig(algo="sgd", epochs=1, batch_size=50, lr=0.5)
    wt.audit_training(ds, spec, config, runs=2, train_size=100, seed=0)
    _, _, (out_idx, pre_out, _), _ = calls
    pre_in = calls[0][1]
    np.testing.assert_array_equal(pre_in, pre_out)
    assert len(ds) not in pre_in and set(pre_in) <= set(out_idx)


def test_private_run_without_public_split_keeps_raw_features(tmp_path):
    """A DP run with an empty auxiliary split does not fit its scaler on members; the checkpoint says so."""
    r = runner.invoke(
        app,
        [
            "train", "--algo", "dpsgd", "--noise-multiplier", "1.0", "--epochs", "1", "--out", str(tmp_path / "r"),
            "--split", "0.6,0.2,0,0.2",
        ],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "r" / "checkpoint.json").read_text())
    assert meta["preprocessing"]["kind"] == "identity" and meta["preprocessing"]["fitted_on"] == "none"


def test_replace_one_claim_is_not_refuted_by_add_remove_canaries(tmp_path):
    """A shuffled-batch (replace-one) claim audited with add/remove canaries: reported as an estimate."""
    out = tmp_path / "shuffle"
    args = ["train", "--algo", "dpsgd", "--epsilon", "1", "--sampling", "shuffle", "--epochs", "1"]
    r = runner.invoke(app, [*args, "--canaries", "20", "--out", str(out)])
    assert r.exit_code == 0, r.output
    audit = audit_checkpoint(out, attacks=())
    (a,) = audit.audits
    assert a.result.formal is False and any("replace-one" in n for n in a.result.notes)
    assert any("train with --sampling poisson" in n for n in a.result.notes)
    # the headline does not tell a run with canaries to train with canaries
    assert "no formal audit (its canary audit is an estimate; its note says why)" in audit.headline().text


def test_a_convex_learners_replace_one_note_names_no_option_it_lacks():
    """Output perturbation's claim is replace-one (Chaudhuri et al. 2011); its add/remove canary audit was told to
    "train with --sampling poisson" (an option the convex learners do not have) "or audit with `dpaudit audit
    train`" (which trains sgd, adam, dpsgd and dpadam only)."""
    from dpaudit.workflows.checkpoint import relation_note

    note = relation_note("replace_one", "add_remove", "outpert")
    assert "(--algo outpert)" in note and "--sampling poisson" not in note and "no formal audit of this run yet" in note
    for algo in ("dpsgd", "dpadam-jl", None, "imported"):
        assert "train with --sampling poisson" in relation_note("replace_one", "add_remove", algo)
    assert relation_note("add_remove", "add_remove", "outpert") is None


def test_white_box_needs_private_trainer():
    r = runner.invoke(app, ["audit", "train", "--algo", "sgd", "--threat-model", "white-box", "--runs", "2"])
    assert r.exit_code == 2 and "needs a private trainer" in r.output


def _auc_bound(epsilon: float, delta: float) -> float:
    """The largest AUC any test can reach against an (ε, δ)-DP mechanism: 1 − ∫₀¹ f_{ε,δ}(α) dα with
    f_{ε,δ}(α) = max{0, 1 − δ − e^ε α, e^{−ε}(1 − δ − α)} (Dong, Roth & Su 2022, Prop. 2.5)."""
    from scipy.integrate import quad

    f = lambda a: max(0.0, 1 - delta - np.exp(epsilon) * a, np.exp(-epsilon) * (1 - delta - a))  # noqa: E731
    kink = (1 - delta) / (1 + np.exp(epsilon))
    return 1.0 - (quad(f, 0, kink)[0] + quad(f, kink, 1)[0])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_multi_run_black_box_respects_a_correct_claim(seed):
    """Acceptance (issue 10): a correct DP-SGD at claimed ε = 0.5; the IN/OUT AUC of the canary scores
    lies within what (0.5, δ)-DP allows (both directions), up to sampling error: the Mann–Whitney AUC of
    n + n scores has standard deviation at most sqrt((2n + 1) / (12 n²)) under equal laws (and less
    otherwise), so 3.5 of those bound a correct pipeline's excursion with probability > 0.999."""
    from sklearn.metrics import roc_auc_score

    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=10)
    dp = DPConfig(clip=1.0, target_epsilon=0.5, delta=1e-5)
    config = TrainConfig(algo="dpsgd", epochs=2, batch_size=50, lr=1.0, dp=dp)
    runs = 60
    d = audit_training(ds, spec, config, runs=runs, train_size=200, seed=seed, workers=2, canary_kind="clipbkd")
    assert d.result.verdict != "violation"
    hi = _auc_bound(0.5, 1e-5)
    tol = 3.5 * np.sqrt((2 * runs + 1) / (12 * runs**2))
    auc = roc_auc_score(d.member, d.scores)
    assert 1 - hi - tol <= auc <= hi + tol, (auc, hi, tol)
    # The formal version of the same check, in both score directions (α split between them).
    from dpaudit.audit import audit_scores

    both = audit_scores(d.scores, d.member, design="multi-run", alternative="two-sided", claimed_epsilon=0.5)
    assert both.verdict != "violation"
    # This check is loose at 60 runs a side (a pipeline whose scaler saw the canary gave AUC 0.29-0.35
    # here and passed it); the planted scaler mistake is caught by test_multi_run_trains_the_claimed_pipeline.


def test_fixed_sample_rate_makes_both_neighbours_one_mechanism():
    """DPConfig.sample_rate pins q: training on N or N + 1 records is then the same sampled Gaussian
    mechanism (same event, same ε); without it q = B/N differs."""
    from dpaudit.training.algorithms import claim_for

    dp = DPConfig(clip=1.0, noise_multiplier=1.0, delta=1e-5)
    config = TrainConfig(algo="dpsgd", steps=100, batch_size=50, lr=1.0, dp=dp)
    free = [claim_for(config, n) for n in (200, 201)]
    assert free[0]["sample_rate"] != free[1]["sample_rate"]
    pinned = TrainConfig(
        algo="dpsgd", steps=100, batch_size=50, lr=1.0, dp=DPConfig(noise_multiplier=1.0, sample_rate=0.25)
    )
    a, b = (claim_for(pinned, n) for n in (200, 201))
    assert a["sample_rate"] == b["sample_rate"] == 0.25 and a["event"] == b["event"] and a["epsilon"] == b["epsilon"]
    assert a["epsilon"] == free[0]["epsilon"]  # q = 50/200 either way
    with pytest.raises(Exception, match="Poisson"):
        DPConfig(noise_multiplier=1.0, sampling="shuffle", sample_rate=0.1)


def test_one_audit_loads_and_hashes_the_data_once_for_every_attack_family(plain_run, monkeypatch):
    """`report` and `audit checkpoint` reloaded and re-hashed the run's data for the membership attacks and again
    for each attack family (each load reads and sha256-hashes the whole file: 10.8 s at 50,000 CIFAR-sized images,
    four loads a run for `report --inversion --attribute F --extraction-budget B`, three here). Now the audit
    holds one load (:meth:`Run.dataset_held`) that every attack shares, with the same answer; before and after it
    each ``run.dataset()`` reloads and checks again (its documented meaning for library users)."""
    from dpaudit import checkpoint
    from dpaudit.checkpoint import load_run

    loads = []
    original = checkpoint.load_dataset
    monkeypatch.setattr(checkpoint, "load_dataset", lambda *a, **k: loads.append(1) or original(*a, **k))
    run = load_run(plain_run)
    families = {"attribute": {"feature": 3}, "inversion": {"classes": (0,)}}
    audit = audit_checkpoint(run, attacks="loss", families=families).to_dict()
    assert len(loads) == 1
    run.dataset()
    assert len(loads) == 2  # the hold ended with the audit
    with run.dataset_held():
        assert len(loads) == 2  # nothing loaded until asked
        first = run.dataset()
        with run.dataset_held():  # a nested block shares the outer load and does not end it
            assert run.dataset() is first
        assert run.dataset() is first and len(loads) == 3
    with pytest.raises(RuntimeError), run.dataset_held():  # an error inside ends the hold too
        run.dataset()
        raise RuntimeError
    run.dataset()
    assert len(loads) == 5
    monkeypatch.setattr(checkpoint, "load_dataset", original)
    assert audit_checkpoint(plain_run, attacks="loss", families=families).to_dict() == audit


def _tabular_npz(path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 300)
    np.savez(path, X=(rng.standard_normal((300, 8)) + y[:, None]).astype(np.float32), y=y)


def _trained(data, out, *extra: str) -> str:
    args = ["train", "--data", str(data), "--model", "logreg", "--epochs", "1", "--out", str(out), *extra]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return str(out)


def test_a_report_of_several_runs_loads_each_data_file_once(tmp_path, monkeypatch):
    """`report A C B` with A and B trained on one file and C on another read and sha256-hashed the shared file once
    per run (6.7 s + 4.2 s a load of 50,000 CIFAR-sized images). Now runs of one file, label column and recorded hash
    share a load (:class:`dpaudit.checkpoint.SharedData`): 2 loads, not 3, and the same report; a load is dropped
    after the last run that needs it."""
    import gc
    import weakref

    from dpaudit import checkpoint
    from dpaudit.checkpoint import SharedData, read_meta

    _tabular_npz(tmp_path / "a.npz", 0)
    _tabular_npz(tmp_path / "c.npz", 1)
    a = _trained(tmp_path / "a.npz", tmp_path / "A")
    b = _trained(tmp_path / "a.npz", tmp_path / "B", "--seed", "1")
    c = _trained(tmp_path / "c.npz", tmp_path / "C")
    loads = []
    original = checkpoint.load_dataset
    monkeypatch.setattr(checkpoint, "load_dataset", lambda spec, **k: loads.append(spec) or original(spec, **k))
    args = ["report", a, c, b, "--attacks", "loss", "--format", "json", "--json"]
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "shared")])
    assert r.exit_code == 0, r.output
    assert sorted(loads) == sorted([str(tmp_path / "a.npz"), str(tmp_path / "c.npz")])
    monkeypatch.setattr(SharedData, "dataset", lambda self, run: run._load())  # every run loads its own
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "alone")])
    assert r.exit_code == 0, r.output
    assert len(loads) == 5
    assert (tmp_path / "shared" / "report.json").read_bytes() == (tmp_path / "alone" / "report.json").read_bytes()
    monkeypatch.undo()
    shared = SharedData(read_meta(tmp_path / p) for p in (a, b, c))
    with shared.run(a) as run:
        first = weakref.ref(run.dataset())
    assert first() is not None  # kept: B is still to come
    with shared.run(b) as run:
        assert run.dataset() is first()
    del run
    gc.collect()
    assert first() is None  # dropped after the last run of its file


def test_runs_sharing_a_path_but_not_its_hash_do_not_share_a_load(tmp_path):
    """The file changed between two trainings on one path: the earlier run's report must still say its data
    changed, not take the later run's load of the same path as its own."""
    _tabular_npz(tmp_path / "a.npz", 0)
    old = _trained(tmp_path / "a.npz", tmp_path / "old")
    _tabular_npz(tmp_path / "a.npz", 1)
    new = _trained(tmp_path / "a.npz", tmp_path / "new")
    r = runner.invoke(app, ["report", new, old, "--attacks", "loss", "--format", "json", "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "changed since training" in r.output, r.output
