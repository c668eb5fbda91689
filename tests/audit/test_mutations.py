"""Mutation tests of the soundness checks: the real auditor with one planted mistake must be caught.

Each mutant replaces one internal function of the real auditor (``audit_scores`` /
``audit_mechanism``) with a version carrying one classic mistake; the fast calibrated soundness check
of :mod:`tests.audit.calibration` must count more exceedances than its allowance, on the same fixed
seeds on which the unmutated auditor stays within it. Rates measured offline with
``python -m tests.audit.calibration`` (correct p0 on 2 000-20 000 seeds disjoint from the checks';
mutant rates on up to 4 × the check's seeds):

=======================  =================  =====  ===========  =========  ==============================
mutant                   case               seeds  correct p0   allowance  mutant rate: expected count
=======================  =================  =====  ===========  =========  ==============================
(a) select on eval half  laplace-holdout    1500   57/20000     15         264/6000 = 0.044: 66 ± 7.9
(b) δ dropped            leak-delta         200    6/5000       4          799/800 = 0.999: 200 ± 0.5
(b') δ dropped, one-run  leak-one-run       100    0/2000       3          213/400 = 0.53: 53 ± 5.0
(c) α not split          leak-two-sided     2000   105/20000    27         280/8000 = 0.035: 70 ± 8.2
(d) pilot reused         null-vector-pilot  300    6/4000       6          178/1200 = 0.148: 44.5 ± 6.2
=======================  =================  =====  ===========  =========  ==============================

Each mutant's expected count is 5 or more standard deviations above the allowance ((a) 6.4 sd, (b) and
(b') far more, (c) 5.2 sd, (d) 6.3 sd), while a correct auditor exceeds the allowance with probability
< 1e-3 (see calibration.py). (c) runs at confidence 0.8: not splitting α between the two directions
doubles each direction's α, and a larger α makes that factor visible in 2000 seeds.

The whole file runs in well under a minute on one core (each check runs the correct and the mutated
auditor once; the correct counts are shared with test_soundness.py's calibrated suite in one session).
"""

from __future__ import annotations

import pytest

from .calibration import CASES, MUTANTS, correct_exceedances


@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_planted_mistake_is_caught_by_the_calibrated_check(name, monkeypatch):
    mutant = MUTANTS[name]
    case = CASES[mutant.case]
    allowance = case.allowance
    correct = correct_exceedances(case.name)  # before the mutation
    monkeypatch.setattr(mutant.target, mutant.attribute, mutant.replacement)
    mutated = case.exceedances(range(case.seeds))
    assert correct <= allowance, f"the correct auditor fails {case.name}: {correct} > {allowance}"
    assert mutated > allowance, f"{mutant.description} not caught on {case.name}: {mutated} <= {allowance}"


# --------------------------------------------------------------------------------------------------
# Planted mistakes caught by a fast targeted test (issue 27's survivors): each mutant wraps one function
# of the real code; the named test, run under the mutant, must fail. The same tests pass unmutated in
# their own files.


def _fdp_choose_on_evaluation_part(original):
    from .calibration import _choose_on_evaluation_part

    return _choose_on_evaluation_part


def _gnmax_answer_noise_halved(original):
    import dataclasses

    def aggregate(hist, config, seed):
        if config.name == "confident-gnmax":
            config = dataclasses.replace(config, sigma=config.sigma / 2)
        return original(hist, config, seed)

    return aggregate


def _objpert_delta_prime_dropped(original):
    def objpert_parameters(epsilon, n, lam, *args, **kwargs):
        return original(epsilon, n, lam, *args, **kwargs)[0], 0.0

    return objpert_parameters


def _noisymax_rerun_uncharged(original):
    def charge(self, kind, rho):
        if kind == "noisy_max" and self.charges and self.charges[-1][0] == "gradavg":
            return  # the NoisyMax re-run after GRADAVG goes unrecorded
        original(self, kind, rho)

    return charge


def _scaler_fitted_on_members(original):
    def fit_model(*args, **kwargs):
        kwargs["preprocessing_idx"] = None  # fitted on the training records, still labelled "aux"
        return original(*args, **kwargs)

    return fit_model


def _steps_left_to_each_side(original):
    import dataclasses

    def prepare(config, idx_in, idx_out):
        cfg, claim = original(config, idx_in, idx_out)
        return dataclasses.replace(cfg, steps=config.steps), claim  # each side: ceil(epochs N / B) of its own N

    return prepare


def _lira_masks_swapped(original):
    def fit_score(self, signals, in_mask, *args, **kwargs):
        return original(self, signals, ~in_mask, *args, **kwargs)

    return fit_score


def _score_provenance_ignored(original):
    import dataclasses

    def read_score_file(path):
        return dataclasses.replace(original(path), source=None)  # every file taken as the user's own

    return read_score_file


def _member_check_never_inconclusive(original):
    return 1.01  # no p-value reaches it: "the declared members look like training records" at any p


def _check(module: str, test: str, *args):
    def run(monkeypatch):
        import importlib

        fn = getattr(importlib.import_module(module), test)
        fn(*args, **({"monkeypatch": monkeypatch} if "monkeypatch" in fn.__code__.co_varnames else {}))

    return run


FAST_MUTANTS = {
    # name: (module, attribute path, make_replacement(original), the check that must fail)
    "e-fdp-select-on-eval": (
        "dpaudit.audit.fdp_one_run", "select_then_evaluate", _fdp_choose_on_evaluation_part,
        _check("tests.audit.test_fdp_one_run", "test_holdout_choice_depends_on_the_selection_part_only", "one-run-fdp"),
    ),
    "f-gnmax-answer-noise-halved": (
        "dpaudit.aggregation", "aggregate", _gnmax_answer_noise_halved,
        _check("tests.aggregation.test_confident_gnmax_noise", "test_confident_gnmax_answer_frequency_matches_phi"),
    ),
    "g-objpert-delta-prime-dropped": (
        "dpaudit.training.convex", "objpert_parameters", _objpert_delta_prime_dropped,
        _check("tests.training.test_objpert_noise_law", "test_objpert_delta_prime_branch_noise_has_its_gamma_law"),
    ),
    "h-dpagd-noisymax-rerun-uncharged": (
        "dpaudit.training.dpagd", "Ledger.charge", _noisymax_rerun_uncharged,
        _check("tests.training.test_dpagd_ledger",
               "test_every_noisy_max_run_is_charged_including_the_rerun_after_gradavg"),
    ),
    "i-scaler-fitted-on-members": (
        "dpaudit.training.run", "fit_model", _scaler_fitted_on_members,
        _check("tests.training.test_preprocessing_public", "test_dp_run_preprocessing_statistics_equal_the_aux_splits"),
    ),
    "j-in-out-steps-differ": (
        "dpaudit.workflows.training", "_prepare_recipe", _steps_left_to_each_side,
        # a non-private recipe (False): with Poisson the recipe's fixed rate alone now fixes both sides' steps
        _check("tests.workflows.test_recipe_steps", "test_in_and_out_runs_train_the_same_number_of_steps", False),
    ),
    "k-lira-masks-swapped": (
        "attacks.lira", "LiRA.fit_score", _lira_masks_swapped,
        _check("tests.attacks.test_lira_fast", "test_lira_beats_the_loss_attack_end_to_end"),
    ),
    "l-score-file-provenance-ignored": (
        "dpaudit.workflows.scores", "read_score_file", _score_provenance_ignored,
        _check("tests.audit.test_score_provenance", "test_the_readme_sequence_is_refused"),
    ),
    "m-member-check-never-inconclusive": (
        "dpaudit.training.run", "MEMBER_CHECK_ALPHA", _member_check_never_inconclusive,
        _check("tests.core.test_import_features",
               "test_member_check_says_inconclusive_when_its_test_is_not_significant"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(FAST_MUTANTS))
def test_each_planted_mistake_is_caught_by_its_fast_test(name, monkeypatch):
    import importlib

    module, attribute, make, check = FAST_MUTANTS[name]
    owner = importlib.import_module(module)
    *path, leaf = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    monkeypatch.setattr(owner, leaf, make(getattr(owner, leaf)))
    with pytest.raises(AssertionError):
        check(monkeypatch)
