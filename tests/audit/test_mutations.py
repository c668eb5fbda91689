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
