"""Audit workflows: the one place where attacks, audits and claims meet.

The CLI (``dpaudit audit checkpoint|train``, ``dpaudit report``), the report builder and the demo all
call these functions with the same defaults (:data:`DEFAULTS`), so one checkpoint gets one answer
wherever it is asked. They return result objects (:class:`ModelAudit`, :class:`TrainingAudit`);
renderers turn those into text, JSON or a report entry and never run attacks themselves.

- :func:`audit_checkpoint`: a formal one-run audit of a run's canaries (Steinke, Nasr & Jagielski
  2023, arXiv:2305.08846) when it was trained with them, plus membership-attack *estimates* on its
  members vs holdout records.
- :func:`audit_training`: the multi-run audit (Jagielski et al. 2020, arXiv:2006.07709; Nasr et
  al. 2021, arXiv:2101.04535): R runs with a canary and R without, of exactly the pipeline the
  claim covers.
- :func:`headline`: a model's summary: its strongest *formal* bound with that audit's own verdict,
  the strongest estimate beside it, labelled.
"""

from dpaudit.workflows.checkpoint import DEFAULTS, AuditDefaults, audit_checkpoint, canary_scores, membership_attacks
from dpaudit.workflows.result import AuditRecord, Headline, ModelAudit, TrainingAudit, headline
from dpaudit.workflows.training import audit_training

__all__ = [
    "DEFAULTS",
    "AuditDefaults",
    "AuditRecord",
    "Headline",
    "ModelAudit",
    "TrainingAudit",
    "audit_checkpoint",
    "audit_training",
    "canary_scores",
    "headline",
    "membership_attacks",
]
