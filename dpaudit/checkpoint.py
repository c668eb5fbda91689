"""Run directories: ``model.safetensors`` + ``checkpoint.json`` + ``split.npz``. Never pickle.

Loading validates the schema version, the keys, every tensor's name and shape against the model
spec and the data's content hash, so a checkpoint from a stranger is safe to open and a stale one
fails loudly instead of giving silently wrong numbers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpaudit import numfmt
from dpaudit.data import SPLIT_NAMES, Dataset, Splits, load_dataset, preprocessing_from_dict, spec_path
from dpaudit.errors import CheckpointError, InputError
from dpaudit.fileio import (
    check_input_file,
    check_weights_file,
    input_problem,
    load_safetensors,
    write_atomic_dir,
    writer_of,
)
from dpaudit.models import ModelSpec, build_model, model_spec_from_checkpoint
from dpaudit.user_code import not_from
from dpaudit.validation import check_json_type, read_json

SCHEMA_VERSION = 1
CHECKPOINT_FILE = "checkpoint.json"
WEIGHTS_FILE = "model.safetensors"
SPLIT_FILE = "split.npz"
REQUIRED_KEYS = (
    "schema_version",
    "model",
    "data",
    "split",
    "preprocessing",
    "training",
    "privacy",
    "metrics",
    "versions",
)


def versions() -> dict[str, str]:
    from dpaudit import __version__

    return {"dpaudit": __version__, "torch": torch.__version__, "numpy": np.__version__}


def data_from_run(spec: str | None, out: Path) -> str | None:
    """Where the data file or directory of a relative ``spec`` lies as seen from the run directory ``out``
    (recorded as ``data.from_run``), so that the run reloads its data from any working directory, not only
    from the one it was trained in; None for an embedded or generated dataset or an absolute path. The
    location is a hint only: the data found there must still have the recorded sha256."""
    path = spec_path(spec) if isinstance(spec, str) and spec else None
    if path is None or path.is_absolute():
        return None
    return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(out))).as_posix()


def save_run(
    out: Path,
    *,
    model: nn.Module,
    meta: dict[str, Any],
    splits: Splits,
    force: bool = False,
    arrays: dict[str, dict[str, np.ndarray]] | None = None,
    inputs: Iterable[Path | str] = (),
) -> Path:
    """Save a run directory atomically (:func:`dpaudit.fileio.write_atomic_dir`: a forced replacement
    only of an earlier dpaudit output holding none of ``inputs`` nor the run's data file). ``arrays``
    maps extra ``.npz`` file names to their arrays (e.g. canaries); they are read back with
    ``allow_pickle=False``."""
    from safetensors.torch import save_file

    meta = {**meta, "schema_version": SCHEMA_VERSION, "versions": meta.get("versions") or versions()}
    where = data_from_run((meta.get("data") or {}).get("spec"), Path(out))
    if where is not None:
        meta["data"] = {**meta["data"], "from_run": where}
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise ValueError(f"checkpoint meta misses {missing}")
    state = _unshared_state(model)

    def write(tmp: Path) -> None:
        save_file(state, str(tmp / WEIGHTS_FILE))
        (tmp / CHECKPOINT_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        np.savez(tmp / SPLIT_FILE, **{name: getattr(splits, name) for name in SPLIT_NAMES})
        for fname, content in (arrays or {}).items():
            np.savez(tmp / fname, **content)

    data_source = (meta.get("data") or {}).get("spec")
    return write_atomic_dir(Path(out), write, force=force, inputs=[*inputs, data_source], written_by="run")


@dataclass
class Run:
    """A loaded checkpoint: metadata, the model with its weights, preprocessing and splits."""

    path: Path
    meta: dict[str, Any]
    spec: ModelSpec
    model: nn.Module
    splits: Splits
    # [] or [the data] inside :meth:`dataset_held`, None outside it (every dataset() call reloads)
    _held: list[Dataset] | None = field(default=None, init=False, repr=False, compare=False)
    # The loads this run shares with the other runs of one command (:class:`SharedData`), or None
    _shared: SharedData | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def privacy(self) -> dict[str, Any] | None:
        return self.meta["privacy"]

    @property
    def preprocessing(self):
        return preprocessing_from_dict(self.meta["preprocessing"])

    def canaries(self):
        """The run's canaries (:class:`~dpaudit.canaries.CanarySet`), or None."""
        from dpaudit.canaries import CanarySet

        meta = self.meta.get("canaries")
        if not meta:
            return None
        return CanarySet.load(self.file(meta.get("file"), "canaries.file"), meta)

    def file(self, name: Any, key: str) -> Path:
        """The run's file ``name`` (recorded at ``key`` in checkpoint.json), checked before it is read: a
        plain name of a regular file inside the run folder (no absolute or ``../`` path, no link, no pipe or
        device), whose content matches the sha256 in the run's manifest when it has one."""
        where = f"{self.path / CHECKPOINT_FILE}: {key}"
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise CheckpointError(f"{where} must name a file inside the run folder, got {name!r}")
        path = self.path / name
        if path.is_symlink():
            raise CheckpointError(f"{where}: {path} is a symbolic link, not a regular file")
        problem = input_problem(path)
        if problem:
            raise CheckpointError(f"{where}: {path}: {problem}")
        check_unchanged(self.path, name, "it cannot be recomputed without retraining, so it is not trusted")
        return path

    def whitebox_canaries(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Scores and inclusion bits of the run's white-box Dirac canaries
        (:mod:`dpaudit.training.dirac`), or None when it was trained without them."""
        meta = self.meta.get("whitebox_canaries")
        if not meta:
            return None
        path = self.file(meta.get("file"), "whitebox_canaries.file")
        try:
            with np.load(path, allow_pickle=False) as z:
                scores, included = np.asarray(z["scores"], dtype=np.float64), z["included"].astype(bool)
        except (OSError, KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: cannot read the white-box canaries ({e})") from None
        m = meta.get("m")
        if isinstance(m, bool) or not isinstance(m, int):  # a list or null was a TypeError (exit 3)
            raise CheckpointError(f"{self.path / CHECKPOINT_FILE}: whitebox_canaries.m: expected an integer, got {m!r}")
        if scores.shape != included.shape or scores.shape != (m,):
            raise CheckpointError(f"{path}: expected {meta['m']} white-box canary scores and bits")
        return scores, included

    @contextlib.contextmanager
    def dataset_held(self) -> Iterator[None]:
        """Within the block, :meth:`dataset` loads and checks the data once and gives every later call that same
        load: one command's attacks share it (each load reads and sha256-hashes the whole file: 10.8 s at 50,000
        CIFAR-sized images, paid once per attack family by `report` and `audit checkpoint`). Nothing is loaded
        until the first call. Outside the block each call reloads and checks again; a nested block shares the
        outer one's load."""
        if self._held is not None:
            yield
            return
        self._held = []
        try:
            yield
        finally:
            self._held = None

    def dataset(self) -> Dataset:
        """Reload the training data and check it is byte-for-byte the data the model saw (inside
        :meth:`dataset_held`: the block's one load; for a run of :meth:`SharedData.run`, another run's load of the
        same file and hash)."""
        if self._held:
            return self._held[0]
        ds = self._shared.dataset(self) if self._shared is not None else self._load()
        if self._held is not None:
            self._held.append(ds)
        return ds

    def _load(self) -> Dataset:
        """The run's data, loaded and checked against its recorded sha256."""
        d = self.meta["data"]
        try:
            ds = load_dataset(d["spec"], label_column=d.get("label_column"))
        except InputError as e:
            path = spec_path(d["spec"])
            elsewhere = path is not None and not path.is_absolute() and not path.exists()  # typed in another cwd
            found = self._data_from_run(d) if elsewhere else None  # existing data that failed: that error stands
            if found is None:
                hint = (
                    f" (the run recorded --data {d['spec']!r} as given, relative to the directory it was trained or "
                    "imported in, and the data is not where the run folder's own record points either: run "
                    "this command from that directory)"
                    if elsewhere
                    else ""
                )
                raise CheckpointError(f"{self.path}: cannot reload the run's data: {e}{hint}") from None
            ds = found
        if ds.sha256 != d["sha256"]:
            raise CheckpointError(
                f"{self.path}: the data {d['spec']!r} changed since training "
                f"(sha256 {ds.sha256[:12]}… != recorded {d['sha256'][:12]}…)"
            )
        return ds

    def _data_from_run(self, d: dict[str, Any]) -> Dataset | None:
        """The data at ``data.from_run`` (relative to this run directory); None when none is recorded or it fails."""
        rel = d.get("from_run")
        if not isinstance(rel, str):
            return None
        try:
            return load_dataset(str(self.path / rel), label_column=d.get("label_column"))
        except InputError:
            return None

    def logits(self, X: np.ndarray, batch: int | None = None, advance=None) -> np.ndarray:
        """Model logits (float64) on raw (unpreprocessed) features: an array, or a lazy
        :class:`~dpaudit.data.RowView` (``dataset.view(idx)``) read and preprocessed a batch at a time
        (``advance``: a progress task's callback, :func:`predict_logits`)."""
        return predict_logits(self.model, X, batch=batch, transform=self.preprocessing.transform, advance=advance)


def data_key(meta: Mapping[str, Any]) -> str:
    """Which load a run's data is, from its checkpoint metadata: the file or directory its spec names (absolute, as
    seen from the working directory; the spec itself for an embedded or generated dataset), the label column and the
    recorded sha256. Runs with one key load the same bytes, read the same way."""
    d = meta.get("data") if isinstance(meta.get("data"), Mapping) else {}
    spec = d.get("spec")
    path = spec_path(spec) if isinstance(spec, str) and spec else None
    where = os.path.abspath(path) if path is not None else spec
    return json.dumps([where, d.get("label_column"), d.get("sha256")], default=repr)


class SharedData:
    """The data loads of several runs audited by one command (``dpaudit report RUN1 RUN2 …``): a run whose data
    has the :func:`data_key` of an earlier run's gets that run's load, checked then, instead of reading and
    sha256-hashing the whole file again (6.7 s + 4.2 s a load of 50,000 CIFAR-sized images). ``metas``: the
    checkpoint metadata of every run the command will audit, so that a load is kept only while a later run of the
    same key is still to come, and dropped after the last (a run with data of its own in between holds both).
    Outside :meth:`run` nothing is shared: every :meth:`Run.dataset` reloads and checks as documented."""

    def __init__(self, metas: Iterable[Mapping[str, Any]]) -> None:
        self._left: dict[str, int] = {}
        for meta in metas:
            key = data_key(meta)
            self._left[key] = self._left.get(key, 0) + 1
        self._loaded: dict[str, Dataset] = {}

    @contextlib.contextmanager
    def run(self, path: Path | str) -> Iterator[Run]:
        """The run at ``path``, loaded, sharing this command's loads; when the block ends it counts as audited (a
        load no later run needs is dropped)."""
        run = load_run(path)
        key = data_key(run.meta)
        run._shared = self
        try:
            yield run
        finally:
            run._shared = None
            self._left[key] = self._left.get(key, 1) - 1
            if self._left[key] <= 0:
                self._loaded.pop(key, None)

    def dataset(self, run: Run) -> Dataset:
        """``run``'s data: an earlier run's load of the same key, else loaded and checked now (and kept if a later
        run has its key)."""
        key = data_key(run.meta)
        ds = self._loaded.get(key)
        if ds is None:
            ds = run._load()
            if self._left.get(key, 0) > 1:
                self._loaded[key] = ds
        return ds


# Evaluation batches: at most EVAL_BATCH_ROWS records and about EVAL_BATCH_BYTES of float32 input. A fixed 2,048
# rows of CIFAR-shaped images (3 x 32 x 32) put 25 MB of input and +591 MB of activations of the README's
# residual CNN (widths 16, 32, 64) in memory at once, no faster per record than 341 rows (+198 MB at 512 rows);
# tabular records, digits and token sequences stay at 2,048 rows.
EVAL_BATCH_ROWS = 2048
EVAL_BATCH_BYTES = 4 << 20


def eval_batch_rows(record_shape: tuple[int, ...]) -> int:
    """Rows per evaluation batch for records of ``record_shape`` (see :data:`EVAL_BATCH_BYTES`)."""
    return max(1, min(EVAL_BATCH_ROWS, EVAL_BATCH_BYTES // (4 * max(1, math.prod(record_shape)))))


def predict_logits(
    model: nn.Module, X: np.ndarray, batch: int | None = None, transform=None, advance=None
) -> np.ndarray:
    """Logits in float64, evaluated in eval mode without gradients, ``batch`` rows at a time (default:
    :func:`eval_batch_rows` of the record shape).

    ``X``: preprocessed features, or raw ones with ``transform`` (the preprocessing, applied per
    batch); anything sliceable with a length and a shape (an array, a :class:`~dpaudit.data.RowView`).
    ``advance``: a progress task's callback, given the rows of each batch done."""
    if batch is None:
        batch = eval_batch_rows(tuple((X.shape if hasattr(X, "shape") else np.shape(X))[1:]))
    param = next(model.parameters())
    out = []
    was_training = model.training  # the caller's mode comes back: a model in training stays in training
    model.eval()
    try:
        with torch.no_grad():
            for s in range(0, len(X), batch):
                xb = X[s : s + batch]
                xb = torch.as_tensor(np.array(xb if transform is None else transform(xb)), device=param.device)
                if xb.is_floating_point():
                    xb = xb.to(param.dtype)
                out.append(model(xb).double().cpu().numpy())
                if advance is not None:
                    advance(len(xb))
    finally:
        model.train(was_training)
    return np.concatenate(out) if out else np.zeros((0, 0))


# The JSON type of each top-level section of checkpoint.json (a stranger's file is checked before use).
SECTION_TYPES: dict[str, tuple[type, ...]] = {
    "model": (dict,),
    "data": (dict,),
    "split": (dict,),
    "preprocessing": (dict,),
    "training": (dict,),
    "privacy": (dict, type(None)),
    "metrics": (dict,),
    "versions": (dict,),
    "canaries": (dict, type(None)),
    "whitebox_canaries": (dict, type(None)),
    "performance": (dict,),
}

# Fields inside the sections that the commands read (``inspect``'s summary, the audits, the report), with their
# JSON types; None: the field may be absent. A wrong type was an internal error (exit 3) deep in a command.
FIELD_TYPES: dict[tuple[str, str], tuple[tuple[type, ...], bool]] = {
    ("model", "kind"): ((str,), True),
    ("training", "algo"): ((str,), True),
    ("split", "seed"): ((int,), False),
    ("split", "fractions"): ((list,), False),
    ("split", "sizes"): ((dict,), True),
    ("metrics", "train_accuracy"): ((float, type(None)), True),
    ("metrics", "test_accuracy"): ((float, type(None)), True),
    ("metrics", "holdout_accuracy"): ((float, type(None)), False),
    ("metrics", "train_loss"): ((float, type(None)), True),
    ("metrics", "test_loss"): ((float, type(None)), True),
}


# Folders other dpaudit commands write (their manifest's writer), which a newcomer gives where a run goes:
# what each holds and what to give instead.
_OTHER_OUTPUTS = {
    "report": "it is a report from `dpaudit report`: give one of the run directories it was made from",
    "demo": "it is the output of `dpaudit demo`: its runs are in {path}/runs/",
    "canaries": "it holds record canaries from `dpaudit canaries make`: add insert.npz to your training set, then "
    "`dpaudit import ... --canaries {path}` makes the run",
    "cloak": "it is a cloak from `dpaudit train --algo cloak`, not a model: give its --target run (`dpaudit report "
    "TARGET --cloak {path}` measures what the cloak leaks)",
}


def not_a_run(path: Path) -> str:
    """The one-line refusal of a directory without checkpoint.json, saying what it is when another dpaudit
    command wrote it (its manifest), it holds gradient canaries (dpaudit.hooks) or runs, and what to give instead."""
    path = Path(path)
    line = f"{path}: not a dpaudit run directory (no {CHECKPOINT_FILE})"
    if not path.is_dir():  # a pipe, a device, a broken link or a loop is said as what it is (never opened)
        return line if path.is_file() else f"{path}: not a dpaudit run directory ({input_problem(path, True)})"
    writer = writer_of(path)
    if writer == "cloak" and (path / "curve.json").is_file():  # a λ sweep: one cloak per lambda_* folder
        return f"{line}; it is a sweep of cloaks from `dpaudit train --algo cloak` ({path}/lambda_*/), not a model"
    if writer in _OTHER_OUTPUTS:
        return f"{line}; {_OTHER_OUTPUTS[writer].format(path=path)}"
    if (path / "canaries.json").is_file() and (path / "canaries.safetensors").is_file():
        return f"{line}; it holds gradient canaries (dpaudit.hooks): audit them with `dpaudit audit canaries {path}`"
    try:  # a folder of runs (`runs/` for `runs/mlp`): name a few
        runs = sorted(str(p) for p in path.iterdir() if (p / CHECKPOINT_FILE).is_file())
    except OSError:
        runs = []
    if runs:
        more = f" and {len(runs) - 3} more" if len(runs) > 3 else ""
        return f"{line}; the runs in it: {', '.join(runs[:3])}{more}"
    return line


def read_meta(path: Path) -> dict[str, Any]:
    """A run directory's checkpoint.json, validated (schema, required keys, field types); no weights read."""
    f = path / CHECKPOINT_FILE
    if not (f.exists() or f.is_symlink()):
        raise CheckpointError(not_a_run(path))
    check_input_file(f, error=CheckpointError)  # a pipe, a device, a broken link: said, never read
    meta = read_json(f, error=CheckpointError)  # size, depth and number limits
    check_json_type(meta, dict, str(f), error=CheckpointError)
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise CheckpointError(
            f"{f}: unknown schema_version {meta.get('schema_version')!r} (this dpaudit reads {SCHEMA_VERSION})"
        )
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise CheckpointError(f"{f}: missing key(s) {', '.join(missing)}")
    for key, types in SECTION_TYPES.items():
        if key in meta:
            check_json_type(meta[key], types, f"{f}: {key}", error=CheckpointError)
    for (section, key), (types, required) in FIELD_TYPES.items():
        if key not in meta[section] and not required:
            continue
        if key not in meta[section]:
            raise CheckpointError(f"{f}: {section}: missing key {key}")
        check_json_type(meta[section][key], types, f"{f}: {section}.{key}", error=CheckpointError)
    for key, value in meta["metrics"].items():  # the values too: NaN was printed, then broke the report
        part, _, kind = key.rpartition("_")
        if part not in ("train", "holdout", "test") or kind not in ("accuracy", "loss") or value is None:
            continue
        check_json_type(value, float, f"{f}: metrics.{key}", error=CheckpointError)
        if not (0 <= value <= 1 if kind == "accuracy" else 0 <= value < math.inf):
            why = " (a training that diverged: retrain it with a lower --lr)" if math.isnan(value) else ""
            raise CheckpointError(
                f"{f}: metrics.{key}: expected a number in [0, 1] or null, got {value}{why}"
                if kind == "accuracy"
                else f"{f}: metrics.{key}: expected a finite number >= 0 or null, got {value}{why}"
            )
    split = meta["split"]
    for key, kind, values in (
        ("fractions", float, split.get("fractions", [])),
        ("sizes", int, split["sizes"].values()),
    ):
        for v in values:
            check_json_type(v, kind, f"{f}: split.{key}", error=CheckpointError)
    if "members" not in split["sizes"]:
        raise CheckpointError(f"{f}: split.sizes: missing key members")
    try:  # the preprocessing's arrays and shape (every attack and audit applies it)
        preprocessing_from_dict(meta["preprocessing"])
    except InputError as e:
        raise CheckpointError(f"{f}: preprocessing: {e}") from None
    d = meta["data"]
    for key, types in (("spec", (str,)), ("sha256", (str,)), ("n", (int, type(None)))):
        check_json_type(d.get(key), types, f"{f}: data.{key}", error=CheckpointError)
    if meta["privacy"] is not None:
        missing = [k for k in ("epsilon", "delta") if k not in meta["privacy"]]
        if missing:  # a claim is an (ε, δ): every audit tests it
            raise CheckpointError(f"{f}: privacy: missing key(s) {', '.join(missing)} (or null for no claim)")
        for key in ("epsilon", "delta"):
            if key in meta["privacy"]:
                check_json_type(meta["privacy"][key], (float, type(None)), f"{f}: privacy.{key}", error=CheckpointError)
        # The values too: every audit and report tests this claim, and a NaN, negative ε or δ >= 1 would be
        # refused there as if the user had typed it (`expected --claimed-epsilon >= 0`), or printed as a claim.
        eps, delta = meta["privacy"].get("epsilon"), meta["privacy"].get("delta")
        if eps is not None and not eps >= 0:  # ε = inf (no noise) is a claim; NaN is not
            raise CheckpointError(f"{f}: privacy.epsilon: expected a number >= 0 (or Infinity), got {eps}")
        if delta is not None and not 0 <= delta < 1:
            raise CheckpointError(f"{f}: privacy.delta: expected a number in [0, 1), got {delta}")
    return meta


def check_unchanged(run_dir: Path, name: str, why: str, *, written: str = "the run was written") -> None:
    """Refuse (one CheckpointError line ending with ``why``) the file ``name`` of a folder dpaudit wrote (a run, saved
    gradient canaries) when its content differs from the sha256 the folder's manifest recorded then (a folder
    copied without its manifest is not checked)."""
    from dpaudit.fileio import read_manifest, sha256_file

    manifest = read_manifest(run_dir)
    path = Path(run_dir) / name
    if manifest is not None and name in manifest["files"] and sha256_file(path) != manifest["files"][name]:
        raise CheckpointError(f"{path} changed since {written} (its sha256 differs from the folder's manifest); {why}")


def check_split_indices(parts: Mapping[str, np.ndarray], n: int | None, source: str) -> dict[str, np.ndarray]:
    """The splits as int64 arrays after checking they are integers (not floats, which would be truncated),
    in ``[0, n)`` (a negative index would wrap around to another record) and unique within each split.
    Splits may share records (a reference model's members are drawn from the target's public aux split).
    One CheckpointError line otherwise."""
    out = {}
    for name, a in parts.items():
        a = np.asarray(a)
        if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
            raise CheckpointError(f"{source}: {name} must be a 1-d array of integer indices, got {a.dtype} {a.shape}")
        a = a.astype(np.int64)
        if a.size and a.min() < 0:
            raise CheckpointError(f"{source}: {name} holds a negative index ({int(a.min())})")
        if n is not None and a.size and a.max() >= n:
            raise CheckpointError(f"{source}: {name} holds index {int(a.max())}, out of range for {n} records")
        if len(np.unique(a)) != len(a):
            raise CheckpointError(f"{source}: {name} holds a repeated index")
        out[name] = a
    return out


# Relative tolerance between a recorded ε and the same accountant's ε of the recorded event: the record is
# written from that very computation, so only float noise separates them.
CLAIM_RTOL = 1e-6


def reaccount_claim(privacy: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Re-account a run's privacy claim from its recorded mechanism (``privacy.event``, the ledger of
    :mod:`dpaudit.events`, with the recorded accountant, neighbouring relation and δ).

    None when nothing can be re-accounted (no claim, no recorded event, an accountant or event this dpaudit
    cannot evaluate); else ``{"recorded", "recomputed", "accountant", "delta", "match"}``. Formal: the
    recomputed ε is the accountant's bound for the recorded mechanism. An event that does not parse (edited:
    a string for σ, a negative q) gives ``recomputed`` None, ``match`` False and the reason as ``unreadable``."""
    from dpaudit.accounting import ACCOUNTANTS, make_accountant
    from dpaudit.errors import DPAuditError
    from dpaudit.events import event_from_dict

    if not privacy or not isinstance(privacy.get("event"), dict):
        return None
    accountant = privacy.get("accountant", "rdp")
    recorded, delta = privacy.get("epsilon"), privacy.get("delta")
    if accountant not in ACCOUNTANTS or not isinstance(recorded, int | float) or not isinstance(delta, int | float):
        return None
    try:  # dpaudit writes only events it reads back: one that does not parse was edited, and is not verified
        event = event_from_dict(privacy["event"])
    except (DPAuditError, ValueError, TypeError, KeyError) as e:
        return {"recorded": float(recorded), "recomputed": None, "accountant": accountant, "delta": float(delta),
                "match": False, "unreadable": str(e)}  # fmt: skip
    try:
        acc = make_accountant(accountant, neighbouring=privacy.get("neighbouring", "add_remove"))
        recomputed = float(acc.compose(event).epsilon(float(delta)))
    except (DPAuditError, ValueError, TypeError, KeyError):
        return None
    recorded = float(recorded)
    match = (recorded == recomputed) or bool(np.isclose(recorded, recomputed, rtol=CLAIM_RTOL, atol=0.0))
    return {
        "recorded": recorded,
        "recomputed": recomputed,
        "accountant": accountant,
        "delta": float(delta),
        "match": match,
    }


def edited_note(run_dir: Path) -> str | None:
    """One line for every audit and report when the run's checkpoint.json differs from what dpaudit wrote there
    (its sha256 in the run's manifest): its metrics and settings, which the report shows, were edited. (Its claim
    is re-accounted on its own, :func:`claim_mismatch_note`.)"""
    try:
        check_unchanged(Path(run_dir), CHECKPOINT_FILE, "")
    except CheckpointError:
        return (
            f"{CHECKPOINT_FILE} changed since dpaudit wrote this run (its sha256 differs from the run's manifest): "
            "the metrics and settings it records are shown as edited, not as measured"
        )
    return None


def claim_mismatch_note(privacy: Mapping[str, Any] | None) -> str | None:
    """One line for every audit and report when a run's recorded ε differs from its recorded mechanism's."""
    check = reaccount_claim(privacy)
    if check is None or check["match"]:
        return None
    if check["recomputed"] is None:
        return (
            f"claim unverified: checkpoint.json's recorded mechanism (privacy.event) cannot be read "
            f"({check['unreadable']}); the file was edited or written by other software. This audit tests the claim "
            "as recorded."
        )
    # Both claims, rounded up and printed in the order computed (dpaudit.numfmt.ordered): never "8 but 8".
    recorded, recomputed = numfmt.ordered(check["recorded"], check["recomputed"], left_up=True, right_digits=6)
    return (
        f"claim mismatch: checkpoint.json records ε = {recorded}, but its recorded mechanism "
        f"re-accounts to ε = {recomputed} ({check['accountant']}, δ = {numfmt.exact(check['delta'])}); "
        "the file was edited or written by other software. This audit tests the claim as recorded."
    )


def load_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """Load a state dict from safetensors, or from a torch file with ``weights_only=True``.

    Pickle files (.pkl/.pickle) are refused: unpickling runs arbitrary code.
    """
    path = check_weights_file(path)  # exists, a regular file, .safetensors or a torch file (never a pickle)
    if path.suffix.lower() == ".safetensors":
        from safetensors import SafetensorError

        try:
            return load_safetensors(path)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{path}: corrupt or truncated safetensors file ({e})") from None
    try:  # .pt, .pth, .bin
        with warnings.catch_warnings():  # torch's own warnings about the pickle inside: our line says it
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)  # safe: tensors and primitives only
    except Exception:  # torch's own message advises weights_only=False, i.e. running the file's pickle
        raise CheckpointError(
            f"{path}: not a plain state_dict of tensors; loading it would need pickle, which can run "
            "arbitrary code and which dpaudit never does: save the weights with safetensors, or "
            "torch.save(model.state_dict())"
        ) from None
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a plain state_dict (name -> tensor){_training_checkpoint_hint(obj)}")
    return dict(obj)


def _training_checkpoint_hint(obj: Any) -> str:
    """What to save instead, for a training loop's checkpoint dict (PyTorch's tutorial saves ``{"epoch": ...,
    "model_state_dict": ..., "optimizer_state_dict": ...}``): the key that holds the model's tensors."""
    if not isinstance(obj, dict):
        return ""
    keys = [
        k for k, v in obj.items() if isinstance(v, dict) and v and all(isinstance(t, torch.Tensor) for t in v.values())
    ]
    if len(keys) != 1:
        return ""
    shown = ", ".join(map(str, list(obj)[:6])) + (", …" if len(obj) > 6 else "")
    return (
        f"; it is a training checkpoint (keys {shown}): save the model's weights alone, "
        f"torch.save(checkpoint[{keys[0]!r}], 'weights.pt')"
    )


# Wrappers that prefix every parameter name: Opacus' GradSampleModule ("_module."), torch's
# DistributedDataParallel / DataParallel ("module."), torch.compile ("_orig_mod."); they nest.
WRAPPER_PREFIXES = ("_module.", "module.", "_orig_mod.")


def strip_wrapper_prefixes(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with wrapper prefixes removed, as long as *every* key carries the same one."""
    out = dict(state)
    while out:
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in out)), None)
        if prefix is None:
            break
        out = {k[len(prefix) :]: v for k, v in out.items()}
    return out


def _unshared_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict on the CPU with every name holding its own copy: safetensors refuses
    tensors that share memory, as tied weights do (``head.weight = emb.weight``); the file then holds
    both names with equal values, as ``model.state_dict()`` shows them."""
    state, seen = {}, set()
    for k, v in model.state_dict().items():
        t = v.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        state[k] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return state


def as_saved(model: nn.Module, spec: ModelSpec) -> nn.Module:
    """``model`` as :func:`load_run` gives it back from :func:`save_run`'s file: built from ``spec`` on the CPU
    (seeded: nothing drawn from torch's global generator), holding the weights save_run writes
    (:func:`_unshared_state`, which safetensors keeps bit for bit), in eval mode. Its logits are the reloaded run's
    bit for bit; the trained model's own may differ in the last bits (on a GPU, inside a wrapper)."""
    rebuilt = build_model(spec, seed=0)
    load_state_into(rebuilt, _unshared_state(model), "the trained model")
    return rebuilt.eval()


def _tied_names(model: nn.Module) -> list[list[str]]:
    """Groups of state-dict names that are one tensor in ``model`` (tied weights)."""
    groups: dict[tuple, list[str]] = {}
    for k, v in model.state_dict(keep_vars=True).items():
        groups.setdefault((v.data_ptr(), tuple(v.shape), v.stride()), []).append(k)
    return [names for names in groups.values() if len(names) > 1]


def as_state_dict(state: Mapping[str, Any], source: str) -> dict[str, torch.Tensor]:
    """A foreign state dict (torch tensors or numpy arrays, wrapper prefixes allowed) as CPU tensors."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{source}: expected a mapping of parameter names to arrays, got {type(state).__name__}")
    out = {}
    for k, v in strip_wrapper_prefixes(state).items():
        if not isinstance(k, str):
            raise CheckpointError(f"{source}: parameter names must be strings, got {k!r}")
        if isinstance(v, Mapping):  # flax.linen's {"params": {"Dense_0": {"kernel": ...}}}
            raise CheckpointError(
                f"{source}: {k!r} holds a nested mapping (a JAX/Flax parameter tree?); give a flat mapping of the "
                "model's parameter names (e.g. '1.weight') to arrays, dense kernels transposed to torch's (out, in)"
            )
        try:
            out[k] = v.detach().to("cpu") if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))
        except (TypeError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{source}: parameter {k} is not a numeric array ({e})") from None
    return out


def _listed(items: list[str], limit: int = 10, sep: str = ", ") -> str:
    return sep.join(items[:limit]) + (f", … ({len(items) - limit} more)" if len(items) > limit else "")


def load_state_into(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> nn.Module:
    """Copy ``state`` into ``model`` after checking names and shapes match exactly (wrapper prefixes
    such as Opacus' ``_module.`` or DDP's ``module.`` are removed first, from the file's names and from the
    model's own: a factory may return a wrapper, as ``torch.compile(m)``, or keep every layer under a child
    named ``module``, and the weights saved from it carry the prefix)."""
    state = as_state_dict(state, source)
    own = model.state_dict()
    name_in_model = dict(zip(strip_wrapper_prefixes(own), own, strict=True))  # compared name -> the model's
    expected = {k: own[name] for k, name in name_in_model.items()}
    compared = {name: k for k, name in name_in_model.items()}
    for model_names in _tied_names(model):  # tied weights: a file may hold one name of each (safetensors' save_model)
        names = [compared[k] for k in model_names]
        given = [k for k in names if k in state]
        for k in given[1:]:
            same_shape = state[k].shape == state[given[0]].shape
            if not same_shape or not torch.equal(state[k], state[given[0]]):
                raise CheckpointError(
                    f"{source}: {given[0]} and {k} are one tied tensor in the model but differ in the weights"
                )
        for k in names:
            if given and k not in state:
                state[k] = state[given[0]]
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k} has shape {list(state[k].shape)}, expected {list(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing {_listed(missing)}")
        if unexpected:
            parts.append(f"unexpected {_listed(unexpected)}")
        if shapes:
            parts.append(_listed(shapes, sep="; "))
        hint = ""
        transposed = [k for k, v in expected.items() if k in state and v.ndim == 2 and state[k].shape == v.T.shape]
        if transposed or any(k.rsplit(".", 1)[-1].rsplit("/", 1)[-1] == "kernel" for k in unexpected):
            # A dense kernel of JAX/Flax, Keras or TF is (in, out); torch's Linear weight is (out, in). A square
            # one loads untransposed without any error: the model then computes something else.
            hint = (
                "; a Flax/Keras/TF dense kernel is (in, out) and torch's Linear weight (out, in): save each kernel "
                "transposed, as NAME.weight (square ones too, which no shape check can catch)"
            )
        raise CheckpointError(f"{source}: weights do not match the model spec ({'; '.join(parts)}){hint}")
    for k, v in expected.items():
        if not state[k].is_floating_point() == v.is_floating_point():
            raise CheckpointError(f"{source}: tensor {k} has dtype {state[k].dtype}, expected {v.dtype}")
    model.load_state_dict({name_in_model[k]: state[k].to(expected[k].dtype) for k in expected})
    return model


BUILD_BEFORE_CHECK_BYTES = 64 * 2**20  # a model up to this size is built first, then compared tensor by tensor


def check_weights_fit_spec(spec: ModelSpec, state: Mapping[str, Any], source: str) -> None:
    """Refuse weights whose number of values differs from the spec's parameter count, counted without
    building the model (a spec of 10^9 parameters beside 38 KB of weights fails before 6 GB are allocated)."""
    from dpaudit.budget import model_parameters

    have = sum(int(np.prod(getattr(v, "shape", ()))) for v in state.values())
    want = model_parameters(spec)
    # Only where building the model would cost real memory: smaller mismatches get load_state_into's
    # message, which names the tensors that differ.
    if want > have and 4 * want > BUILD_BEFORE_CHECK_BYTES:
        raise CheckpointError(
            f"{source}: weights do not match the model spec: they hold {have} values, the spec {want} parameters"
        )


def as_run(run: Any) -> Any:
    """``run`` itself, or the run loaded from it when it is a path (``str`` or ``os.PathLike``): the attacks take a
    loaded :class:`Run`, while the CLI and :func:`dpaudit.workflows.audit_checkpoint` take the run directory, so
    a notebook passing the path got ``AttributeError: 'str' object has no attribute 'spec'``."""
    return load_run(run) if isinstance(run, str | os.PathLike) else run


def load_run(path: Path | str) -> Run:
    """Load and validate a run directory (no unpickling anywhere)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: {input_problem(path, directory=True).replace('directory', 'run directory', 1)}")
    if path.is_file():
        if path.suffix.lower() in (".pkl", ".pickle", ".pt", ".pth"):
            raise CheckpointError(
                f"{path}: refusing a pickle-based file; a dpaudit run is a directory "
                "(model.safetensors + checkpoint.json)"
            )
        raise CheckpointError(f"{path}: expected a run directory, got a file")
    meta = read_meta(path)
    try:
        # A python spec imports and calls its factory here: the only code a run names, and only when it is the
        # user's own project's (never the standard library, an installed package or a file inside this run:
        # dpaudit.user_code.load_users_own); every other field is data.
        with not_from(path):
            spec = model_spec_from_checkpoint(meta["model"])
            state = load_weights_file(path / WEIGHTS_FILE)
            # before the model is built: a huge spec beside small weights fails here, not after allocating it
            check_weights_fit_spec(spec, strip_wrapper_prefixes(state), str(path / WEIGHTS_FILE))
            model = build_model(spec, seed=0)  # seeded: loading draws nothing from torch's global generator
    except InputError as e:
        raise CheckpointError(f"{path / CHECKPOINT_FILE}: bad model spec: {e}") from None
    load_state_into(model, state, str(path / WEIGHTS_FILE))
    # Weights or members put in by hand (another model's weights, a split edited to other members): checkpoint.json's
    # claim, metrics and data no longer describe them, and every audit, attack and report would say they did.
    check_unchanged(
        path,
        WEIGHTS_FILE,
        "the claim, metrics and member list in checkpoint.json describe the weights trained there, not these: "
        "to audit these weights, make a run of them with `dpaudit import`",
    )
    model.eval()
    split_file = path / SPLIT_FILE
    if not (split_file.exists() or split_file.is_symlink()):
        raise CheckpointError(f"{path}: missing {SPLIT_FILE} (the member list)")
    check_input_file(split_file, error=CheckpointError)  # a pipe, a device, a broken link: said, never read
    check_unchanged(
        path,
        SPLIT_FILE,
        "the member list decides what every membership attack and audit measures, and cannot be recomputed "
        "without retraining, so it is not trusted",
    )
    try:
        with np.load(split_file, allow_pickle=False) as z:
            parts = {name: np.asarray(z[name]) for name in SPLIT_NAMES}
    except Exception as e:
        raise CheckpointError(f"{split_file}: corrupt split file ({type(e).__name__}: {e})") from None
    parts = check_split_indices(parts, meta["data"].get("n"), str(split_file))
    s = meta["split"]
    splits = Splits(**parts, seed=int(s.get("seed", 0)), fractions=tuple(s.get("fractions", ())))
    return Run(path=path, meta=meta, spec=spec, model=model, splits=splits)
