"""The ``dpaudit report`` pipeline: attack and audit run directories (:mod:`dpaudit.workflows`), merge
earlier reports, and build and write the report (:mod:`dpaudit.report`).

Above both: the workflows decide, the report package renders what it is given, and this module only
strings them together (as :mod:`dpaudit.demo` does for the demo), so the CLI command is one call.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from dpaudit.errors import InputError
from dpaudit.fileio import check_output_dir, input_problem
from dpaudit.progress import NULL_PROGRESS, Progress


def classify_input(path: Path) -> str:
    """'run' for a run directory, 'canaries' for a saved gradient-canary audit (``dpaudit audit canaries
    --out FILE``), 'report' for a report.json (or a directory holding one)."""
    from dpaudit.checkpoint import CHECKPOINT_FILE, not_a_run
    from dpaudit.report.build import REPORT_FILES
    from dpaudit.validation import read_json
    from dpaudit.workflows.hooks_audit import KIND

    if not (path.is_dir() or path.is_file()):  # missing, a pipe, a device, a broken link: said, never opened
        what = input_problem(path, True).replace("no such directory", "no such file or directory")
        raise InputError(f"{path}: {what.replace('not a directory', 'not a run directory or a JSON file')}")
    if path.is_dir() and (path / CHECKPOINT_FILE).is_file():
        return "run"
    if path.is_file() and path.name == CHECKPOINT_FILE:  # not a report.json: the run it describes
        raise InputError(f"{path}: a run's {CHECKPOINT_FILE}, not a report; give the run directory {path.parent}")
    if path.is_file() and path.suffix.lower() == ".json":
        doc = read_json(path)  # size, depth and number limits
        return "canaries" if isinstance(doc, dict) and doc.get("kind") == KIND else "report"
    if path.is_dir() and (path / REPORT_FILES["json"]).is_file():
        return "report"
    hint = not_a_run(path).partition(f"(no {CHECKPOINT_FILE})")[2] if path.is_dir() else ""
    raise InputError(
        f"{path}: neither a run directory (no {CHECKPOINT_FILE}), a report.json nor a saved canary audit "
        f"(`dpaudit audit canaries DIR --out FILE.json`){hint}"
    )


def save_canary_audit(result, out: Path, *, force: bool = False) -> Path:
    """Write a :class:`~dpaudit.workflows.hooks_audit.CanaryRunAudit` as JSON to ``out`` atomically (an existing
    file only with ``force``), for ``dpaudit report OUT``, which renders it like any other audit."""
    from dpaudit.fileio import write_atomic_file
    from dpaudit.report._data import dumps

    return write_atomic_file(Path(out), dumps(result.to_dict()), force=force)


def load_canary_audit(path: Path) -> dict[str, Any]:
    """The report entry of a saved gradient-canary audit (:func:`dpaudit.report.build.canary_run_entry`);
    a file that is not one, or misses what the entry needs, is refused in one line."""
    from dpaudit.report.build import canary_run_entry
    from dpaudit.validation import read_json

    doc = read_json(path)
    try:
        return canary_run_entry(doc, path=str(path))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{path}: not a complete saved canary audit ({type(e).__name__}: {e})") from None


def fold_linked_canary_audits(
    models: list[dict[str, Any]], runs: dict[Path, dict[str, Any]], notify: Callable[[str], None]
) -> list[dict[str, Any]]:
    """``models`` with each saved canary audit that names one of ``runs`` (run directory -> its report entry;
    ``dpaudit audit canaries --run``) folded into that run's entry: its formal audits and noise check beside the run's
    attacks, one model. Only a run unchanged since the audit named it (the sha256 of its checkpoint.json) takes it;
    an audit naming a run that changed since stays a model of its own, with a notice, as does one naming no run
    given. The path is read as recorded, from the working directory (as a relative --data is)."""
    from dpaudit.checkpoint import CHECKPOINT_FILE
    from dpaudit.fileio import sha256_file

    by_dir = {p.resolve(): entry for p, entry in runs.items()}
    out = []
    for m in models:
        link = m.pop("linked_run", None)
        target = by_dir.get(Path(link["path"]).resolve()) if link else None
        if target is not None and sha256_file(Path(link["path"]) / CHECKPOINT_FILE) != link["checkpoint_sha256"]:
            notify(
                f"{m['path']}: audited the run {link['path']} as its {CHECKPOINT_FILE} was then; it has changed since, "
                "so the audit is shown as a model of its own"
            )
            target = None
        if target is None:
            out.append(m)
            continue
        target["audits"] = [*target["audits"], *m["audits"]]
        target["noise_checks"] = [*(target.get("noise_checks") or []), *m["noise_checks"]]
    return out


def _families(
    inversion: bool, attribute: str | None, extraction_budget: int | None, cloak: str | None, icl: bool, jl_step: bool
) -> dict[str, dict]:
    """The attack families beside membership inference that the options ask for, with their options."""
    from dpaudit.validation import check_positive_int

    families: dict[str, dict] = {}
    if inversion:
        families["inversion"] = {}
    if attribute is not None:
        families["attribute"] = {"feature": int(attribute) if attribute.strip().isdigit() else attribute}
    if extraction_budget is not None:
        families["extraction"] = {"budget": check_positive_int(extraction_budget=extraction_budget)}
    if cloak is not None:
        from dpaudit.training.cloak import cloak_option

        families["cloak"] = cloak_option(cloak)
    if icl:
        families["icl"] = {}
    if jl_step:
        families["jl-step"] = {}
    return families


def report_from_options(
    inputs: Sequence[Path],
    *,
    out: Path,
    formats: str,
    attacks: str,
    reference_models: int,
    estimate_method: str,
    confidence: float,
    workers: int,
    seed: int,
    cache_dir: Path | None,
    inversion: bool,
    no_cache: bool = False,
    attribute: str | None,
    extraction_budget: int | None,
    cloak: str | None,
    icl: bool,
    jl_step: bool,
    title: str | None,
    force: bool = False,
    progress: Progress = NULL_PROGRESS,
    notify: Callable[[str], None] = lambda message: None,
    given: Collection[str] = frozenset(),
) -> tuple[dict[str, Any], list[Path]]:
    """``dpaudit report``: attack and audit every run of ``inputs`` (with :func:`dpaudit.workflows.
    audit_checkpoint`'s defaults), merge the reports among them, write the report to ``out`` in
    ``formats``; returns the report and the files written. ``notify`` receives a status line per run.
    ``given``: the options the user set; one no chosen attack reads is refused (:func:`attacks.mia.check_options_read`:
    ``--attacks loss --reference-models 3`` was recorded in the report's configuration as if it had been used)."""
    from attacks.mia import check_options_read
    from dpaudit.cache import cache_for
    from dpaudit.checkpoint import SharedData, read_meta
    from dpaudit.report.build import (
        REPORT_FILES,
        build_report,
        load_report,
        model_entry_from,
        parse_formats,
        write_report,
    )
    from dpaudit.validation import check_choice, check_in_interval, check_positive_int
    from dpaudit.workflows import audit_checkpoint, membership_attacks
    from dpaudit.workflows.checkpoint import check_families_fit

    fmts = parse_formats(formats)
    methods = membership_attacks(attacks)
    check_positive_int(reference_models=reference_models)
    check_positive_int(workers=workers)
    check_in_interval(0.0, 1.0, confidence=confidence)
    check_choice(("clopper-pearson", "gdp"), estimate_method=estimate_method)
    check_options_read(methods, given)
    check_output_dir(out, force=force, inputs=inputs)  # fail before the (slow) attacks
    cache = cache_for(cache_dir, no_cache=no_cache)
    families = _families(inversion, attribute, extraction_budget, cloak, icl, jl_step)
    kinds = [(p, classify_input(p)) for p in inputs]
    reports = {p: load_report(p) for p, kind in kinds if kind == "report"}  # validate all before attacking
    saved = {p: load_canary_audit(p) for p, kind in kinds if kind == "canaries"}
    metas = {p: read_meta(Path(p)) for p, kind in kinds if kind == "run"}
    for p, meta in metas.items():  # a family a later run's data refuse fails now, not after the earlier runs' attacks
        check_families_fit(families, meta, p)
    shared = SharedData(metas[p] for p, kind in kinds if kind == "run")  # runs on one data file load it once
    config = {
        "attacks": list(methods), "reference_models": reference_models, "estimate_method": estimate_method,
        "confidence": confidence, "seed": seed, "inputs": [str(p) for p in inputs], "inversion": inversion,
        "attribute": attribute, "extraction_budget": extraction_budget, "cloak": cloak, "icl": icl,
        "jl_step": jl_step, "merged": [reports[p]["run"] for p, kind in kinds if kind == "report"],
    }  # fmt: skip
    models, runs = [], {}
    with cache as cache_dir:
        for p, kind in kinds:
            if kind == "report":
                models += reports[p]["models"]
                continue
            if kind == "canaries":  # audited already (`dpaudit audit canaries --out`): shown like any other audit
                models.append(saved[p])
                continue
            notify(f"attacking {p} ({', '.join(methods) or 'no membership attack'}) …")
            with shared.run(p) as run:
                audit = audit_checkpoint(
                    run, attacks=methods, reference_models=reference_models, estimate_method=estimate_method,
                    confidence=confidence, workers=workers, seed=seed, cache_dir=cache_dir, families=families,
                    progress=progress,
                )  # fmt: skip
            runs[Path(p)] = model_entry_from(audit, path=str(p))
            models.append(runs[Path(p)])
    models = fold_linked_canary_audits(models, runs, notify)
    default_title = reports[kinds[0][0]]["title"] if kinds[0][1] == "report" else "dpaudit leakage report"
    result = build_report(models, title=title or default_title, config=config)
    write_report(result, out, fmts, force=force, inputs=inputs)
    return result, [out / REPORT_FILES[f] for f in fmts]
