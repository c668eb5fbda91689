"""Run directories: ``model.safetensors`` + ``checkpoint.json`` + ``split.npz``. Never pickle.

Loading validates the schema version, the keys, every tensor's name and shape against the model
spec and the data's content hash, so a checkpoint from a stranger is safe to open and a stale one
fails loudly instead of giving silently wrong numbers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpaudit.data import SPLIT_NAMES, Dataset, Splits, load_dataset, preprocessing_from_dict
from dpaudit.errors import CheckpointError, InputError
from dpaudit.fileio import write_atomic_dir
from dpaudit.models import ModelSpec, build_model, model_spec_from_dict

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


def save_run(
    out: Path,
    *,
    model: nn.Module,
    meta: dict[str, Any],
    splits: Splits,
    force: bool = False,
    arrays: dict[str, dict[str, np.ndarray]] | None = None,
) -> Path:
    """Save a run directory atomically. ``arrays`` maps extra ``.npz`` file names to their arrays
    (e.g. canaries); they are read back with ``allow_pickle=False``."""
    from safetensors.torch import save_file

    meta = {**meta, "schema_version": SCHEMA_VERSION, "versions": meta.get("versions") or versions()}
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise ValueError(f"checkpoint meta misses {missing}")
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}

    def write(tmp: Path) -> None:
        save_file(state, str(tmp / WEIGHTS_FILE))
        (tmp / CHECKPOINT_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        np.savez(tmp / SPLIT_FILE, **{name: getattr(splits, name) for name in SPLIT_NAMES})
        for fname, content in (arrays or {}).items():
            np.savez(tmp / fname, **content)

    return write_atomic_dir(Path(out), write, force=force)


@dataclass
class Run:
    """A loaded checkpoint: metadata, the model with its weights, preprocessing and splits."""

    path: Path
    meta: dict[str, Any]
    spec: ModelSpec
    model: nn.Module
    splits: Splits

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
        return CanarySet.load(self.path / meta["file"], meta)

    def whitebox_canaries(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Scores and inclusion bits of the run's white-box Dirac canaries
        (:mod:`dpaudit.training.dirac`), or None when it was trained without them."""
        meta = self.meta.get("whitebox_canaries")
        if not meta:
            return None
        path = self.path / meta["file"]
        try:
            with np.load(path, allow_pickle=False) as z:
                scores, included = np.asarray(z["scores"], dtype=np.float64), z["included"].astype(bool)
        except (OSError, KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: cannot read the white-box canaries ({e})") from None
        if scores.shape != included.shape or scores.shape != (int(meta["m"]),):
            raise CheckpointError(f"{path}: expected {meta['m']} white-box canary scores and bits")
        return scores, included

    def dataset(self) -> Dataset:
        """Reload the training data and check it is byte-for-byte the data the model saw."""
        d = self.meta["data"]
        try:
            ds = load_dataset(d["spec"], label_column=d.get("label_column"))
        except InputError as e:
            raise CheckpointError(f"{self.path}: cannot reload the run's data: {e}") from None
        if ds.sha256 != d["sha256"]:
            raise CheckpointError(
                f"{self.path}: the data {d['spec']!r} changed since training "
                f"(sha256 {ds.sha256[:12]}… != recorded {d['sha256'][:12]}…)"
            )
        return ds

    def logits(self, X: np.ndarray, batch: int = 2048) -> np.ndarray:
        """Model logits (float64) on raw (unpreprocessed) features: an array, or a lazy
        :class:`~dpaudit.data.RowView` (``dataset.view(idx)``) read and preprocessed a batch at a time."""
        return predict_logits(self.model, X, batch=batch, transform=self.preprocessing.transform)


def predict_logits(model: nn.Module, X: np.ndarray, batch: int = 2048, transform=None) -> np.ndarray:
    """Logits in float64, evaluated in eval mode without gradients, ``batch`` rows at a time.

    ``X``: preprocessed features, or raw ones with ``transform`` (the preprocessing, applied per
    batch); anything sliceable with a length (an array, a :class:`~dpaudit.data.RowView`)."""
    model.eval()
    param = next(model.parameters())
    out = []
    with torch.no_grad():
        for s in range(0, len(X), batch):
            xb = X[s : s + batch]
            xb = torch.as_tensor(np.array(xb if transform is None else transform(xb)), device=param.device)
            if xb.is_floating_point():
                xb = xb.to(param.dtype)
            out.append(model(xb).double().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0))


def _read_meta(path: Path) -> dict[str, Any]:
    f = path / CHECKPOINT_FILE
    if not f.is_file():
        raise CheckpointError(f"{path}: not a dpaudit run directory (no {CHECKPOINT_FILE})")
    try:
        meta = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{f}: expected a JSON object")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise CheckpointError(
            f"{f}: unknown schema_version {meta.get('schema_version')!r} (this dpaudit reads {SCHEMA_VERSION})"
        )
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise CheckpointError(f"{f}: missing key(s) {', '.join(missing)}")
    return meta


def load_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """Load a state dict from safetensors, or from a torch file with ``weights_only=True``.

    Pickle files (.pkl/.pickle) are refused: unpickling runs arbitrary code.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".pkl", ".pickle", ".joblib"):
        raise CheckpointError(f"{path}: refusing to load a pickle file (it can run arbitrary code); use safetensors")
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{path}: corrupt or truncated safetensors file ({e})") from None
    if suffix in (".pt", ".pth", ".bin"):
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)  # safe: tensors and primitives only
        except Exception as e:
            raise CheckpointError(
                f"{path}: cannot load with weights_only=True (not a plain state_dict?): {str(e).splitlines()[0]}"
            ) from None
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise CheckpointError(f"{path}: expected a plain state_dict (name -> tensor)")
        return dict(obj)
    raise CheckpointError(f"{path}: unsupported weights file type {suffix!r}; use .safetensors (or a .pt state_dict)")


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


def as_state_dict(state: Mapping[str, Any], source: str) -> dict[str, torch.Tensor]:
    """A foreign state dict (torch tensors or numpy arrays, wrapper prefixes allowed) as CPU tensors."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{source}: expected a mapping of parameter names to arrays, got {type(state).__name__}")
    out = {}
    for k, v in strip_wrapper_prefixes(state).items():
        if not isinstance(k, str):
            raise CheckpointError(f"{source}: parameter names must be strings, got {k!r}")
        try:
            out[k] = v.detach().to("cpu") if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))
        except (TypeError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{source}: parameter {k} is not a numeric array ({e})") from None
    return out


def _listed(items: list[str], limit: int = 10, sep: str = ", ") -> str:
    return sep.join(items[:limit]) + (f", … ({len(items) - limit} more)" if len(items) > limit else "")


def load_state_into(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> nn.Module:
    """Copy ``state`` into ``model`` after checking names and shapes match exactly (wrapper prefixes
    such as Opacus' ``_module.`` or DDP's ``module.`` are removed first)."""
    state = as_state_dict(state, source)
    expected = model.state_dict()
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
        raise CheckpointError(f"{source}: weights do not match the model spec ({'; '.join(parts)})")
    for k, v in expected.items():
        if not state[k].is_floating_point() == v.is_floating_point():
            raise CheckpointError(f"{source}: tensor {k} has dtype {state[k].dtype}, expected {v.dtype}")
    model.load_state_dict({k: state[k].to(expected[k].dtype) for k in expected})
    return model


def load_run(path: Path | str) -> Run:
    """Load and validate a run directory (no unpickling anywhere)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such run directory")
    if path.is_file():
        if path.suffix.lower() in (".pkl", ".pickle", ".pt", ".pth"):
            raise CheckpointError(
                f"{path}: refusing a pickle-based file; a dpaudit run is a directory "
                "(model.safetensors + checkpoint.json)"
            )
        raise CheckpointError(f"{path}: expected a run directory, got a file")
    meta = _read_meta(path)
    try:
        # A python spec imports and calls its factory here: the user's code, the only code a run names
        # (same trust as --trainer); every other field is data.
        spec = model_spec_from_dict(meta["model"])
        model = build_model(spec)
    except InputError as e:
        raise CheckpointError(f"{path / CHECKPOINT_FILE}: bad model spec: {e}") from None
    load_state_into(model, load_weights_file(path / WEIGHTS_FILE), str(path / WEIGHTS_FILE))
    model.eval()
    split_file = path / SPLIT_FILE
    if not split_file.is_file():
        raise CheckpointError(f"{path}: missing {SPLIT_FILE} (the member list)")
    try:
        with np.load(split_file, allow_pickle=False) as z:
            parts = {name: z[name].astype(np.int64) for name in SPLIT_NAMES}
    except Exception as e:
        raise CheckpointError(f"{split_file}: corrupt split file ({type(e).__name__}: {e})") from None
    s = meta["split"]
    splits = Splits(**parts, seed=int(s.get("seed", 0)), fractions=tuple(s.get("fractions", ())))
    return Run(path=path, meta=meta, spec=spec, model=model, splits=splits)
