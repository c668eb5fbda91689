"""Empirical privacy auditing: membership/attack scores in, ε lower bounds and verdicts out.

Pure numpy/scipy. Start with :func:`audit_scores`; :mod:`dpaudit.testing` wraps it for users'
pytest suites and :mod:`dpaudit.audit.selftest` checks the auditor itself.
"""

from dpaudit.audit.bounds import audit_scores, max_certifiable_epsilon
from dpaudit.audit.one_run import one_run_epsilon_lower_bound, one_run_p_value
from dpaudit.audit.result import AuditResult, decide_verdict
from dpaudit.audit.stats import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    gdp_mu_lower_bound,
    hypothesis_test_epsilon,
)

__all__ = [
    "AuditResult",
    "audit_scores",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "decide_verdict",
    "gdp_mu_lower_bound",
    "hypothesis_test_epsilon",
    "max_certifiable_epsilon",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
]
