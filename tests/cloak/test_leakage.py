"""Leakage of cloaked releases: attacks beat chance on clean inputs and degrade as suppression rises."""

from __future__ import annotations

import itertools

import pytest

from tests.cloak.conftest import LAMBDAS, NOISE_FEATURE


@pytest.fixture(scope="module")
def leakage(tiny_cloaks, tiny_target):
    from attacks.cloak import run_cloak_leakage

    return {lam: run_cloak_leakage(c, tiny_target, feature=NOISE_FEATURE).to_dict() for lam, c in tiny_cloaks.items()}


def test_attacks_beat_chance_on_clean_inputs(leakage):
    """On clean inputs the attribute (x_6 above its median) is read off almost perfectly and the decoder is
    (near) the identity; 120 test records: an AUC of 0.5 has s.e. ~0.05, so 0.9 is far above chance."""
    for r in leakage.values():
        a, rec = r["attribute"], r["reconstruction"]
        assert a["clean_auc"] > 0.9 and a["clean_accuracy"] > a["baseline_accuracy"] + 0.2
        assert rec["mse_clean"] < 0.01 * rec["mse_mean_baseline"]


def test_attacks_degrade_as_suppression_rises(leakage, tiny_cloaks):
    """x_6 is independent of every other feature, so once it is drowned nothing else reveals it: at the
    smallest lambda (x_6 suppressed) the AUC is within chance (0.5 +- 3 s.e.), at the largest it is not."""
    lo, hi = LAMBDAS[0], LAMBDAS[-1]
    assert tiny_cloaks[lo].relative_sigma().ravel()[NOISE_FEATURE] >= 1.0
    assert abs(leakage[lo]["attribute"]["cloaked_auc"] - 0.5) < 0.15
    assert leakage[hi]["attribute"]["cloaked_auc"] > 0.85
    errs = [leakage[lam]["reconstruction"]["relative_error"] for lam in LAMBDAS]
    assert all(a >= b - 0.05 for a, b in itertools.pairwise(errs))
    assert errs[0] - errs[-1] > 0.3
    assert all(0 < e < 1.1 for e in errs)


def test_leakage_result_is_plain_json_and_renders(leakage):
    import json

    from dpaudit.report import html, markdown, plots

    r = leakage[LAMBDAS[0]]
    json.dumps(r, allow_nan=False)
    assert r["attack"] == "cloak" and len(r["sigma_map"]) == len(r["per_feature_epsilon"]) == 8
    assert plots.png(lambda: plots.cloak_figure(r)).startswith(b"\x89PNG")
    assert "Cloak noise per feature" in html._other_family([r])
    assert "suppression\\_ratio" in "\n".join(markdown._other_family([r]))


def test_report_family_runner(tiny_target, tiny_cloaks, tmp_path):
    """The "cloak" family: a saved cloak for this run is measured; one for another model is refused."""
    import dataclasses

    from dpaudit.errors import InputError
    from dpaudit.progress import NULL_PROGRESS
    from dpaudit.training.cloak import save_cloak
    from dpaudit.workflows.checkpoint import FAMILY_RUNNERS

    c = tiny_cloaks[LAMBDAS[1]]
    path = save_cloak(tmp_path / "c", c)
    out = FAMILY_RUNNERS["cloak"](tiny_target, {"cloak": str(path)}, 0, NULL_PROGRESS)
    assert out["lambda"] == LAMBDAS[1] and out["suppression_ratio"] == c.meta["metrics"]["suppression_ratio"]
    other = dataclasses.replace(c, meta={**c.meta, "target": {**c.meta["target"], "weights_sha256": "0" * 64}})
    save_cloak(tmp_path / "o", other)
    with pytest.raises(InputError, match="another model"):
        FAMILY_RUNNERS["cloak"](tiny_target, {"cloak": str(tmp_path / "o")}, 0, NULL_PROGRESS)
