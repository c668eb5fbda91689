"""run_mia orchestration and the `dpaudit attack mia` command."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from attacks.mia import ALL, candidates, parse_methods, run_mia
from attacks.result import load_scores
from dpaudit.checkpoint import load_run
from dpaudit.cli.main import app
from dpaudit.errors import CheckpointError, InputError
from dpaudit.validation import available_cores

runner = CliRunner()
SMALL = ["--shadow-models", "2", "--reference-models", "4", "--bootstrap", "20"]
KEYS = [
    "attack", "params", "n_members", "n_nonmembers", "auc", "balanced_accuracy", "advantage",
    "tpr_at_fpr", "tpr_at_fpr_resolved", "ci", "n_reference_models", "n_shadow_models",
]  # fmt: skip


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_parse_methods():
    assert parse_methods("loss, lira,loss") == ("loss", "lira")
    assert parse_methods("all") == ALL
    with pytest.raises(InputError, match="unknown attack method 'x'"):
        parse_methods("loss,x")
    with pytest.raises(InputError, match="no attack method"):
        parse_methods(" , ")


def test_candidates_are_members_and_holdout(tiny_run):
    ids, member = candidates(tiny_run)
    assert np.all(np.diff(ids) > 0)  # sorted: the order reveals nothing
    np.testing.assert_array_equal(ids[member], np.sort(tiny_run.splits.members))
    np.testing.assert_array_equal(ids[~member], np.sort(tiny_run.splits.holdout))


def test_run_mia_all(tiny_run, tmp_path):
    results = run_mia(tiny_run, "all", shadow_models=2, reference_models=4, n_bootstrap=20, cache_dir=tmp_path)
    assert [r.name for r in results] == list(ALL)
    ids, member = candidates(tiny_run)
    for r in results:
        np.testing.assert_array_equal(r.record_ids, ids)
        np.testing.assert_array_equal(r.member, member)
        d = r.to_dict(include_roc=False)
        assert list(d) == KEYS and 0 <= d["auc"] <= 1
    by = {r.name: r.to_dict() for r in results}
    assert by["lira"]["n_reference_models"] == 4 and by["rmia"]["n_reference_models"] == 4
    assert by["shadow"]["n_shadow_models"] == 2 and by["loss"]["n_reference_models"] == 0
    assert by["lira"]["params"]["online"] is True and by["lira"]["params"]["global_variance"] is True
    assert len(list((tmp_path / "models").iterdir())) == 6  # 2 shadow + 4 reference checkpoints
    # Deterministic given the seed (and served from the cache the second time).
    again = run_mia(tiny_run, ["lira"], reference_models=4, n_bootstrap=20, cache_dir=tmp_path)
    np.testing.assert_array_equal(again[0].scores, results[ALL.index("lira")].scores)
    off = run_mia(tiny_run, ["lira"], reference_models=4, online=False, n_bootstrap=0, cache_dir=tmp_path)
    assert off[0].params["online"] is False and "std" not in off[0].params  # 2 OUT models each: a pooled estimate
    # Two reference models (min_models 1): one OUT model per record, no variance to estimate. The params said only
    # "global_variance": true; now they say the floor stands in. Planted: the label dropped -> fails.
    two = run_mia(tiny_run, ["lira"], reference_models=2, min_models=1, online=False, n_bootstrap=0, cache_dir=tmp_path)
    assert two[0].params["std"].startswith("no OUT variance could be estimated") and 0.0 <= two[0].metrics["auc"] <= 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"methods": "shadow", "shadow_models": 0}, "shadow_models >= 1"),
        ({"methods": "lira", "reference_models": 0}, "reference_models >= 1"),
        ({"methods": "shadow", "shadow_models": 3}, r"150 records but 3 shadow model\(s\) need at least 192"),
        ({"methods": "lira", "reference_models": 2, "min_models": 2}, "use at least 4 reference models"),
        ({"methods": "loss", "workers": available_cores() + 1}, "CPU cores"),
    ],
)
def test_run_mia_bad_input(tiny_run, tmp_path, kwargs, match):
    with pytest.raises(InputError, match=match):
        run_mia(tiny_run, cache_dir=tmp_path, n_bootstrap=0, **kwargs)


def test_checkpoint_without_member_list(tiny_run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(tiny_run_dir, copy)
    (copy / "split.npz").unlink()
    with pytest.raises(CheckpointError, match="member list"):
        load_run(copy)


class TestCLI:
    def test_json_all(self, tiny_run_dir, tmp_path):
        scores = tmp_path / "scores.csv"
        r = invoke("attack", "mia", tiny_run_dir, "--attacks", "all", *SMALL,
                   "--cache-dir", tmp_path / "cache", "--scores-out", scores, "--json")  # fmt: skip
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["checkpoint"] == str(tiny_run_dir)
        assert [a["attack"] for a in out["attacks"]] == list(ALL)
        assert all(list(a) == KEYS for a in out["attacks"])  # no ROC unless --roc
        assert set(out["attacks"][0]["tpr_at_fpr"]) == {"0.001", "0.01", "0.1"}
        assert not scores.exists()  # several attacks: one file each
        for a in out["attacks"]:
            s = load_scores(tmp_path / f"scores.{a['attack']}.csv")
            assert len(s["score"]) == 330 and set(s["attack"]) == {a["attack"]}
            assert s["member"].sum() == a["n_members"]
        # One attack: exactly the given file. An existing file is refused without --force (before
        # any work) and replaced with it.
        single = tmp_path / "scores.lira.csv"
        r = invoke("attack", "mia", tiny_run_dir, "--attacks", "lira", "--scores-out", single)
        assert r.exit_code == 2 and "already exists" in r.output
        r = invoke("--json", "attack", "mia", tiny_run_dir, "--attacks", "loss", "--scores-out", single, "--force",
                   "--roc", "--cache-dir", tmp_path / "cache")  # fmt: skip
        assert r.exit_code == 0, r.output
        assert "roc" in json.loads(r.stdout)["attacks"][0]
        assert set(load_scores(single)["attack"]) == {"loss"}

    def test_default_shadow_models_fit_the_aux_split(self, tiny_run_dir, tmp_path):
        # aux 150 records, batch 32: 2 shadow models fit (4 would need 256); the default takes 2.
        r = invoke("--json", "attack", "mia", tiny_run_dir, "--attacks", "shadow", "--cache-dir", tmp_path)
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["attacks"][0]["n_shadow_models"] == 2

    def test_human_table(self, tiny_run_dir, tmp_path):
        r = invoke("attack", "mia", tiny_run_dir, "--attacks", "loss,entropy", "--cache-dir", tmp_path)
        assert r.exit_code == 0, r.output
        header = r.stdout.splitlines()[0].split()
        assert header[:3] == ["attack", "AUC", "balanced"] and "TPR@0.1%" in header and "TPR@10%" in header
        row = r.stdout.splitlines()[2].split()
        assert row[0] == "loss"
        # Rates as percentages, formatted as in the reports; AUC and advantage plain numbers.
        data = json.loads(
            invoke("--json", "attack", "mia", tiny_run_dir, "--attacks", "loss", "--bootstrap", "0").stdout
        )
        a = data["attacks"][0]
        assert 0 <= a["balanced_accuracy"] <= 1 and all(0 <= v <= 1 for v in a["tpr_at_fpr"].values())
        from dpaudit.report._format import rate, tpr_cell

        tprs = [tpr_cell(a, k) for k in ("0.001", "0.01", "0.1")]  # "n/a: ..." where the non-members cannot resolve it
        assert rate(a["balanced_accuracy"]) in row and " ".join(row).endswith(" ".join([*tprs, row[-1]]))
        assert all(c.endswith("%") or c.startswith("n/a: needs") for c in tprs) and f"{a['advantage']:.3f}" in row

    def test_cache_goes_to_the_user_cache_not_the_current_directory(self, tiny_run_dir, tmp_path, monkeypatch):
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path / "env-cache"))
        r = invoke("--json", "attack", "mia", tiny_run_dir, "--attacks", "shadow", "--bootstrap", "0")
        assert r.exit_code == 0, r.output
        assert len(list((tmp_path / "env-cache" / "models").iterdir())) == 2  # two shadow models
        assert list(cwd.iterdir()) == []
        # Without DPAUDIT_CACHE_DIR: $XDG_CACHE_HOME/dpaudit (served from there the second time).
        monkeypatch.delenv("DPAUDIT_CACHE_DIR")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        r = invoke("--json", "attack", "mia", tiny_run_dir, "--attacks", "shadow", "--bootstrap", "0")
        assert r.exit_code == 0, r.output
        assert len(list((tmp_path / "xdg" / "dpaudit" / "models").iterdir())) == 2
        assert list(cwd.iterdir()) == []
        # --no-cache: a temporary directory, deleted afterwards; --cache-dir wins over the environment.
        monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
        (tmp_path / "tmp").mkdir()
        r = invoke("attack", "mia", tiny_run_dir, "--attacks", "shadow", "--bootstrap", "0", "--no-cache")
        assert r.exit_code == 0, r.output
        assert list((tmp_path / "tmp").iterdir()) == [] and list(cwd.iterdir()) == []
        r = invoke("attack", "mia", tiny_run_dir, "--attacks", "shadow", "--bootstrap", "0", "--cache-dir", "here")
        assert r.exit_code == 0, r.output
        assert len(list((cwd / "here" / "models").iterdir())) == 2

    def test_audit_checkpoint_and_report_take_no_cache_too(self, tiny_run_dir, tmp_path, monkeypatch):
        # `attack mia --no-cache` existed; `audit checkpoint` and `report` (the same reference models, LiRA's)
        # could only write them to the user cache.
        monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path / "env-cache"))
        monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
        (tmp_path / "tmp").mkdir()
        lira = ["--attacks", "lira", "--reference-models", "4", "--no-cache"]
        r = invoke("audit", "checkpoint", tiny_run_dir, *lira)
        assert r.exit_code == 0, r.output
        r = invoke("report", tiny_run_dir, *lira, "--out", tmp_path / "rep", "--format", "json")
        assert r.exit_code == 0, r.output
        assert not (tmp_path / "env-cache").exists() and list((tmp_path / "tmp").iterdir()) == []
        for cmd in (["audit", "checkpoint", tiny_run_dir], ["report", tiny_run_dir, "--out", tmp_path / "r2"]):
            r = invoke(*cmd, "--no-cache", "--cache-dir", "x")
            assert r.exit_code == 2 and "give --cache-dir or --no-cache, not both" in r.stderr, r.output

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--no-cache", "--cache-dir", "x"], "give --cache-dir or --no-cache, not both"),
            (["--no-cache", "--scheduler", "tcp://127.0.0.1:9"], "--no-cache keeps models in a temporary directory"),
        ],
    )
    def test_no_cache_conflicts(self, tiny_run_dir, tmp_path, monkeypatch, args, message):
        monkeypatch.chdir(tmp_path)
        r = invoke("attack", "mia", tiny_run_dir, "--attacks", "loss", *args)
        lines = r.stderr.splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), r.output
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--attacks", "shadow", "--shadow-models", "0"], "expected --shadow-models >= 1, got 0"),
            (["--attacks", "shadow", "--shadow-models", "5"], "need at least"),
            (["--attacks", "lira", "--reference-models", "0"], "expected --reference-models >= 1"),
            (["--attacks", "nope"], "unknown attack method"),
            (["--attacks", "loss", "--workers", str(available_cores() + 1)], "CPU cores on this machine"),
            (["--attacks", "loss", "--scores-out", "x.txt"], "use .csv or .npz"),
        ],
    )
    def test_bad_input_exit_2(self, tiny_run_dir, tmp_path, args, message):
        r = invoke("attack", "mia", tiny_run_dir, "--cache-dir", tmp_path, *args)
        assert r.exit_code == 2, r.output
        assert message in r.output and "Traceback" not in r.output

    def test_missing_checkpoint(self, tmp_path):
        r = invoke("attack", "mia", tmp_path / "nope", "--attacks", "loss")
        assert r.exit_code == 2 and "no such run directory" in r.output


@pytest.mark.slow
def test_lira_beats_loss_on_an_overfit_target(tmp_path):
    """End to end on digits: a wide MLP trained long on few records; LiRA must out-rank the loss attack.

    Observed (seed 0): AUC 0.66 vs 0.62, TPR@1%FPR 0.12 vs 0.006. With 179 members the binomial SE
    of a TPR near 0.12 is ~0.024, so the 0.05 margin at 1% FPR sits ~3 SE below the observed gap.
    LiRA's claim is the low-FPR one (Carlini et al. 2022, arXiv:2112.03570, Sec. IV); the AUCs differ by
    0.04, about one standard error of an AUC on 179 + 179 records (Hanley & McNeil 1982:
    sqrt((n + m + 1) / (12 n m)) ~= 0.031 under no signal), too little to order them on every machine, so
    the AUC is only required to beat the loss attack's by no less than -2 such errors, and chance by 3.
    """
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset("digits")
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=10, hidden=(128,))
    out = tmp_path / "target"
    train_run(ds, spec, TrainConfig(epochs=60, batch_size=32, lr=0.1), out=out, fractions=(0.1, 0.1, 0.6, 0.2))
    res = {r.name: r for r in run_mia(load_run(out), ["loss", "lira"], reference_models=8, workers=available_cores(),
                                      cache_dir=tmp_path / "cache", n_bootstrap=0)}  # fmt: skip
    loss, lira = res["loss"].metrics, res["lira"].metrics
    n, m = lira["n_members"], lira["n_nonmembers"]
    se = np.sqrt((n + m + 1) / (12 * n * m))
    assert lira["auc"] > 0.5 + 3 * se
    assert lira["auc"] > loss["auc"] - 2 * se
    assert lira["tpr_at_fpr"]["0.01"] > loss["tpr_at_fpr"]["0.01"] + 0.05


def _memorising_models(seen: list):
    """A stand-in for ``train_models``: model j "memorises" its training set (true-class logit +3 on it, -3
    elsewhere), so a record's signal says which models trained on it; the training sets asked for are kept."""

    def train(recipe, train_sets, seeds, **kwargs):
        y = recipe.dataset.y
        logits = np.zeros((len(train_sets), len(y), recipe.spec.n_classes))
        for j, idx in enumerate(train_sets):
            logits[j, np.arange(len(y)), y] = np.where(np.isin(np.arange(len(y)), idx), 3.0, -3.0)
        seen.append((kwargs["description"], [np.asarray(s) for s in train_sets]))
        reduce = kwargs.get("reduce")
        return logits if reduce is None else np.stack([reduce(lg) for lg in logits])

    return train


def test_reference_and_shadow_training_sets_are_wired_to_the_masks(tiny_run, monkeypatch):
    """The wires between the splits, the models' training sets and the attacks, with 5 reference models (odd,
    and the 420-record population is not a multiple of 5): every reference training set lies in the candidates
    plus aux (never test records), LiRA's and RMIA's IN matrix says exactly which candidates each model trained
    on, every candidate is IN for 2 or 3 of them, and the target's own signals come in the same record order;
    shadow models train on disjoint parts of aux, never on a candidate (a target member among a shadow's
    "non-members" would teach the attack that members look OUT)."""
    import attacks.mia as mia
    from attacks.lira import LiRA
    from attacks.rmia import RMIA
    from attacks.threshold import logit_margin, loss_score

    seen: list = []
    masks = {}

    class Recorded(LiRA):
        def fit(self, signals, in_mask, **kw):
            masks["lira"] = (np.asarray(signals), np.asarray(in_mask))
            return super().fit(signals, in_mask, **kw)

        def score(self, target_signals):
            masks["lira target"] = np.asarray(target_signals)
            return super().score(target_signals)

    class RecordedRMIA(RMIA):
        def fit(self, signals, in_mask):
            masks["rmia"] = np.asarray(in_mask)
            return super().fit(signals, in_mask)

        def score(self, target_signals):
            masks["rmia target"] = np.asarray(target_signals)
            return super().score(target_signals)

    monkeypatch.setattr(mia, "train_models", _memorising_models(seen))
    monkeypatch.setattr(mia, "LiRA", Recorded)
    monkeypatch.setattr(mia, "RMIA", RecordedRMIA)
    sp = tiny_run.splits
    ids, _ = candidates(tiny_run)
    mia.run_mia(tiny_run, ["shadow", "lira", "rmia"], shadow_models=2, reference_models=5, n_bootstrap=0)
    (shadow_desc, shadow_sets), (ref_desc, ref_sets) = seen
    assert (shadow_desc, ref_desc) == ("shadow models", "reference models") and len(ref_sets) == 5
    # Reference models: IN matrix == "this candidate is in model j's training set", for every (record, model).
    signals, in_mask = masks["lira"]
    expected = np.stack([np.isin(ids, s) for s in ref_sets], axis=1)
    np.testing.assert_array_equal(in_mask, expected)
    np.testing.assert_array_equal(masks["rmia"], expected)
    np.testing.assert_array_equal(signals > 0, expected)  # the signals matrix rows are the candidates, in order
    assert set(in_mask.sum(axis=1)) == {2, 3}
    # The target's signals reach the attacks in the candidates' order (row i of the IN matrix is record ids[i]):
    # LiRA's phi and RMIA's log p_y of the target model on each candidate.
    ds = tiny_run.dataset()
    target_logits = tiny_run.logits(ds.view(ids))
    np.testing.assert_array_equal(masks["lira target"], logit_margin(target_logits, ds.y[ids]))
    np.testing.assert_array_equal(masks["rmia target"], loss_score(target_logits, ds.y[ids]))
    population = np.union1d(ids, np.concatenate(ref_sets))
    assert np.isin(population, np.r_[ids, sp.aux]).all() and len(population) == 2 * len(sp.members)
    # Shadow models: inside aux, pairwise disjoint, no candidate.
    everything = np.concatenate(shadow_sets)
    assert len(np.unique(everything)) == len(everything) and np.isin(everything, sp.aux).all()
    assert not np.isin(everything, ids).any()


def test_each_reference_models_signal_reaches_lira_and_rmia_as_the_dense_logits_gave_it(tiny_run, monkeypatch):
    """The reference models' logits are reduced to their phi on the candidates as each model comes
    (train_models' reduce), never held as (M, N, k): LiRA's signals matrix and RMIA's log p_y are bit for bit those
    of the dense logits (lira.signals_matrix of logits[:, ids], threshold.loss_score of each model), with the IN
    matrix alongside, on random logits where every record's value differs."""
    import attacks.mia as mia
    from attacks.lira import LiRA, signals_matrix
    from attacks.rmia import RMIA
    from attacks.threshold import loss_score

    got, dense = {}, {}

    def train(recipe, train_sets, seeds, **kwargs):
        rng = np.random.default_rng(len(train_sets))
        logits = rng.normal(0, 3, (len(train_sets), len(recipe.dataset), recipe.spec.n_classes))
        dense[kwargs["description"]] = (logits, train_sets)
        return np.stack([kwargs["reduce"](lg) for lg in logits]) if kwargs.get("reduce") else logits

    class Recorded(LiRA):
        def fit(self, signals, in_mask, **kw):
            got["lira"] = (np.array(signals), np.array(in_mask))
            return super().fit(signals, in_mask, **kw)

    class RecordedRMIA(RMIA):
        def fit(self, signals, in_mask):
            got["rmia"] = (np.array(signals), np.array(in_mask))
            return super().fit(signals, in_mask)

    monkeypatch.setattr(mia, "train_models", train)
    monkeypatch.setattr(mia, "LiRA", Recorded)
    monkeypatch.setattr(mia, "RMIA", RecordedRMIA)
    mia.run_mia(tiny_run, ["lira", "rmia"], reference_models=6, n_bootstrap=0)
    ids, _ = candidates(tiny_run)
    y = tiny_run.dataset().y[ids]
    logits, sets = dense["reference models"]
    in_mask = np.stack([np.isin(ids, s) for s in sets], axis=1)
    np.testing.assert_array_equal(got["lira"][0], signals_matrix(logits[:, ids], y))
    np.testing.assert_array_equal(got["rmia"][0], np.stack([loss_score(r, y) for r in logits[:, ids]], axis=1))
    for name in ("lira", "rmia"):
        np.testing.assert_array_equal(got[name][1], in_mask)


def test_non_members_that_copy_a_member_are_counted_and_warned_of(tmp_path, tiny_run):
    """A table with repeated rows: a holdout copy of a member is scored as the member it copies but counted a
    non-member, so the AUC understates the leakage; `attack mia` says how many there are (none on tiny_run)."""
    from attacks.mia import attack_checkpoint, duplicated_nonmembers
    from dpaudit.data import Splits, load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((60, 4)).astype(np.float32), rng.integers(0, 2, 60)
    X[40:45], y[40:45] = X[0:5], y[0:5]  # holdout 40..44 copy members 0..4
    X[45], y[45] = X[5], 1 - y[5]  # the same features with another label: not a copy
    np.savez(tmp_path / "dup.npz", X=X, y=y)
    ds = load_dataset(str(tmp_path / "dup.npz"))
    members, holdout = np.arange(30), np.arange(40, 60)
    assert duplicated_nonmembers(ds, members, holdout) == 5
    assert duplicated_nonmembers(ds, members, holdout[5:]) == 0
    splits = Splits(members=members, holdout=holdout, aux=np.arange(30, 36), test=np.arange(36, 40), seed=0)
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=2)
    train_run(ds, spec, TrainConfig(epochs=1, batch_size=16, lr=0.1, seed=0), out=tmp_path / "run", splits=splits)
    heard: list[str] = []
    common = dict(attacks="loss", shadow_models=None, reference_models=4, online=True, min_models=2, workers=1,
                  scheduler=None, cache_dir=None, no_cache=False, scores_out=None, bootstrap=0, seed=0,
                  warn=heard.append)  # fmt: skip
    attack_checkpoint(tmp_path / "run", **common)
    assert [m for m in heard if "exact copies" in m] == [
        "5 of 20 non-members (holdout records) are exact copies of a member (your data repeats records): the attacks "
        "score them as the members they copy, so every AUC and TPR below understates the leakage; remove duplicate "
        "records before training to measure it"
    ]
    from dpaudit.workflows.checkpoint import audit_checkpoint

    (record,) = audit_checkpoint(tmp_path / "run", attacks=("loss",)).audits
    assert heard[-1] in record.result.notes  # the audit's estimate carries it too
    heard.clear()
    attack_checkpoint(tiny_run.path, **common)
    assert not [m for m in heard if "exact copies" in m]


def test_attacks_take_the_run_directory_as_the_cli_does(tiny_run, tiny_run_dir):
    """``run_mia("runs/mlp", ...)`` (the CLI's RUN, what audit_checkpoint takes) raised AttributeError: 'str'
    object has no attribute 'splits'; extract, run_inversion and run_attribute likewise. A path (str or
    PathLike) is now loaded; the answer is the loaded run's."""
    from attacks import extract
    from attacks.attribute import run_attribute

    by_path = run_mia(str(tiny_run_dir), "loss", n_bootstrap=2)[0]
    loaded = run_mia(tiny_run, "loss", n_bootstrap=2)[0]
    np.testing.assert_array_equal(by_path.scores, loaded.scores)
    assert extract(tiny_run_dir, budget=50, method="learning", surrogate="logreg", curve_points=0).result.queries == 50
    assert run_attribute(str(tiny_run_dir), 0).to_dict() == run_attribute(tiny_run, 0).to_dict()


def test_scores_of_several_attacks_are_replaced_together_or_not_at_all(tiny_run_dir, tmp_path, monkeypatch):
    """`--attacks loss,confidence --scores-out s.npz --force` wrote s.loss.npz, then s.confidence.npz: a full disk
    (or Ctrl-C) between the two left the new loss scores beside the old confidence ones. Now neither is replaced,
    and the error is one line."""
    import errno
    import os

    from dpaudit import fileio

    paths = [tmp_path / "s.loss.npz", tmp_path / "s.confidence.npz"]
    for p in paths:
        p.write_bytes(b"old")
    real_replace, renamed = os.replace, []

    def replace(src, dst):
        if str(dst) in map(str, paths):
            renamed.append(dst)
            if len(renamed) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(fileio.os, "replace", replace)
    args = ("--attacks", "loss,confidence", "--scores-out", tmp_path / "s.npz", "--force", "--cache-dir", tmp_path)
    r = invoke("--quiet", "attack", "mia", tiny_run_dir, *args)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "no space left on device" in lines[0], r.output
    assert [p.read_bytes() for p in paths] == [b"old", b"old"]
    monkeypatch.setattr(fileio.os, "replace", real_replace)
    assert invoke("--quiet", "attack", "mia", tiny_run_dir, *args).exit_code == 0
    assert [load_scores(p)["attack"][0] for p in paths] == ["loss", "confidence"]
