"""dpaudit called as a library, the way a notebook calls it: torch tensors that still carry autograd, counts and
rates outside their range, NaN where a verdict is decided, results printed at the end of a cell.

Bad input is one :class:`~dpaudit.errors.InputError` line (never NaN, a silent 0, or torch's RuntimeError), and a
verdict is never decided on NaN.
"""

from __future__ import annotations

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
