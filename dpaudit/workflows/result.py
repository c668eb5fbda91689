"""Result objects of the audit workflows, and the headline every renderer shows.

An :class:`AuditRecord` is one audit of one model: where its scores came from and its
:class:`~dpaudit.audit.AuditResult`. :func:`headline` turns a model's audits into its summary — the
strongest *formal* bound with that audit's own verdict, the strongest estimate beside it — and works
on plain dicts, so the CLI (on fresh results) and the report (on its JSON) share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit import numfmt
from dpaudit.audit import AuditResult, clopper_pearson_lower, clopper_pearson_upper, decide_verdict
from dpaudit.audit.result import VERDICTS, tests_formally
from dpaudit.errors import InputError


@dataclass(frozen=True)
class AuditRecord:
    """One audit of one model.

    ``attack`` names the scores' origin ("canaries", "loss", "lira", "multi-run", ...); ``index`` is
    the position of the attack's result in the model's membership attacks (None for canaries and
    multi-run audits, which have no attack entry); ``description`` says in words what was audited.
    """

    attack: str
    description: str
    result: AuditResult
    family: str = "membership"
    index: int | None = None
    threat_model: str | None = None  # None: the default of the scores' origin (:func:`threat_model`)

    @property
    def formal(self) -> bool:
        return self.result.formal

    def to_dict(self) -> dict[str, Any]:
        """The report's audit entry: ``source`` (family, attack, index), ``description``, ``threat_model``
        and the result."""
        d = {
            "source": {"family": self.family, "attack": self.attack, "index": self.index},
            "description": self.description,
            **self.result.to_dict(),
        }
        d["threat_model"] = self.threat_model or threat_model(d)
        return d


# What the auditor sees and how many trainings the bound rests on, by the scores' origin. Bounds under
# different threat models answer different questions (a white-box bound reads every noisy update, a
# black-box one only the final model), so they are labelled and never compared without their label.
THREAT_MODELS = {
    "canaries": "black-box, one run",
    "icl-canaries": "black-box, one run",
    "whitebox-canaries": "white-box, one run",
    "gradient-canaries": "white-box, one run",
    "white-box-steps": "white-box, one run",
    "multi-run": "black-box, many runs",
}


def threat_model(audit: Mapping[str, Any]) -> str:
    """An audit entry's threat model: its own ``threat_model``, else the default of its scores' origin
    (:data:`THREAT_MODELS`); membership scores of a model's own members are "black-box, model's members"."""
    if audit.get("threat_model"):
        return str(audit["threat_model"])
    return THREAT_MODELS.get(audit["source"]["attack"], "black-box, model's members")


def _num(x: Any) -> float | None:
    return None if x is None else float(x)  # the report spells ∞ as "inf"; float() reads it back


def _shown(
    claim: float | None, lowers: Sequence[float | None], uppers: Sequence[float | None] = ()
) -> tuple[str, list[str], list[str]]:
    """A claim and the bounds the headline prints beside it (lower bounds rounded down, upper bounds such as
    "certifies at most" rounded up, at 3 significant digits; the claim rounded up at 6): the claim printed ONCE,
    and every bound with digits enough to compare with that one printed claim as the numbers do
    (:func:`dpaudit.numfmt.against`), so the formal part and the estimate part of one headline never read
    "claimed 2 …; estimate ε ≥ 1.999996 exceeds the claim"; "?" for a missing number."""
    if claim is None:
        return "?", [numfmt.lower(x, 3, missing="?") for x in lowers], [numfmt.upper(x, 3, missing="?") for x in uppers]
    claimed, lo, up = numfmt.against(claim, lowers, uppers, digits=3)
    fix = lambda xs, texts: ["?" if x is None else t for x, t in zip(xs, texts, strict=True)]  # noqa: E731
    return claimed, fix(lowers, lo), fix(uppers, up)


def _pick(audits: Sequence[Mapping[str, Any]], formal: bool) -> tuple[int, Mapping[str, Any]] | None:
    """The strongest audit of one kind: the largest lower bound; among equal bounds the most powerful design.
    A claim-curve audit (``refutation`` set) is neither: its formal result is the curve refutation, which the
    headline names on its own, and its ε is not an attack's estimate."""
    pool = [(i, a) for i, a in enumerate(audits) if bool(a["formal"]) == formal and not a.get("refutation")]
    if not pool:
        return None
    return max(
        pool,
        key=lambda ia: (_num(ia[1]["epsilon_lower_bound"]), _num(ia[1].get("max_certifiable_epsilon")) or 0.0),
    )


def _digest(i: int, a: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "audit_index": i,
        "attack": a["source"]["attack"],
        "method": a["method"],
        "confidence": a["confidence"],
        "epsilon_lower_bound": a["epsilon_lower_bound"],
        "max_certifiable_epsilon": a.get("max_certifiable_epsilon"),
        "claimed_epsilon": a.get("claimed_epsilon"),
        "verdict": a.get("verdict"),
        "threat_model": threat_model(a),
    }


@dataclass(frozen=True)
class Headline:
    """A model's summary. ``verdict`` is the strongest formal audit's own verdict (None without a claim
    or without a formal audit), or "curve-refuted" when no formal ε bound refutes the claim but an audit
    refuted the claimed trade-off curve; ``estimate_verdict`` the strongest estimate's, never a violation."""

    verdict: str | None
    estimate_verdict: str | None
    formal: dict[str, Any] | None
    estimate: dict[str, Any] | None
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "estimate_verdict": self.estimate_verdict,
            "formal": self.formal,
            "estimate": self.estimate,
            "headline": self.text,
        }


def headline(
    audits: Sequence[Mapping[str, Any]],
    claim: Mapping[str, Any] | None,
    checks: Sequence[Mapping[str, Any]] = (),
) -> Headline:
    """The summary of a model's audits (dicts as :meth:`AuditRecord.to_dict` makes them).

    Each audit is judged against the ε it was audited against (``claimed_epsilon``), else the model's
    ``claim``. The headline bound is the strongest formal one with that audit's own verdict; an estimate never
    sets the verdict and sits beside it, labelled. A model without a claim gets what was demonstrated
    ("leaks: ε ≥ 1.16 shown") instead of a verdict. ``checks``: formal tests of the claimed mechanism that
    bound no ε (the noise check, as :func:`dpaudit.workflows.hooks_audit.noise_check_entry` writes it); one
    that rejects the claim makes the verdict "violation", named as what it is.
    """
    for a in audits:  # an AuditResult (or its dict) has no source: one line, not KeyError 'source'
        if not isinstance(a, Mapping) or "source" not in a:
            raise InputError(
                "headline() takes audit entries as AuditRecord.to_dict() makes them; wrap an AuditResult as "
                "AuditRecord(attack, description, result).to_dict()"
            )
    # An audit run without a claim is read against the model's (as the report does, :func:`effective_verdict`): its
    # own verdict is None, and the text read "inconclusive: ε ≥ 3.3; this design certifies at most 3.37 ≤ claimed 1"
    # for a formal bound above the claim (verdict None), and an estimate above it went without "exceeds the claim".
    audits = [{**a, "verdict": effective_verdict(a, claim)} for a in audits]
    f = _pick(audits, formal=True)
    e = _pick(audits, formal=False)
    formal = _digest(*f) if f else None
    estimate = _digest(*e) if e else None
    c = ce = None  # the ε each is read against: its own claimed ε, else the model's
    if formal is not None:
        c = _num(formal["claimed_epsilon"])
        c = _num(claim["epsilon"]) if c is None and claim is not None else c
    if estimate is not None:
        ce = _num(estimate["claimed_epsilon"])
        ce = _num(claim["epsilon"]) if ce is None and claim is not None else ce
    eb = None if estimate is None else _num(estimate["epsilon_lower_bound"])
    estimate_shown: str | None = None
    parts = []
    # Formal tests that bound no ε: refutation tests of the claimed curve (e.g. the per-step audit of canaries
    # with a fresh coin per step, against ONE step's curve) and checks of the claimed mechanism (the noise check).
    curve_tests = [a for a in audits if a.get("refutation")]
    formal_checks = [c for c in checks if c.get("formal")]
    if formal is None and (curve_tests or formal_checks):
        parts.append(_tests_text(curve_tests, formal_checks))
    elif formal is None and any(a.get("design") == "canaries" for a in audits):
        # the run has canaries, audited as an estimate (e.g. a replace-one claim against add/remove canaries)
        parts.append("no formal audit (its canary audit is an estimate; its note says why)")
    elif formal is None:
        parts.append("no formal audit (train with canaries, or run `dpaudit audit train`)")
    else:
        b, m = _num(formal["epsilon_lower_bound"]), _num(formal["max_certifiable_epsilon"])
        how = (
            f"formal, {formal['attack']}, {formal['method']}, {formal['threat_model']}, "
            f"{numfmt.percent_down(formal['confidence'])} confidence"
        )
        if c is None:
            parts.append(
                f"leaks: ε ≥ {numfmt.lower(b, missing='?')} shown ({how})"
                if b and b > 0
                else f"no leakage shown ({how}; this design certifies at most ε = {numfmt.upper(m, 3, missing='?')})"
            )
        else:
            v = formal["verdict"]
            # One printed claim for every bound beside it, the estimate's too when it is read against the same ε.
            same = estimate is not None and ce == c
            claimed, (bound, *est), (most,) = _shown(c, [b, eb] if same else [b], [m])
            if same:
                estimate_shown = est[0]
            if v == "violation":
                parts.append(f"violation: ε ≥ {bound} > claimed {claimed} ({how})")
            elif v == "consistent":
                parts.append(f"consistent: ε ≥ {bound} ≤ claimed {claimed} ({how}; could certify up to {most})")
            else:
                parts.append(
                    f"inconclusive: ε ≥ {bound}; this design certifies at most {most} ≤ claimed {claimed} ({how})"
                )
    verdict = formal["verdict"] if formal else None
    if verdict is None and claim is not None and (curve_tests or formal_checks):
        # The verdict of formal tests that refute nothing (as :func:`dpaudit.workflows.hooks_audit.audit_canaries`
        # decides it): inconclusive when every curve test was too weak to refute the claimed curve and no
        # check ran, else consistent. A refutation below overrides it.
        weak = all(a.get("verdict") == "inconclusive" for a in curve_tests) and not formal_checks
        verdict = "inconclusive" if weak else "consistent"
    # A formal refutation of the claimed trade-off curve (one-run f-DP against the claim's own curve
    # family) is named as what it is, and sets the verdict unless a formal ε bound already refutes the claim.
    rejected = [c for c in checks if c.get("formal") and c.get("verdict") == "violation"]
    if rejected and verdict != "violation":
        verdict = "violation"
        parts.insert(0, f"violation: {rejected[0]['statement']}")
    curve = [a for a in audits if a.get("verdict") == "curve-refuted" and a.get("refutation")]
    if curve and verdict != "violation":
        a = curve[0]
        verdict = "curve-refuted"
        parts.append(
            f"curve refuted: {a['refutation']['statement']} (formal, {a['source']['attack']}, {a['method']}, "
            f"{numfmt.percent_down(a['confidence'])} confidence)"
        )
    estimate_verdict = estimate["verdict"] if estimate else None
    if estimate is not None:
        # Beside its claim, with digits enough to compare as computed: "exceeds the claim" never follows a bound
        # printed below it (7.99 for 7.999957 > 7.999954), nor a claim printed above it.
        if estimate_shown is None:
            estimate_shown = _shown(ce, [eb])[1][0]
        what = f"estimate ε ≥ {estimate_shown} ({estimate['attack']}, {estimate['method']})"
        if estimate["verdict"] == "estimate-exceeds-claim":
            what += " exceeds the claim — an estimate, not a formal violation"
        parts.append(what)
    else:  # a per-step audit's composed ε (whitebox.steps_record) is the only estimate of the whole run's ε
        composed = [a for a in curve_tests if (a.get("details") or {}).get("composed_epsilon_estimate") is not None]
        if composed:
            d = composed[0]["details"]
            claimed, (est,), _ = _shown(_num(d.get("composed_claimed_epsilon")), [_num(d["composed_epsilon_estimate"])])
            what = (
                f"estimate ε ≥ {est} composed over all steps vs claimed {claimed} "
                f"({d.get('composed_label', 'estimate')})"
            )
            if d.get("composed_verdict") == "estimate-exceeds-claim":
                what += " exceeds the claim — an estimate, not a formal violation"
            parts.append(what)
            estimate_verdict = d.get("composed_verdict")
    return Headline(
        verdict=verdict,
        estimate_verdict=estimate_verdict,
        formal=formal,
        estimate=estimate,
        text="; ".join(parts),
    )


def _tests_text(curve_tests: Sequence[Mapping[str, Any]], checks: Sequence[Mapping[str, Any]]) -> str:
    """What formal tests that bound no ε showed, when no formal ε bound exists, in words: each curve test's
    statement (with its audit and confidence) and each check's statement; refutations are named elsewhere."""
    texts = [
        f"{a['refutation']['statement']} (formal, {a['source']['attack']}, {a['method']}, {threat_model(a)}, "
        f"{numfmt.percent_down(a['confidence'])} confidence)"
        for a in curve_tests
        if a.get("verdict") != "curve-refuted"  # a refutation is named by the headline on its own
    ]
    return "; ".join(
        ["no formal ε bound"] + texts + [str(c["statement"]) for c in checks if c["verdict"] != "violation"]
    )


def clopper_pearson_interval(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided Clopper–Pearson interval for a binomial proportion k/n (Clopper & Pearson 1934).

    Each end is a one-sided bound at level (1 − confidence)/2, so the pair covers with probability
    ≥ confidence; the one-sided bounds are the audit layer's (:mod:`dpaudit.audit.stats`).
    """
    if n <= 0 or not 0 <= k <= n:
        raise InputError(f"expected 0 <= k <= n with n > 0, got k={k}, n={n}")
    tail = (1.0 - confidence) / 2
    return float(clopper_pearson_lower(k, n, tail)), float(clopper_pearson_upper(k, n, tail))


def operating_point(counts: Mapping[str, Any] | None, confidence: float) -> dict[str, Any] | None:
    """(FPR, FNR) at the audit's threshold with per-coordinate Clopper–Pearson intervals.

    FPR = fp / (fp + tn), FNR = fn / (fn + tp). Each interval has two-sided coverage ``confidence``;
    the box they span covers both rates jointly with probability ≥ 2·confidence − 1 (Bonferroni).
    None when the counts are missing or a class is empty.
    """
    if not counts or any(counts.get(k) is None for k in ("tp", "fp", "tn", "fn")):
        return None
    tp, fp, tn, fn = (int(counts[k]) for k in ("tp", "fp", "tn", "fn"))
    if fp + tn == 0 or fn + tp == 0:
        return None
    return {
        "fpr": fp / (fp + tn),
        "fnr": fn / (fn + tp),
        "fpr_interval": list(clopper_pearson_interval(fp, fp + tn, confidence)),
        "fnr_interval": list(clopper_pearson_interval(fn, fn + tp, confidence)),
        "confidence": confidence,
    }


def check_verdict(audit: Mapping[str, Any]) -> None:
    """Refuse an audit entry (a dict, as in a report.json from elsewhere) whose own verdict contradicts its own
    numbers, as :func:`~dpaudit.audit.decide_verdict` decides it: "violation" only for a formal bound above the
    claimed ε, "estimate-exceeds-claim" only for an estimate above it, "consistent" / "inconclusive" only for a bound
    at or below it. A report would otherwise print "ε ≥ 5 | claimed 1 | consistent". Audits that test the claimed
    curve (``refutation``) are decided by that test, not by these numbers, and are left to it. A verdict
    none of these rules gives (not one of :data:`~dpaudit.audit.result.VERDICTS`, or "curve-refuted" on an entry that
    refutes no curve) is refused too: the headline would otherwise print it under the "inconclusive" text."""
    verdict, claimed = audit.get("verdict"), _num(audit.get("claimed_epsilon"))
    if verdict is not None and (
        verdict not in VERDICTS or (verdict == "curve-refuted" and not audit.get("refutation"))
    ):
        where = f"audit {audit.get('source', {}).get('attack', '?')} / {audit.get('method', '?')}"
        why = "refutes no curve (no refutation)" if verdict in VERDICTS else f"is none of {', '.join(VERDICTS)}"
        raise InputError(f"{where} reads {verdict!r}, which {why}: a verdict no rule of dpaudit gives")
    if verdict is None or claimed is None or audit.get("refutation"):
        return
    bound, formal = _num(audit["epsilon_lower_bound"]), bool(audit["formal"])
    above = {"violation": True, "estimate-exceeds-claim": True, "consistent": False, "inconclusive": False}.get(verdict)
    wrong_kind = (verdict == "violation" and not formal) or (verdict == "estimate-exceeds-claim" and formal)
    if above is not None and (wrong_kind or (bound > claimed) != above):
        kind = "formal" if formal else "estimate"
        raise InputError(
            f"audit {audit['source']['attack']} / {audit['method']} ({kind}) reads {verdict!r}, but its bound "
            f"{numfmt.exact(bound)} is {'above' if bound > claimed else 'not above'} its claimed ε "
            f"{numfmt.exact(claimed)}: a verdict that contradicts its own numbers"
        )


def effective_verdict(audit: Mapping[str, Any], claim: Mapping[str, Any] | None) -> str | None:
    """The verdict an audit entry (a dict, as in a report) is read with: its own, or when it was run
    without a claim, the one :func:`~dpaudit.audit.decide_verdict` gives against the model's ``claim``
    (unknown power counts as none). None when neither has a claim."""
    if audit.get("verdict") is not None or claim is None:
        return audit.get("verdict")
    power = _num(audit.get("max_certifiable_epsilon"))
    return decide_verdict(
        _num(audit["epsilon_lower_bound"]), _num(claim["epsilon"]), power or 0.0, formal=bool(audit["formal"]),
        refutes_curve=audit.get("refutation") is not None,
    )  # fmt: skip


@dataclass(frozen=True, eq=False)
class ModelAudit:
    """Everything the workflow found about one checkpoint: its claim, membership attacks and audits."""

    path: Path
    name: str
    meta: dict[str, Any] = field(repr=False)
    attacks: tuple = ()  # attacks.result.AttackResult, in the order of the attack names asked for
    audits: tuple[AuditRecord, ...] = ()
    families: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # other attack families' results

    @property
    def claim(self) -> dict[str, Any] | None:
        return self.meta.get("privacy")

    def headline(self) -> Headline:
        return headline([a.to_dict() for a in self.audits], self.claim)

    @property
    def cannot_refute(self) -> bool:
        """True when the model has formal tests of its claim (ε bounds or claim-curve refutations) and every one
        is "inconclusive": none of them could refute the claim whatever the model does."""
        tests = [a.result for a in self.audits if tests_formally(a.result)]
        return bool(tests) and all(r.verdict == "inconclusive" for r in tests)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: path, claim, headline, audits and attack metrics (no ROC curves)."""
        return {
            "checkpoint": str(self.path),
            "name": self.name,
            "claim": self.claim,
            **self.headline().to_dict(),
            "audits": [a.to_dict() for a in self.audits],
            "attacks": [r.to_dict(include_roc=False) for r in self.attacks],
            **({"families": self.families} if self.families else {}),
        }

    def summary(self) -> str:
        """Human-readable lines: the headline, then each audit's own summary."""
        lines = [f"{self.name}: {self.headline().text}"]
        for a in self.audits:
            lines += ["", f"[{a.attack}] {a.description}", a.result.summary()]
        return "\n".join(lines)


@dataclass(frozen=True, eq=False)
class TrainingAudit:
    """A multi-run audit: ``runs`` trainings with the canary and ``runs`` without, one score each
    (``scores[i]`` of run i, higher = canary included; ``member[i]`` whether run i had the canary).
    ``trainer``: the plug-in trainer that trained the runs (``"module:function"``), None for dpaudit's own."""

    audit: AuditRecord
    threat_model: str
    runs: int
    claim: dict[str, Any] | None
    neighbouring: str  # the experiment's relation: "add_remove" (D ∪ {c} vs D) or "replace_one" (vs D ∪ {z})
    scores: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    member: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, bool))
    trainer: str | None = None
    audits: tuple[AuditRecord, ...] = ()  # with several scores: one record per score (``audit`` is the strongest)

    @property
    def result(self) -> AuditResult:
        return self.audit.result

    def to_dict(self) -> dict[str, Any]:
        return {
            "threat_model": self.threat_model,
            "runs": self.runs,
            "trainer": self.trainer,
            "neighbouring": self.neighbouring,
            "claim": self.claim,
            "scores": self.scores.tolist(),
            "member": self.member.tolist(),
            **self.audit.to_dict(),
            **({"score_audits": [a.to_dict() for a in self.audits]} if self.audits else {}),
        }

    def summary(self) -> str:
        return f"source: {self.audit.description}\n" + self.result.summary()
