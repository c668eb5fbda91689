"""dpaudit called as a library, the way a notebook calls it: torch tensors that still carry autograd, counts and
rates outside their range, NaN where a verdict is decided, results printed at the end of a cell.

Bad input is one :class:`~dpaudit.errors.InputError` line (never NaN, a silent 0, or torch's RuntimeError), and a
verdict is never decided on NaN.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from attacks.metrics import evaluate
from attacks.result import AttackResult
from dpaudit.audit import (
    audit_scores,
    clopper_pearson_lower,
    clopper_pearson_upper,
    decide_verdict,
    gdp_mu_lower_bound,
    hypothesis_test_epsilon,
    one_run_epsilon_lower_bound,
    one_run_p_value,
)
from dpaudit.errors import InputError
from dpaudit.hooks import GradientCanaries
from dpaudit.testing import assert_dp

_RNG = np.random.default_rng(0)
_MEMBER = _RNG.random(200) < 0.5
_SCORES = _RNG.normal(size=200) + 2.0 * _MEMBER


def test_scores_as_torch_tensors_that_require_grad_audit_like_numpy():
    """Losses computed without torch.no_grad() (a tensor that requires grad, or a list of per-record 0-d losses)
    used to raise torch's RuntimeError "Can't call numpy() on Tensor that requires grad"; bfloat16 scores read
    "scores must be numeric"."""
    expected = audit_scores(_SCORES, _MEMBER, claimed_epsilon=1.0).epsilon_lower_bound
    grad = torch.tensor(_SCORES, requires_grad=True)
    assert audit_scores(grad, torch.tensor(_MEMBER), claimed_epsilon=1.0).epsilon_lower_bound == expected
    per_record = [torch.tensor(s, requires_grad=True) for s in _SCORES]
    assert audit_scores(per_record, _MEMBER, claimed_epsilon=1.0).epsilon_lower_bound == expected
    bf16 = torch.arange(200.0).bfloat16()  # integers up to 256 are exact in bfloat16
    assert (
        audit_scores(bf16, _MEMBER).epsilon_lower_bound
        == audit_scores(bf16.float().numpy(), _MEMBER).epsilon_lower_bound
    )
    assert evaluate(grad, _MEMBER, n_bootstrap=5)["auc"] == evaluate(_SCORES, _MEMBER, n_bootstrap=5)["auc"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: one_run_epsilon_lower_bound(1000, 100, 190, 1e-5, 0.05), "0 <= v <= r <= m"),  # was 0.0
        (lambda: one_run_epsilon_lower_bound(10, 100, 90, 1e-5, 0.05), "0 <= v <= r <= m"),  # was 1.63 (> valid)
        (lambda: one_run_epsilon_lower_bound(1000.5, 100, 90, 1e-5, 0.05), "integer count"),
        (lambda: one_run_epsilon_lower_bound(1000, 100, 90, 1e-5, 0.0), "alpha"),
        (lambda: one_run_p_value(1000, 100, 190, 1.0, 1e-5), "0 <= v <= r <= m"),  # was a bare ValueError
        (lambda: clopper_pearson_lower(11, 10, 0.05), "0 <= k <= n"),  # was NaN
        (lambda: clopper_pearson_lower(-1, 10, 0.05), "0 <= k <= n"),  # was 0.0
        (lambda: clopper_pearson_upper(np.array([3, 12]), 10, 0.05), "k=12"),  # was [.., 1.0]
        (lambda: clopper_pearson_upper(3, 10, 1.5), "alpha"),
        (lambda: hypothesis_test_epsilon(-0.1, 0.2, 1e-5), "fpr_upper"),  # was NaN
        (lambda: gdp_mu_lower_bound(0.1, math.nan), "fnr_upper"),  # was 0.0
        (lambda: decide_verdict(math.nan, 1.0, 3.0), "lower_bound"),  # was "consistent"
        (lambda: decide_verdict(0.5, math.nan, 3.0), "claimed"),  # was "consistent"
    ],
)
def test_public_statistics_refuse_impossible_inputs_with_one_line(call, message):
    with pytest.raises(InputError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def test_public_statistics_still_answer_valid_inputs():
    assert one_run_epsilon_lower_bound(np.int64(1000), np.int64(100), np.int64(90), 1e-5, 0.05) == pytest.approx(
        1.6261434798549343, rel=1e-9
    )
    assert clopper_pearson_lower(5, 10, 0.05) == pytest.approx(0.2224411010081294, rel=1e-12)
    assert clopper_pearson_upper(0, 0, 0.05) == 1.0
    assert decide_verdict(2.0, 1.0, math.inf) == "violation"
    # an upper bound above 1 (a Wald bound can exceed it) is valid and vacuous: no evidence, bound 0
    assert hypothesis_test_epsilon(1.2, 1.2, 1e-5) == 0.0 and gdp_mu_lower_bound(1.2, 0.5) == 0.0


def test_gradient_canaries_refuse_inclusion_bits_that_are_not_bits():
    """``included=[2, 0, 1, 0]`` (or probabilities) used to be cast to bool and audited as fair coins."""
    kw = {"count": 4, "sample_rate": 0.1, "clip": 1.0, "seed": 0}
    for bad in ([2, 0, 1, 0], [0.3, 0.7, 0.2, 0.9]):
        with pytest.raises(InputError, match="boolean or 0/1"):
            GradientCanaries({"w": (10, 5)}, included=bad, **kw)
    bits = GradientCanaries({"w": (10, 5)}, included=torch.tensor([1, 0, 1, 0]), **kw).included_
    assert bits.tolist() == [True, False, True, False]


def test_attack_result_repr_summarises_its_arrays():
    """A notebook cell ending in ``audit_checkpoint(...)`` printed every score of every attack (32 kB for a
    628-member run)."""
    member = np.arange(5000) % 2 == 0
    r = AttackResult.from_scores("loss", _RNG.normal(size=5000), member, np.arange(5000), n_bootstrap=2)
    text = repr(r)
    assert len(text) < 200 and "n_members=2500" in text and "auc=" in text


def test_assert_dp_reads_a_mechanism_that_releases_a_parameter():
    """A mechanism returning a torch tensor that requires grad (a model's weight after one DP step) used to stop
    assert_dp with torch's RuntimeError instead of auditing it."""

    def mech(data, rng):
        return torch.tensor([float(sum(data)) + rng.laplace(scale=1.0)], requires_grad=True)

    result = assert_dp(mech, [0, 1, 1], [0, 1, 0], epsilon=1.0, delta=0.0, trials=1000, require_power=False)
    assert result.verdict == "consistent"


def test_pandas_scores_and_member_with_different_indexes_are_refused_not_paired_by_position():
    """``audit_scores(df.sort_values("score").score, df.member)`` paired each sorted score with the membership of
    whichever record sat at that position (ε ≥ 0 where the aligned data show ε ≥ 1.4); now one line says to
    align them. Equal indexes (any order of both) audit as before."""
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"score": _SCORES, "member": _MEMBER})
    ranked = df.sort_values("score")
    for call in (audit_scores, evaluate):
        with pytest.raises(InputError, match="different indexes"):
            call(ranked.score, df.member)
    aligned = audit_scores(ranked.score, ranked.member).epsilon_lower_bound
    assert aligned == audit_scores(ranked.score.to_numpy(), ranked.member.to_numpy()).epsilon_lower_bound
    assert audit_scores(df.score, df.member).epsilon_lower_bound == audit_scores(_SCORES, _MEMBER).epsilon_lower_bound


def test_threshold_attacks_read_the_logits_of_a_forward_pass_with_grad():
    """``loss_score(model(X), y)`` on a model's raw output (a tensor that requires grad) raised torch's
    RuntimeError; the attack functions now read it as its values."""
    from attacks.lira import signals_matrix
    from attacks.threshold import loss_score

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    X, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    logits = model(X)
    assert logits.requires_grad
    np.testing.assert_array_equal(loss_score(logits, y), loss_score(logits.detach().numpy(), y.numpy()))
    stacked = torch.stack([logits, 2 * logits])
    np.testing.assert_array_equal(
        signals_matrix(stacked, y.numpy()), signals_matrix(stacked.detach().numpy(), y.numpy())
    )


def test_gradient_canaries_take_a_0_d_step_counter():
    """``for t in torch.arange(T)`` gave ``inject(step=tensor(0)): expected step 0``: a refusal of the right step."""
    c = GradientCanaries({"w": (10, 5)}, count=4, sample_rate=0.1, clip=1.0, seed=0)
    for step in (torch.tensor(0), np.array(1), np.int32(2)):
        c.observe(step, c.inject(step, [np.zeros((10, 5))]))
    assert c.steps_ == 3
    with pytest.raises(InputError, match="expected step 3, an integer"):
        c.inject(3.0, [np.zeros((10, 5))])


def test_compare_accountants_reads_a_string_of_names():
    """``compare_accountants(event, 1e-5, "pld")`` raised "unknown accountant 'p'" (the string read as letters)."""
    from dpaudit.accounting import compare_accountants, dpsgd_event, epsilon_for

    event = dpsgd_event(noise_multiplier=1.1, sample_rate=0.01, steps=100)
    results, best = compare_accountants(event, 1e-5, "rdp, pld")
    assert list(results) == ["rdp", "pld"] and best == epsilon_for(event, 1e-5, "pld")
    assert list(compare_accountants(event, 1e-5, "pld")[0]) == ["pld"]


def test_one_run_guess_counts_as_0_d_tensors():
    """``k_plus=torch.tensor(10)`` (a count computed in torch) was refused as "not a non-negative integer"."""
    kw = {"method": "one-run", "design": "canaries"}
    expected = audit_scores(_SCORES, _MEMBER, k_plus=10, **kw).epsilon_lower_bound
    assert audit_scores(_SCORES, _MEMBER, k_plus=torch.tensor(10), **kw).epsilon_lower_bound == expected
    with pytest.raises(InputError, match=r"non-negative integer, got 2\.5"):
        audit_scores(_SCORES, _MEMBER, k_plus=torch.tensor(2.5), **kw)


def test_gradient_canaries_return_the_callers_mapping_type():
    """The docs promise the same format back; an OrderedDict (or a defaultdict) came back a plain dict."""
    import collections

    c = GradientCanaries({"w": (10, 5), "b": (5,)}, count=4, sample_rate=0.1, clip=1.0, seed=0)
    grads = collections.OrderedDict(b=np.zeros(5), w=np.zeros((10, 5)))
    out = c.inject(0, grads)
    assert type(out) is collections.OrderedDict and list(out) == ["b", "w"]
    assert out is not grads and not grads["w"].any()


def test_load_dataset_takes_a_pathlib_path(tmp_path):
    """``load_dataset(Path("my.npz"))`` was refused with "expected a dataset name or path"."""
    from pathlib import Path

    from dpaudit.data import load_dataset

    path = tmp_path / "d.npz"
    np.savez(path, X=np.arange(40.0).reshape(20, 2), y=np.arange(20) % 2)
    assert isinstance(path, Path)
    np.testing.assert_array_equal(load_dataset(path).X, load_dataset(str(path)).X)


def test_headline_refuses_a_bare_audit_result_with_one_line():
    """``headline([audit_scores(...).to_dict()], claim)`` raised a bare KeyError: 'source'."""
    from dpaudit.workflows import AuditRecord, headline

    result = audit_scores(_SCORES, _MEMBER, method="one-run", design="canaries", claimed_epsilon=1.0)
    claim = {"epsilon": 1.0, "delta": 1e-5}
    with pytest.raises(InputError, match=r"AuditRecord\(attack, description, result\)"):
        headline([result.to_dict()], claim)
    assert headline([AuditRecord("canaries", "mine", result).to_dict()], claim).text.startswith("violation")


def test_gradient_canaries_refuse_parameters_given_as_shapes():
    """``GradientCanaries(dict(model.named_parameters()), ...)`` (the parameters, not their shapes) raised torch's
    bare ValueError "only one element tensors can be converted to Python scalars"."""
    model = torch.nn.Linear(5, 3)
    kw = {"count": 4, "sample_rate": 0.1, "clip": 1.0, "seed": 0}
    with pytest.raises(InputError, match=r"param_shapes\['weight'\] must be a shape \(p\.shape\), got Parameter"):
        GradientCanaries(dict(model.named_parameters()), **kw)
    ok = GradientCanaries({n: p.shape for n, p in model.named_parameters()}, **kw)
    assert ok.param_shapes == {"weight": (3, 5), "bias": (3,)}
    with pytest.raises(InputError, match=r"param_shapes\['w'\] must be a shape"):  # a size below 0 is no shape
        GradientCanaries({"w": (3, -5)}, **kw)


# --- Global state a notebook relies on: torch's default generator and thread count survive every library call ---

_TINY = "synthetic:n=300,d=5,classes=2,seed=1"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A logistic regression trained for one epoch (a second of training)."""
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    out = tmp_path_factory.mktemp("lib") / "run"
    spec = default_spec("logreg", input_shape=(5,), n_classes=2)
    train_run(load_dataset(_TINY), spec, TrainConfig(epochs=1, batch_size=32), out=out)
    return out


@pytest.fixture
def notebook_torch():
    """The user's torch: two threads and a generator of their own, both put back after the test."""
    threads, state = torch.get_num_threads(), torch.get_rng_state()
    torch.set_num_threads(2)
    torch.manual_seed(1234)
    yield
    torch.set_num_threads(threads)
    torch.set_rng_state(state)


def _plugin_trainer(X, y, seed):
    return {"1.weight": torch.zeros(2, X.shape[1]), "1.bias": torch.zeros(2)}


_CALLS = itertools.count()


def _failing_trainer(X, y, seed):
    """Fails at every fourth call, which falls inside the audit's runs, after dpaudit's checks of the trainer (a bare
    torch.set_num_threads(1) in the runs fails this case too)."""
    if next(_CALLS) % 4 == 3:
        raise RuntimeError("the user's bug")
    return _plugin_trainer(X, y, seed)


def _teacher_votes_call():
    from dpaudit.data import Identity, load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.pate import pate_votes

    ds = load_dataset(_TINY)
    spec = default_spec("logreg", input_shape=(5,), n_classes=2)
    X = ds.X[:4].astype(np.float32)
    return pate_votes(ds, np.arange(60), [np.arange(30)], spec, TrainConfig(epochs=1, batch_size=16), Identity(), X)


def _audit_training_call(trainer):
    from dpaudit.models import default_spec
    from dpaudit.workflows import audit_training

    spec = default_spec("logreg", input_shape=(5,), n_classes=2)
    return audit_training(_TINY, spec, runs=2, train_size=40, trainer=trainer, claimed_epsilon=1.0, delta=1e-5)


def _calls(run_dir):
    from dpaudit.checkpoint import load_run
    from dpaudit.training.cloak import CloakConfig, train_cloak

    return {
        # a bare torch.manual_seed(config.seed) reset the caller's generator: their next draws repeated
        "train_cloak": lambda: train_cloak(load_run(run_dir), CloakConfig(lam=1.0, epochs=1)),
        # the model built before its weights were loaded drew its initialisation from the caller's generator
        "load_run": lambda: load_run(run_dir),
        # joblib runs workers=1 jobs in this process: torch.set_num_threads(1) stayed for the session
        "audit_training": lambda: _audit_training_call(_plugin_trainer),
        "audit_training, the trainer raising": lambda: _audit_training_call(_failing_trainer),
        "pate_votes": _teacher_votes_call,
        # the check that the factory builds drew the model's initialisation from the caller's generator
        "read_model_spec": lambda: _read_python_spec(run_dir.parent),
    }


def _read_python_spec(directory):
    from dpaudit.models import read_model_spec

    spec = {"kind": "python", "factory": "tests.core.byo_models:residual_mlp", "kwargs": {"d": 5, "n_classes": 2},
            "input_shape": [5], "n_classes": 2}  # fmt: skip
    (directory / "spec.json").write_text(json.dumps(spec))
    return read_model_spec(directory / "spec.json")


_STATE_CALLS = (
    "train_cloak",
    "load_run",
    "audit_training",
    "audit_training, the trainer raising",
    "pate_votes",
    "read_model_spec",
)


@pytest.mark.parametrize("name", _STATE_CALLS)
def test_library_calls_leave_torchs_generator_and_thread_count_as_the_caller_set_them(name, tiny_run, notebook_torch):
    """torch.manual_seed(1234); <library call>; torch.rand(3) must draw what it draws without the call, and the
    thread count must be the caller's (also when the call raises)."""
    state = torch.get_rng_state()
    try:
        _calls(tiny_run)[name]()
    except InputError as e:
        assert name.endswith("raising") and "the user's bug" in str(e), e
    else:
        assert not name.endswith("raising")
    assert torch.get_num_threads() == 2, name
    assert torch.equal(torch.get_rng_state(), state), f"{name} moved torch's global generator"


def test_one_torch_thread_trains_on_one_thread_and_gives_the_callers_back(notebook_torch):
    """models.one_torch_thread: one thread inside (the same weights on any machine), the caller's two after, also
    when the body raises. Planted (mutation pass 23): set_num_threads(1) dropped or 2 -> fails."""
    from dpaudit.models import one_torch_thread

    with one_torch_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(KeyError), one_torch_thread():
        assert torch.get_num_threads() == 1
        raise KeyError("the user's bug")
    assert torch.get_num_threads() == 2


def test_audit_checkpoint_takes_a_loaded_run_as_the_attacks_do(tiny_run):
    """``audit_checkpoint(load_run(d))`` raised TypeError "expected str, bytes or os.PathLike object, not Run"."""
    from dpaudit.checkpoint import load_run
    from dpaudit.workflows import audit_checkpoint

    by_path = audit_checkpoint(tiny_run, attacks="loss").to_dict()
    assert audit_checkpoint(load_run(tiny_run), attacks="loss").to_dict() == by_path


def test_a_torch_model_behind_the_prediction_api_and_its_box():
    """``PredictionAPI(lambda X: model(torch.as_tensor(X)), ...)`` (a forward without no_grad) and a feature box or
    an equation fit of torch tensors that require grad raised torch's RuntimeError "Can't call numpy() on Tensor
    that requires grad"."""
    from attacks import ApiMode, EquationSolver, FeatureBox, PredictionAPI

    model = torch.nn.Linear(4, 3).double()
    api = PredictionAPI(lambda X: model(torch.as_tensor(X, dtype=torch.float64)), mode="logits", n_classes=3,
                        feature_shape=(4,), input_dtype=np.float64)  # fmt: skip
    X = np.random.default_rng(0).random((5, 4))
    with torch.no_grad():
        expected = model(torch.as_tensor(X)).numpy()
    np.testing.assert_array_equal(api.query(torch.tensor(X, requires_grad=True)), expected)
    assert api.queries_used == 5
    box = FeatureBox.of(torch.tensor(X, requires_grad=True))
    np.testing.assert_array_equal(box.lower, X.min(axis=0))
    probs = torch.softmax(model(torch.as_tensor(X)), dim=1)  # requires grad
    solver = EquationSolver(ApiMode("probs")).fit(torch.as_tensor(X), probs)
    found = solver.decision_function(torch.tensor(X, requires_grad=True))
    np.testing.assert_allclose(found - found[:, -1:], expected - expected[:, -1:], atol=1e-9)


def test_mi_face_inverts_a_float32_torch_model_and_refuses_a_class_it_does_not_have():
    """White-box MI-FACE on a float32 module (as torch trains it) raised torch's "mat1 and mat2 must have the same
    dtype"; black-box on a torch forward raised "Can't call numpy() on Tensor that requires grad"; a label past the
    model's classes raised a bare IndexError."""
    import copy

    from attacks.inversion import MIFace

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Softmax(dim=1))
    X = np.random.default_rng(0).random((20, 4))
    wide = MIFace(iterations=20, restarts=2).fit(X).invert(copy.deepcopy(model).double(), 1)
    narrow = MIFace(iterations=20, restarts=2).fit(X).invert(model, 1)
    assert model[0].weight.dtype == torch.float32 and model[0].weight.grad is None
    np.testing.assert_allclose(narrow.x, wide.x, atol=1e-5)  # the float32 forward: float32's rounding apart
    black = MIFace(iterations=3, restarts=1, black_box=True, budget=200)
    assert black.fit(X).invert(lambda x: model(torch.as_tensor(x, dtype=torch.float32)), 1).x.shape == (4,)
    with pytest.raises(InputError, match=r"probabilities with class 3, got \(2, 3\)"):
        MIFace(iterations=5, restarts=2).fit(X).invert(model, 3)
    with pytest.raises(InputError, match="expected label to be a class index"):
        MIFace(iterations=5).fit(X).invert(model, -1)


def test_classes_given_as_one_label_or_an_array():
    """``run_inversion(run, classes=3)`` raised TypeError "'int' object is not iterable"; a 0-d tensor or a tensor
    of labels read as "tensor(3)", not a label."""
    from dpaudit.data import load_dataset

    ds = load_dataset("digits")
    for labels in (3, np.int64(3), torch.tensor(3), [3], "3"):
        assert ds.class_indices(labels) == (3,), labels
    for labels in (np.array([3, 5]), torch.tensor([3, 5]), (3, 5), "3,5"):
        assert ds.class_indices(labels) == (3, 5), labels
    with pytest.raises(InputError, match=r"'3\.5' is not a label"):
        ds.class_indices(3.5)


def test_reference_model_and_shadow_attacks_read_tensors_that_require_grad():
    """LiRA, RMIA and the shadow attack fitted on signals from a forward pass without no_grad raised torch's
    RuntimeError "Can't call numpy() on Tensor that requires grad" (the threshold scores already read them)."""
    from attacks.lira import LiRA
    from attacks.rmia import RMIA
    from attacks.shadow import ShadowAttack

    rng = np.random.default_rng(0)
    signals, in_mask, target = -rng.random((30, 16)), rng.random((30, 16)) < 0.5, -rng.random(30)
    logits, labels, member = rng.normal(size=(60, 3)), rng.integers(0, 3, 60), np.arange(60) < 30

    def grad(a):
        return torch.tensor(a, requires_grad=True)

    expected = LiRA().fit(signals, in_mask).score(target)
    np.testing.assert_array_equal(LiRA().fit(grad(signals), torch.tensor(in_mask)).score(grad(target)), expected)
    expected = RMIA().fit(signals, in_mask).score(target)
    np.testing.assert_array_equal(RMIA().fit(grad(signals), torch.tensor(in_mask)).score(grad(target)), expected)
    expected = ShadowAttack().fit(logits, labels, member).score(logits, labels)
    found = ShadowAttack().fit(grad(logits), torch.tensor(labels), torch.tensor(member)).score(grad(logits), labels)
    np.testing.assert_array_equal(found, expected)


def test_figures_leave_the_callers_matplotlib_backend(tmp_path):
    """Importing the report's figures (``render_html``) or saving an inversion grid called ``matplotlib.use("Agg")``,
    which switched a notebook's backend (``%matplotlib inline``) for the session: its ``plt.show()`` then showed
    nothing. With pyplot imported (as in a notebook) and another backend chosen, the backend is still that one after
    both (the module reloaded: its import is what switched it); this process's backend is restored afterwards."""
    import importlib

    import matplotlib
    import matplotlib.pyplot  # pyplot imported: matplotlib.use() switches the live backend

    import dpaudit.report.plots
    from attacks.inversion import InversionResult, save_grid

    before = matplotlib.get_backend()
    try:
        matplotlib.use("pdf")
        importlib.reload(dpaudit.report.plots)
        assert matplotlib.get_backend() == "pdf"
        save_grid(InversionResult((0,), np.zeros((1, 4)), ({},), 0.0, 0.0, 0.0), tmp_path / "grid.png", force=False)
        assert matplotlib.get_backend() == "pdf"
    finally:
        matplotlib.use(before)
    assert (tmp_path / "grid.png").read_bytes().startswith(b"\x89PNG")


def test_torch_generator_refuses_a_device_it_cannot_make_with_one_line():
    """``torch_generator(seed, device="cuda")`` on a machine without CUDA raised torch's RuntimeError paragraph
    ("Cannot get CUDA generator without ATen_cuda library. PyTorch splits its backend ..."); "gpu" likewise."""
    from dpaudit.seeding import torch_generator

    same = torch.randn(3, generator=torch_generator(5, device=None))
    assert torch.equal(torch.randn(3, generator=torch_generator(5)), same)
    with pytest.raises(InputError, match="expected a torch device such as 'cpu' or 'cuda', got 'gpu'"):
        torch_generator(0, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="device 'cuda' requested but no CUDA device is available"):
            torch_generator(0, device="cuda")


def test_predict_logits_gives_the_model_back_in_the_mode_it_had():
    """``predict_logits(model, X)`` (``Run.logits``' worker) left a user's model in eval mode: their next training
    step ran without its dropout."""
    from dpaudit.checkpoint import predict_logits

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.5)).train()
    X = np.ones((4, 3), np.float32)
    first = predict_logits(model, X)
    assert model.training and model[1].training
    np.testing.assert_array_equal(predict_logits(model, X), first)  # evaluated in eval mode: no dropout draw
    predict_logits(model.eval(), X)
    assert not model.training
