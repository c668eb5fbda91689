"""Build, validate, load, merge and write leakage reports (the JSON is the single source of truth).

A report is plain JSON-ready data (see ``schema.json``): renderers (:mod:`dpaudit.report.markdown`,
:mod:`dpaudit.report.html`, :mod:`dpaudit.report.plots`) read only this dict and never touch runs,
attacks or audits. Everything derived here (operating points, confidence boxes, summary rows,
verdicts) is computed once, stored in the report, and rendered as is.

Non-finite numbers are spelled ``"inf"`` / ``"-inf"`` / ``"nan"`` because JSON has none; read them
back with :func:`as_float`.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.audit import clopper_pearson_lower, clopper_pearson_upper, decide_verdict
from dpaudit.errors import InputError
from dpaudit.fileio import write_atomic_dir
from dpaudit.workflows.result import ModelAudit, headline

SCHEMA_VERSION = 2  # 2: summary = strongest formal audit + strongest estimate (issue 10)
REPORT_FILES = {"json": "report.json", "md": "report.md", "html": "report.html"}
ATTACK_FAMILIES = ("membership", "inversion", "extraction", "attribute", "cloak", "icl")
LOW_FPR = 0.001  # the summary's TPR is read at FPR = 0.1 % (Carlini et al. 2022, "MIA from first principles")


# --------------------------------------------------------------------------- JSON helpers


def as_float(x: Any) -> float | None:
    """A report number as a float: ``"inf"``/``"-inf"``/``"nan"`` map back to non-finite floats."""
    if x is None:
        return None
    return float(x)


def jsonable(obj: Any) -> Any:
    """A JSON-ready copy: numpy scalars/arrays to Python, non-finite floats to strings, keys to str."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def dumps(report: Mapping[str, Any]) -> str:
    """The canonical text of a report (deterministic: the same report gives the same bytes)."""
    return json.dumps(jsonable(report), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def sha256_json(obj: Any) -> str:
    """SHA-256 of canonical JSON (sorted keys, no whitespace), so equal configs hash equally."""
    text = json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------- statistics


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided Clopper–Pearson interval for a binomial proportion k/n (Clopper & Pearson 1934).

    Each end is a one-sided bound at level (1 − confidence)/2, so the pair covers with probability
    ≥ confidence; the one-sided bounds are the audit layer's (:mod:`dpaudit.audit.stats`).
    """
    if n <= 0 or not 0 <= k <= n:
        raise InputError(f"expected 0 <= k <= n with n > 0, got k={k}, n={n}")
    tail = (1.0 - confidence) / 2
    return float(clopper_pearson_lower(k, n, tail)), float(clopper_pearson_upper(k, n, tail))


def tradeoff_curve(alpha: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The (ε, δ)-DP trade-off function: the least type-II error (FNR) at type-I error (FPR) α.

    Dong, Roth & Su 2022, "Gaussian Differential Privacy", JRSS-B (arXiv:1905.02383), Prop. 2.5:
        f_{ε,δ}(α) = max{0, 1 − δ − e^ε α, e^{−ε} (1 − δ − α)}.
    A test (FPR, FNR) strictly below this curve contradicts the (ε, δ) claim.
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    if epsilon > 700.0:  # e^ε overflows a float (JL claims reach 1e9): at that ε the curve is 0 for α > 0
        return np.where(alpha > 0, np.maximum(0.0, 1.0 - delta - np.exp(min(epsilon, 700.0)) * alpha), 1.0 - delta)
    return np.maximum.reduce(
        [np.zeros_like(alpha), 1.0 - delta - math.exp(epsilon) * alpha, math.exp(-epsilon) * (1.0 - delta - alpha)]
    )


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
        "fpr_interval": list(clopper_pearson(fp, fp + tn, confidence)),
        "fnr_interval": list(clopper_pearson(fn, fn + tp, confidence)),
        "confidence": confidence,
    }


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


def _summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    claim = entry["claim"]
    membership = entry["attacks"].get("membership") or []
    best = max(membership, key=lambda a: a["auc"], default=None)
    low = f"{LOW_FPR:g}"  # the key convention of tpr_at_fpr (attacks.metrics.fpr_key)
    tprs = [a for a in membership if a["tpr_at_fpr"].get(low) is not None]
    best_tpr = max(tprs, key=lambda a: a["tpr_at_fpr"][low], default=None)
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
        **headline(audits, claim).to_dict(),
    }


def _normalise_audit(audit: Mapping[str, Any], claim: Mapping[str, Any] | None) -> dict[str, Any]:
    a = dict(audit)
    a.setdefault("notes", [])
    a.setdefault("max_certifiable_epsilon", None)
    a["operating_point"] = operating_point(a.get("counts"), float(a["confidence"]))
    if a.get("verdict") is not None or claim is None:
        a["effective_verdict"] = a.get("verdict")
    else:
        # An audit run without a claim is judged against the model's claim; unknown power counts as none.
        power = as_float(a.get("max_certifiable_epsilon"))
        a["effective_verdict"] = decide_verdict(
            as_float(a["epsilon_lower_bound"]),
            as_float(claim["epsilon"]),
            power or 0.0,
            formal=bool(a["formal"]),
            refutes_curve=a.get("refutation") is not None,
        )
    return a


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
        "audits": [_normalise_audit(a, e["claim"]) for a in e.get("audits") or []],
    }
    out["summary"] = _summary(out)
    return jsonable(out)


def _unique_names(models: list[dict[str, Any]]) -> None:
    seen: dict[str, int] = {}
    for m in models:
        base = m["name"]
        seen[base] = seen.get(base, 0) + 1
        if seen[base] > 1:
            m["name"] = f"{base} #{seen[base]}"


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
            "data_sha256": sorted({m["data"]["sha256"] for m in entries}),
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
        return
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path) or " (top level)"
    message = " ".join(error.message.split())
    if len(message) > 200:
        message = message[:197] + "..."
    raise InputError(f"invalid report: report{where}: {message}")


def load_report(path: Path | str) -> dict[str, Any]:
    """Load and validate a ``report.json`` (or a directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / REPORT_FILES["json"]
    if not path.is_file():
        raise InputError(f"{path}: no such report file")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None
    try:
        validate_report(report)
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
) -> Path:
    """Validate, render and write ``report.{json,md,html}`` into ``out_dir`` atomically.

    An existing ``out_dir`` is refused unless ``force`` (then replaced only once the new one is
    complete). Everything is rendered before anything is written.
    """

    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise InputError(f"{out_dir} already exists; use --force to overwrite it")
    validate_report(report)
    files = render(report, formats)

    def write(tmp: Path) -> None:
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; a report is meant to be read by others
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")

    return write_atomic_dir(out_dir, write, force=force)
