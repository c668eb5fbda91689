"""Empirical privacy auditing: membership/attack scores in, ε lower bounds and verdicts out.

Pure numpy/scipy. Start with :func:`audit_scores` (say how the member bits were produced with
``design``: only Clopper–Pearson on independent runs and the one-run method on canaries are formal);
:func:`trials_needed` says how large a design must be to refute a claim at all;
:mod:`dpaudit.testing` wraps the auditor for users' pytest suites and :mod:`dpaudit.audit.selftest`
checks the auditor itself.
"""

from dpaudit.audit.bounds import audit_scores, check_audit_claim, max_certifiable_epsilon
from dpaudit.audit.one_run import one_run_epsilon_lower_bound, one_run_p_value
from dpaudit.audit.plan import DesignPlan, plan_design, trials_needed
from dpaudit.audit.result import ALTERNATIVES, DESIGNS, VERDICTS, AuditResult, decide_verdict, is_formal
from dpaudit.audit.stats import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    gdp_mu_lower_bound,
    hypothesis_test_epsilon,
)

__all__ = [
    "ALTERNATIVES",
    "DESIGNS",
    "VERDICTS",
    "AuditResult",
    "DesignPlan",
    "audit_scores",
    "check_audit_claim",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "decide_verdict",
    "gdp_mu_lower_bound",
    "hypothesis_test_epsilon",
    "is_formal",
    "max_certifiable_epsilon",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
    "plan_design",
    "trials_needed",
]
