"""Build, validate, load, merge and write leakage reports (the JSON is the single source of truth).

A report is plain JSON-ready data (see ``schema.json``): renderers (:mod:`dpaudit.report.markdown`,
:mod:`dpaudit.report.html`, :mod:`dpaudit.report.plots`) read only this dict and never touch runs,
attacks or audits. Everything derived here (operating points, confidence boxes, summary rows,
verdicts) is computed once, stored in the report, and rendered as is; the decisions themselves
(intervals, verdicts, the headline) are the workflows' (:mod:`dpaudit.workflows.result`): this package
imports nothing from :mod:`dpaudit.audit` or :mod:`dpaudit.training` (tests/test_architecture.py).

Non-finite numbers are spelled ``"inf"`` / ``"-inf"`` / ``"nan"`` because JSON has none; read them
back with :func:`as_float`.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np

from attacks.metrics import nonmembers_needed
from dpaudit.errors import InputError
from dpaudit.fileio import check_input_file, check_output_dir, write_atomic_dir
from dpaudit.report._data import LOW_FPR, dumps, jsonable, sha256_json
from dpaudit.validation import read_json
from dpaudit.workflows.result import (
    ModelAudit,
    check_verdict,
    effective_verdict,
    headline,
    operating_point,
    threat_model,
)

SCHEMA_VERSION = 2  # 2: summary = strongest formal audit + strongest estimate (issue 10)
REPORT_FILES = {"json": "report.json", "md": "report.md", "html": "report.html"}
ATTACK_FAMILIES = ("membership", "inversion", "extraction", "attribute", "cloak", "icl")


# --------------------------------------------------------------------------- entries


def model_entry(
    meta: Mapping[str, Any],
    *,
    name: str,
    path: str | None,
    attacks: Mapping[str, list[dict[str, Any]] | None],
    audits: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """A report model entry from a checkpoint's metadata (``checkpoint.json``) and attack/audit dicts."""
    training = {k: v for k, v in meta["training"].items() if k != "history"}
    privacy = meta.get("privacy")
    return {
        "name": name,
        "path": path,
        "model": {"kind": meta["model"]["kind"], "spec": dict(meta["model"])},
        "data": {**meta["data"], "split": meta.get("split")},
        "training": training,
        "claim": dict(privacy) if privacy else None,
        "utility": dict(meta["metrics"]),
        "attacks": dict(attacks),
        "audits": [dict(a) for a in audits],
    }


def model_entry_from(audit: ModelAudit, *, path: str | None = None) -> dict[str, Any]:
    """The report entry of a workflow result (:func:`dpaudit.workflows.audit_checkpoint`)."""
    return model_entry(
        audit.meta,
        name=audit.name,
        path=str(audit.path) if path is None else path,
        attacks={"membership": [r.to_dict(include_roc=True) for r in audit.attacks], **audit.families},
        audits=[a.to_dict() for a in audit.audits],
    )


def canary_run_entry(result: Mapping[str, Any], *, name: str | None = None, path: str | None = None) -> dict[str, Any]:
    """A report model entry from a saved gradient-canary audit of a user's own training loop
    (:meth:`dpaudit.workflows.hooks_audit.CanaryRunAudit.to_dict`, ``dpaudit audit canaries --out``): its
    formal audits, its noise check and the claim it was audited against. The model, data and utility are the
    user's and were not given to dpaudit, and the report says so."""
    claim = dict(result["claim"])
    where = str(result["canaries"])
    return {
        "name": name or Path(where).name or where,
        "path": path if path is not None else where,
        "model": {"kind": "your own training loop", "spec": {}},
        "data": {"spec": "not given to dpaudit (your own training loop)", "sha256": None},
        "training": {
            "algo": "own-loop",
            "steps": result["steps"],
            "gradient_canaries": result["count"],
            "dp": {k: claim.get(k) for k in ("noise_multiplier", "clip", "sample_rate", "sampling")},
        },
        "claim": claim,
        "utility": {"train_accuracy": None, "test_accuracy": None},
        "attacks": {"membership": None},
        "audits": [dict(a) for a in result["audits"]],
        "noise_checks": [dict(result["noise_check"])] if result.get("noise_check") else [],
        # the run the audit names (`audit canaries --run`), read by dpaudit.reporting; not part of the report
        "linked_run": _linked_run(result["run"]) if result.get("run") is not None else None,
    }


def _linked_run(run: Any) -> dict[str, str]:
    """A saved canary audit's ``run`` (``audit canaries --run``): its path and checkpoint sha256, both strings; anything
    else raises TypeError, which the loader reports in one line (a file from a stranger)."""
    link = {k: run[k] for k in ("path", "checkpoint_sha256")}
    if not all(isinstance(v, str) for v in link.values()):
        raise TypeError("run: path and checkpoint_sha256 must be strings")
    return link


def _summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    claim = entry["claim"]
    membership = entry["attacks"].get("membership") or []
    best = max(membership, key=lambda a: a["auc"], default=None)
    low = f"{LOW_FPR:g}"  # the key convention of tpr_at_fpr (attacks.metrics.fpr_key)
    # Below 1/#non-members the TPR "at 0.1% FPR" is the TPR at zero false positives: not that metric.
    needed = nonmembers_needed(LOW_FPR)
    tprs = [a for a in membership if a["tpr_at_fpr"].get(low) is not None and a["n_nonmembers"] >= needed]
    best_tpr = max(tprs, key=lambda a: a["tpr_at_fpr"][low], default=None)
    unresolved = None
    if best_tpr is None and membership:
        unresolved = {"nonmembers_needed": needed, "nonmembers": max(a["n_nonmembers"] for a in membership)}
    # The headline reads each audit's verdict against the model's claim (effective_verdict).
    audits = [{**a, "verdict": a["effective_verdict"]} for a in entry["audits"]]
    return {
        "claimed_epsilon": claim["epsilon"] if claim else "inf",
        "claimed_delta": claim["delta"] if claim else None,
        "best_auc": best["auc"] if best else None,
        "best_auc_attack": best["attack"] if best else None,
        "low_fpr": LOW_FPR,
        "tpr_at_low_fpr": best_tpr["tpr_at_fpr"][low] if best_tpr else None,
        "tpr_at_low_fpr_attack": best_tpr["attack"] if best_tpr else None,
        "tpr_at_low_fpr_unresolved": unresolved,
        **headline(audits, claim, entry.get("noise_checks") or ()).to_dict(),
    }


def _normalise_audit(audit: Mapping[str, Any], claim: Mapping[str, Any] | None) -> dict[str, Any]:
    check_verdict(audit)  # a report.json from elsewhere whose verdict contradicts its numbers is refused
    a = dict(audit)
    a.setdefault("notes", [])
    a.setdefault("max_certifiable_epsilon", None)
    a["threat_model"] = threat_model(a)  # reports written before threat models were labelled get the default
    a["operating_point"] = operating_point(a.get("counts"), float(a["confidence"]))
    a["effective_verdict"] = effective_verdict(a, claim)
    return a


def _normalise_audits(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    try:
        return [_normalise_audit(a, entry["claim"]) for a in entry.get("audits") or []]
    except InputError as e:
        raise InputError(f"model {entry['name']!r}: {e}") from None


def _normalise_model(entry: Mapping[str, Any]) -> dict[str, Any]:
    missing = [k for k in ("name", "model", "data", "training", "claim", "utility", "attacks") if k not in entry]
    if missing:
        raise InputError(f"model entry {entry.get('name', '?')!r} misses {', '.join(missing)}")
    e = jsonable(entry)
    attacks = {family: e["attacks"].get(family) for family in ATTACK_FAMILIES}
    attacks |= {k: v for k, v in e["attacks"].items() if k not in attacks}  # later families, kept as given
    out = {
        "name": e["name"],
        "path": e.get("path"),
        "model": e["model"],
        "data": e["data"],
        "training": e["training"],
        "claim": e["claim"],
        "utility": e["utility"],
        "attacks": attacks,
        "audits": _normalise_audits(e),
        "noise_checks": e.get("noise_checks") or [],
    }
    out["summary"] = _summary(out)
    return jsonable(out)


def _unique_names(models: list[dict[str, Any]]) -> None:
    """A repeated name gets " #2", " #3", ... : the first number that no model's name already has, so that two
    runs named "a" beside one named "a #2" never print as two "a #2" (every row, figure and headline names one
    model)."""
    taken = {m["name"] for m in models}
    seen: set[str] = set()
    for m in models:
        base = m["name"]
        if base in seen:
            k = 2
            while f"{base} #{k}" in taken:
                k += 1
            m["name"] = f"{base} #{k}"
            taken.add(m["name"])
        seen.add(m["name"])


def generated_by() -> dict[str, str | None]:
    """Versions of what produced the report (read from package metadata: no heavy imports)."""
    from dpaudit import __version__

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "dpaudit": __version__,
        "torch": version("torch"),
        "numpy": np.__version__,
        "scipy": version("scipy"),
        "matplotlib": version("matplotlib"),
        "python": platform.python_version(),
    }


def build_report(
    models: Sequence[Mapping[str, Any]], *, title: str, config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Assemble a validated report from model entries (as made by :func:`model_entry`).

    Derives each audit's operating point and effective verdict and each model's summary row;
    applying it again to a report's own ``models`` gives the same report (idempotent), which is
    what merging relies on. ``config`` (the evaluation settings) is stored with its SHA-256.
    """
    entries = [_normalise_model(m) for m in models]
    _unique_names(entries)
    config = jsonable(dict(config)) if config is not None else None
    report = {
        "schema_version": SCHEMA_VERSION,
        "title": str(title),
        "generated_by": generated_by(),
        "run": {
            "seed": config.get("seed") if config else None,
            "config_sha256": sha256_json(config),
            "config": config,
            "data_sha256": sorted({m["data"]["sha256"] for m in entries} - {None}),
        },
        "models": entries,
    }
    validate_report(report)
    return report


def merge_reports(reports: Sequence[Mapping[str, Any]], *, title: str | None = None) -> dict[str, Any]:
    """One report with the models of all ``reports`` (names made unique); the configs are kept side by side."""
    if not reports:
        raise InputError("nothing to merge: no reports given")
    models = [m for r in reports for m in r["models"]]
    configs = [r["run"] for r in reports]
    seeds = {c["seed"] for c in configs}
    config = {"seed": seeds.pop() if len(seeds) == 1 else None, "merged": configs}
    return build_report(models, title=title or reports[0]["title"], config=config)


# --------------------------------------------------------------------------- validation and files


def _schema() -> dict[str, Any]:
    return json.loads(resources.files("dpaudit.report").joinpath("schema.json").read_text())


def validate_report(report: Any) -> None:
    """Check ``report`` against ``schema.json``; raise :class:`InputError` with one line on failure."""
    import jsonschema

    schema = _schema()
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(report))
    if error is None:
        _check_sizes(report)
        return
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path) or " (top level)"
    message = " ".join(error.message.split())
    if len(message) > 200:
        message = message[:197] + "..."
    raise InputError(f"invalid report: report{where}: {message}")


def _check_sizes(report: Mapping[str, Any]) -> None:
    """What the schema cannot say and the figures rely on: sizes that must agree (a ROC's FPRs and TPRs, an
    inversion's values and the feature shape, a cloak's σ map and the feature shape). A report.json from
    elsewhere that breaks one is refused in one line, not drawn into a traceback."""
    for i, m in enumerate(report["models"]):
        for family, results in m["attacks"].items():
            for j, a in enumerate(results or []):
                where = f"report.models[{i}].attacks.{family}[{j}]"
                roc = a.get("roc") if family == "membership" else None
                if roc and len(roc["fpr"]) != len(roc["tpr"]):
                    raise InputError(f"invalid report: {where}.roc: {len(roc['fpr'])} FPRs but {len(roc['tpr'])} TPRs")
                if "feature_shape" not in a:
                    continue
                size = int(np.prod(a["feature_shape"]))
                for key, values in [("sigma_map", a.get("sigma_map"))] + [
                    (f"inversions[{k}]", v) for k, v in enumerate(a.get("inversions") or [])
                ]:
                    if values is not None and len(values) != size:
                        raise InputError(
                            f"invalid report: {where}.{key}: {len(values)} values, but feature_shape "
                            f"{a['feature_shape']} has {size}"
                        )


def load_report(path: Path | str) -> dict[str, Any]:
    """Load and validate a ``report.json`` (or a directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / REPORT_FILES["json"]
    check_input_file(path)  # missing, or a pipe or device said as such (never opened)
    report = read_json(path)  # size, depth and number limits
    try:
        validate_report(report)
        for model in report["models"]:  # a verdict no rule gives, or one its numbers contradict: refused at once
            try:
                for audit in model.get("audits") or []:
                    check_verdict(audit)
            except InputError as e:
                raise InputError(f"model {model.get('name', '?')!r}: {e}") from None
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    return report


def parse_formats(formats: str | Iterable[str]) -> tuple[str, ...]:
    """Formats as a tuple in canonical order; ``"json,md"`` or ``("json", "md")``."""
    items = formats.split(",") if isinstance(formats, str) else list(formats)
    items = [f.strip().lower() for f in items if f.strip()]
    unknown = [f for f in items if f not in REPORT_FILES]
    if unknown or not items:
        raise InputError(f"unknown report format {', '.join(unknown) or '(none)'}; valid: {', '.join(REPORT_FILES)}")
    return tuple(f for f in REPORT_FILES if f in items)


def render(report: Mapping[str, Any], formats: Iterable[str]) -> dict[str, str]:
    """File name → content for each format (rendered in memory, nothing written)."""
    from dpaudit.report.html import render_html
    from dpaudit.report.markdown import render_markdown

    renderers = {"json": dumps, "md": render_markdown, "html": render_html}
    return {REPORT_FILES[f]: renderers[f](report) for f in parse_formats(formats)}


def write_report(
    report: Mapping[str, Any],
    out_dir: Path | str,
    formats: Iterable[str] = ("json", "md", "html"),
    force: bool = False,
    inputs: Iterable[Path | str] = (),
) -> Path:
    """Validate, render and write ``report.{json,md,html}`` into ``out_dir`` atomically.

    An existing ``out_dir`` is refused unless ``force``, and then replaced only when it holds nothing
    but an earlier dpaudit output and none of ``inputs`` (the runs and reports the report reads), once
    the new one is complete (:func:`dpaudit.fileio.write_atomic_dir`). Everything is rendered before
    anything is written.
    """

    out_dir = Path(out_dir)
    inputs = list(inputs)
    check_output_dir(out_dir, force=force, inputs=inputs)
    validate_report(report)
    files = render(report, formats)

    def write(tmp: Path) -> None:
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; a report is meant to be read by others
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")

    return write_atomic_dir(out_dir, write, force=force, inputs=inputs, written_by="report")
