"""A small model zoo built from JSON-serialisable specs, and users' own modules by factory.

No BatchNorm in the zoo: it mixes examples within a batch, so one example's gradient depends on
the others and per-example clipping no longer bounds its influence. GroupNorm/LayerNorm are
per-example and safe. A user's module (kind ``python``) may hold BatchNorm for non-private
training; the private trainers refuse it (:func:`check_private_layers`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import math
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import torch
from torch import nn

from dpaudit.errors import InputError
from dpaudit.user_code import first_line, load_users_own
from dpaudit.validation import check_int_fields, read_json

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "elu": nn.ELU}
MODEL_KINDS = ("logreg", "mlp", "cnn", "rnn", "python")
INPUT_DTYPES = ("float32", "int64")  # of a python model's input: features, or token ids
MAX_RECORD_VALUES = 2**26  # values in one record of a python model's input (a 4K RGB image holds 2.5e7): 256 MiB


def looks_channels_last(shape: Sequence[int]) -> bool:
    """Whether a record of ``shape`` meant as (channels, height, width) looks (height, width, channels): CIFAR's
    32 x 32 x 3 would read as 32 channels of 32 x 3 images. Only square images are taken for channels-last (a
    (channels, length, 1) series is a legitimate layout)."""
    if len(shape) != 3:
        return False
    c, h, w = shape
    return w in (1, 3, 4) and c == h > 4


def channels_last_message(what: str, shape: Sequence[int]) -> str:
    c, h, w = shape
    return (
        f"{what} reads a record as (channels, height, width), but feature shape {list(shape)} looks channels-last "
        f"(height, width, channels); store X as N x {w} x {c} x {h}, e.g. X.transpose(0, 3, 1, 2)"
    )


# Set while a saved run's spec is read back (model_spec_from_checkpoint): specs refused for new runs since, but built
# and saved before, still load.
_LOADING_SAVED_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("dpaudit_loading_saved_run", default=False)


def _check_activation(name: str) -> None:
    if name not in ACTIVATIONS:
        raise InputError(f"unknown activation {name!r}; valid: {', '.join(ACTIVATIONS)}")


@dataclass(frozen=True)
class ModelSpec:
    """Base of all model specs: input shape (without batch) and number of classes."""

    kind: ClassVar[str] = ""
    input_shape: tuple[int, ...]
    n_classes: int
    # Optional names of the input features, in the order the model reads them (tabular data): `dpaudit
    # import` checks a CSV's header against them (dpaudit.data.check_feature_names). Not architecture:
    # left out of to_dict when None, so specs without names serialise as before.
    feature_names: tuple[str, ...] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        check_int_fields(self)  # types and sizes of a spec read from JSON, before any is used
        object.__setattr__(self, "input_shape", tuple(int(s) for s in self.input_shape))
        if self.n_classes < 2:
            raise InputError(f"expected n_classes >= 2, got {self.n_classes}")
        for k, v in asdict(self).items():
            if isinstance(v, list):
                object.__setattr__(self, k, tuple(v))
        names = self.feature_names
        if names is not None:
            if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names):
                raise InputError("expected feature_names to be a list of column names")
            if len(set(names)) != len(names) or len(names) != math.prod(self.input_shape):
                raise InputError(
                    f"expected feature_names to hold {math.prod(self.input_shape)} distinct names (one per input "
                    f"feature), got {len(names)}"
                )

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": self.kind}
        for k, v in asdict(self).items():
            if (k == "feature_names" and v is None) or (k == "input_dtype" and v == "float32"):
                continue
            d[k] = list(v) if isinstance(v, tuple) else v
        return d

    def build(self) -> nn.Module:
        raise NotImplementedError


@dataclass(frozen=True)
class LogRegSpec(ModelSpec):
    kind: ClassVar[str] = "logreg"

    def build(self) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(self.input_shape), self.n_classes))


@dataclass(frozen=True)
class MLPSpec(ModelSpec):
    kind: ClassVar[str] = "mlp"
    hidden: tuple[int, ...] = (128,)
    activation: str = "tanh"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_activation(self.activation)
        if any(h < 1 for h in self.hidden):
            raise InputError(f"expected hidden sizes >= 1, got {list(self.hidden)}")
        # The CLI refuses an empty --hidden (workflows.runs.parse_ints); the library and a JSON spec do too, rather
        # than silently build the linear model under the name mlp. A run saved with one still loads
        # (model_spec_from_checkpoint): its weights are that linear model's.
        if not self.hidden and not _LOADING_SAVED_RUN.get():
            raise InputError(
                "an mlp needs at least one hidden layer, got hidden=[] (that would be a linear model): give "
                "widths such as hidden=[128], or use the logreg model (LogRegSpec, --model logreg) for a linear model"
            )

    def build(self) -> nn.Module:
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(self.input_shape)
        for h in self.hidden:
            layers += [nn.Linear(width, h), ACTIVATIONS[self.activation]()]
            width = h
        layers.append(nn.Linear(width, self.n_classes))
        return nn.Sequential(*layers)


@dataclass(frozen=True)
class CNNSpec(ModelSpec):
    """Conv(3x3) -> GroupNorm -> activation blocks, average pooling to ``pool`` x ``pool``, linear head.
    Needs image-shaped input (channels, height, width).

    ``pool`` = 1 is global average pooling, which discards where a stroke is: on digits it caps the
    non-private test accuracy near 0.85 (and DP-SGD at epsilon 8 near 0.80); 2 keeps the quadrants and
    reaches 0.97 / 0.90 (benchmarks/RESULTS.md, "Seed algorithms at full strength"). Checkpoints written
    before the field existed hold no ``pool`` and mean 1 (:data:`LEGACY_SPEC_FIELDS`)."""

    kind: ClassVar[str] = "cnn"
    channels: tuple[int, ...] = (16, 32)
    activation: str = "tanh"
    groups: int = 4
    pool: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_activation(self.activation)
        if len(self.input_shape) != 3:
            raise InputError(
                f"cnn needs image-shaped input (channels, height, width), got feature shape {list(self.input_shape)}"
            )
        if looks_channels_last(self.input_shape):
            raise InputError(channels_last_message("cnn", self.input_shape))
        if any(c < 1 or c % self.groups for c in self.channels):
            raise InputError(
                f"cnn channels must be positive multiples of groups={self.groups}, got {list(self.channels)}"
            )
        if self.pool < 1:
            raise InputError(f"expected cnn pool >= 1, got {self.pool}")

    def build(self) -> nn.Module:
        layers: list[nn.Module] = []
        c_in = self.input_shape[0]
        for i, c in enumerate(self.channels):
            layers += [
                nn.Conv2d(c_in, c, 3, padding=1),
                nn.GroupNorm(self.groups, c),
                ACTIVATIONS[self.activation](),
            ]
            if i < len(self.channels) - 1 and min(self.input_shape[1:]) >= 2 ** (i + 2):
                layers.append(nn.AvgPool2d(2))
            c_in = c
        layers += [nn.AdaptiveAvgPool2d(self.pool), nn.Flatten(), nn.Linear(c_in * self.pool**2, self.n_classes)]
        return nn.Sequential(*layers)


class RecurrentLayer(nn.Module):
    """LSTM/GRU built from ``nn.Linear`` cells (as Opacus' DPLSTM), so that per-example gradient
    machinery (vmap, ghost norms) sees only Linear layers. Gate layout follows torch.nn.LSTM/GRU."""

    def __init__(self, cell: str, input_size: int, hidden_size: int, reverse: bool = False) -> None:
        super().__init__()
        self.cell, self.hidden_size, self.reverse = cell, hidden_size, reverse
        gates = 4 if cell == "lstm" else 3
        self.ih = nn.Linear(input_size, gates * hidden_size)
        self.hh = nn.Linear(hidden_size, gates * hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, time, features) -> (batch, hidden)
        batch, steps, _ = x.shape
        xi = self.ih(x)  # input projections for all steps at once
        h = x.new_zeros(batch, self.hidden_size)
        c = x.new_zeros(batch, self.hidden_size)
        order = range(steps - 1, -1, -1) if self.reverse else range(steps)
        H = self.hidden_size
        for t in order:
            if self.cell == "lstm":
                g = xi[:, t] + self.hh(h)
                i, f, gg, o = (
                    g[:, :H].sigmoid(),
                    g[:, H : 2 * H].sigmoid(),
                    g[:, 2 * H : 3 * H].tanh(),
                    g[:, 3 * H :].sigmoid(),
                )
                c = f * c + i * gg
                h = o * c.tanh()
            else:  # GRU (torch.nn.GRU equations)
                gh = self.hh(h)
                gi = xi[:, t]
                r = (gi[:, :H] + gh[:, :H]).sigmoid()
                z = (gi[:, H : 2 * H] + gh[:, H : 2 * H]).sigmoid()
                n = (gi[:, 2 * H :] + r * gh[:, 2 * H :]).tanh()
                h = (1 - z) * n + z * h
        return h


class RNNClassifier(nn.Module):
    def __init__(self, spec: RNNSpec) -> None:
        super().__init__()
        self.embedding = nn.Embedding(spec.vocab_size, spec.embed_dim)
        self.forward_rnn = RecurrentLayer(spec.cell, spec.embed_dim, spec.hidden_size)
        self.backward_rnn = (
            RecurrentLayer(spec.cell, spec.embed_dim, spec.hidden_size, reverse=True) if spec.bidirectional else None
        )
        self.head = nn.Linear(spec.hidden_size * (2 if spec.bidirectional else 1), spec.n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        e = self.embedding(tokens)
        h = self.forward_rnn(e)
        if self.backward_rnn is not None:
            h = torch.cat([h, self.backward_rnn(e)], dim=1)
        return self.head(h)


@dataclass(frozen=True)
class RNNSpec(ModelSpec):
    """Embedding + (bi)LSTM/GRU over token ids of shape (length,)."""

    kind: ClassVar[str] = "rnn"
    vocab_size: int = 0
    embed_dim: int = 16
    hidden_size: int = 32
    cell: str = "lstm"
    bidirectional: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cell not in ("lstm", "gru"):
            raise InputError(f"unknown rnn cell {self.cell!r}; valid: lstm, gru")
        if self.vocab_size < 2:
            raise InputError("rnn needs token data with a vocabulary (e.g. synthetic-tokens:...)")
        if len(self.input_shape) != 1:
            raise InputError(f"rnn needs token sequences of shape (length,), got {list(self.input_shape)}")

    def build(self) -> nn.Module:
        return RNNClassifier(self)


@dataclass(frozen=True)
class PythonSpec(ModelSpec):
    """A user's own ``nn.Module``: ``factory`` names ``"package.module:function"`` (imported with the
    current directory first, as ``--trainer``), called as ``function(**kwargs)``; the module must map a
    batch ``(B, *input_shape)`` of ``input_dtype`` (``float32``, or ``int64`` token ids) to logits
    ``(B, n_classes)`` (checked with a forward pass on zeros at every build).

    ``source_sha256``: the sha256 of the factory's source file, recorded when the spec is made; a
    checkpoint whose factory source changed since still loads when the parameter names and shapes
    match (they are checked), with a warning. Trust: building the model imports and runs the named
    factory's module, which must be the user's own project's code (a file under the current directory or
    ``PYTHONPATH``, not the standard library, an installed package, dpaudit or the run being loaded:
    :func:`dpaudit.user_code.load_users_own`); nothing else is executed.
    """

    kind: ClassVar[str] = "python"
    factory: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    source_sha256: str | None = None
    # What the module reads: float32 features, or int64 token ids (an Embedding first). Left out of
    # to_dict when float32, so the specs of runs saved before this field existed read the same.
    input_dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        if math.prod(self.input_shape) > MAX_RECORD_VALUES:
            # every build runs the module on two zero records of this shape: a stranger's [10**9, 10**9] asked torch
            # for 8e18 bytes (an internal error), [40000, 40000] would take 12.8 GB before any check
            raise InputError(
                f"input_shape {list(self.input_shape)} holds {math.prod(self.input_shape)} values per record, "
                f"more than {MAX_RECORD_VALUES} (the model is built by running it on two records of this shape)"
            )
        if self.source_sha256 is not None and not (
            isinstance(self.source_sha256, str) and re.fullmatch(r"[0-9a-f]{64}", self.source_sha256)
        ):
            raise InputError(f"expected source_sha256 to be 64 hex digits (a sha256), got {self.source_sha256!r}")
        if self.input_dtype not in INPUT_DTYPES:
            raise InputError(f"expected input_dtype 'float32' or 'int64' (token ids), got {self.input_dtype!r}")
        if not isinstance(self.kwargs, dict):
            raise InputError(f"'kwargs' of a python model must be a JSON object, got {type(self.kwargs).__name__}")
        try:
            object.__setattr__(self, "kwargs", json.loads(json.dumps(self.kwargs)))  # a private, JSON-only copy
        except (TypeError, ValueError) as e:
            raise InputError(f"'kwargs' of a python model must be JSON-serialisable ({e})") from None
        current = factory_source_sha256(self.factory)  # imports the factory's module: fails early when it cannot
        if self.source_sha256 is None:
            object.__setattr__(self, "source_sha256", current)
        elif current != self.source_sha256:
            warnings.warn(
                f"the source file of model factory {self.factory} changed since this spec was recorded "
                f"(sha256 {current[:12]}… != {self.source_sha256[:12]}…); the weights are still checked "
                "name by name and shape by shape",
                UserWarning,
                stacklevel=2,
            )

    def build(self) -> nn.Module:
        fn = load_factory(self.factory)
        try:
            model = fn(**self.kwargs)
        except Exception as e:  # the user's code: any failure is one line naming the factory
            raise InputError(f"model factory {self.factory}(**{self.kwargs}) failed: {first_line(e)}") from e
        if not isinstance(model, nn.Module):
            raise InputError(
                f"model factory {self.factory} returned a {type(model).__name__}; expected a torch.nn.Module"
            )
        self._check_logits(model)
        return model

    def _zeros(self, dtype: str) -> torch.Tensor:
        return torch.zeros((2, *self.input_shape), dtype=getattr(torch, dtype))

    def _runs_on(self, model: nn.Module, dtype: str) -> bool:
        try:
            with torch.no_grad():
                model(self._zeros(dtype))
        except Exception:  # the user's code: any failure means no
            return False
        return True

    def _check_logits(self, model: nn.Module) -> None:
        """A forward pass on two zero records must give logits of shape (2, n_classes)."""
        expected = (2, self.n_classes)
        was_training = model.training
        model.eval()
        zeros = self._zeros(self.input_dtype)
        try:
            with torch.no_grad():
                out = model(zeros)
        except Exception as e:
            if zeros.is_meta:  # a forward reading values (.item(), bool(t): nn.TransformerEncoder's causal-mask
                return  # detection) cannot run on the meta device (budget.model_parameters); the real build checks
            # Two zero records are all padding for a token model masking id 0 (src_key_padding_mask=x == 0), and in
            # eval mode torch's encoder takes its nested-tensor fast path, which raises on a record without an
            # unpadded token ("to_padded_tensor: at least one constituent tensor should have non-zero numel"). The
            # trainers run the model in training mode, which has no fast path: the shape is checked there.
            out = self._training_mode_output(model, zeros)
            if out is None:
                self._refuse_forward(model, e)
        finally:
            model.train(was_training)
        self._check_output(model, out, expected)

    def _training_mode_output(self, model: nn.Module, x: torch.Tensor):
        """The model's output on ``x`` in training mode (without gradients), or None if that forward fails too."""
        model.train()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):  # dropout's masks: torch's global stream untouched
                return model(x)
        except Exception:  # the user's code: the eval-mode failure is the one reported
            return None
        finally:
            model.eval()  # as the refusal's own probes (_runs_on) expect

    def _refuse_forward(self, model: nn.Module, e: Exception) -> NoReturn:
        """The one line for a forward on the two zero records that failed (in eval mode and in training mode)."""
        hint = ""
        wide = (p.dtype for p in model.parameters() if p.is_floating_point() and p.dtype != torch.float32)
        other = next(wide, None)
        if self.input_dtype == "float32" and self._runs_on(model, "int64"):  # e.g. an Embedding first
            hint = '; it runs on int64 token ids: give the spec "input_dtype": "int64" (or token data)'
        elif other is not None:  # e.g. a factory ending in .double(): the records are always float32
            hint = (
                f"; its parameters are {str(other).removeprefix('torch.')} and dpaudit's records float32: "
                "return the model in float32"
            )
        raise InputError(
            f"model factory {self.factory}: forward on a {self.input_dtype} batch of shape "
            f"{[2, *self.input_shape]} failed: {first_line(e)}{hint}"
        ) from e

    def _check_output(self, model: nn.Module, out, expected: tuple[int, int]) -> None:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        if shape != expected:
            got = list(shape) if shape is not None else type(out).__name__
            hint = ""
            if isinstance(out, tuple | list | dict):
                hint = "; return the logits alone (e.g. a wrapper module whose forward returns the logits of the tuple)"
            elif self.n_classes == 2 and shape in ((2,), (2, 1)):
                hint = (
                    "; a binary model with one logit z (sigmoid, BCEWithLogitsLoss) gives the same probabilities as "
                    "the two logits torch.cat([torch.zeros_like(z), z], dim=1) for z of shape (B, 1)"
                )
            raise InputError(
                f"model factory {self.factory}: a batch of shape {[2, *self.input_shape]} gives output {got}; "
                f"expected logits of shape {list(expected)} (input_shape {list(self.input_shape)}, "
                f"n_classes {self.n_classes}){hint}"
            )
        self._check_per_record(model)
        if looks_like_probabilities(out):
            raise InputError(
                f"model factory {self.factory}: its outputs are probabilities (every row in [0, 1] and summing to 1), "
                "but dpaudit's losses and attacks read logits (a softmax of probabilities is not the model's "
                "prediction); return the scores before the softmax (a log-softmax is fine)"
            )

    def _two_records(self, model: nn.Module) -> torch.Tensor:
        """Two different records of the input shape and dtype on which ``model`` (in eval mode) gives finite
        outputs: zeros and a ramp; token ids: every position id 2, and every position id 3.

        Token records are tried in turn, the first the model runs on with finite logits kept: ids 2 and 3, then
        ids 0 and 1 alternating in opposite phase, then all 0 and all 1 (a vocabulary of 2). A model that masks its
        padding id (0 for BERT's tokenizer, 1 for RoBERTa's and fairseq's) in a softmax over positions gives NaN
        logits on an all-padding record, and NaN != NaN made both checks that read these records skip themselves
        silently: the old records, all 0 and all 1, let a random tensor outside the state dict or a batch mean in
        such a model pass. Two records of one id each also differ after a position-free pooling, which two
        alternations of the same two ids do not."""
        if self.input_dtype != "int64":
            ramp = torch.linspace(-1.0, 1.0, math.prod(self.input_shape)).reshape(self.input_shape)
            return torch.stack([torch.zeros(self.input_shape), ramp])
        phase = torch.arange(math.prod(self.input_shape), dtype=torch.int64).reshape(self.input_shape) % 2
        constant = [
            torch.stack([torch.full(self.input_shape, v, dtype=torch.int64) for v in ab]) for ab in ((2, 3), (0, 1))
        ]
        candidates = [constant[0], torch.stack([phase, 1 - phase]), constant[1]]
        for records in candidates:
            try:
                with torch.no_grad(), torch.random.fork_rng(devices=[]):
                    out = model(records)
            except Exception:  # the user's code: e.g. id 3 beyond a vocabulary of 3
                continue
            if isinstance(out, torch.Tensor) and (out.is_meta or bool(torch.isfinite(out).all())):
                return records
        return candidates[-1]

    def check_state_dict_is_the_model(self) -> None:
        """Two builds from different seeds, the second loaded with the first's state dict, must compute the same
        logits: a run is saved as its state dict, and every later command rebuilds the model from the factory
        and loads the weights. State outside the state dict drawn at random (a tensor kept as a plain
        attribute, a non-persistent buffer) made the reloaded model another model, which every attack and
        audit then measured, silently. Not tested: a model whose outputs are random in eval mode."""
        first, second = build_model(self, seed=1), build_model(self, seed=2)
        second.load_state_dict(first.state_dict())
        first.eval()
        second.eval()
        records = self._two_records(first)
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                a, again, b = first(records), first(records), second(records)
        except Exception:  # the build's own check ran these records through the model already
            return
        if a.is_meta or not torch.equal(a, again):
            return
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-5):
            raise InputError(
                f"model factory {self.factory}: built twice and loaded with the same state dict, the model gives "
                "different logits: part of it is outside its state dict (a tensor kept as a plain attribute, or a "
                "non-persistent buffer, drawn at random?), so the model reloaded from a saved run would be another "
                "model; register such tensors with register_buffer(name, tensor) or draw them from a fixed "
                "torch.Generator"
            )

    def _check_per_record(self, model: nn.Module) -> None:
        """Each record's logits must not depend on the other records of its batch (eval mode): two different
        records together and each alone. dpaudit evaluates models in batches and scores every record on its own,
        and per-example clipping needs each example's loss to be a function of that example alone (a batch mean
        in the forward pass makes the trained function differ from the clipped one). Not tested: a model that
        cannot take these records alone, or whose outputs are random in eval mode."""
        was_training = model.training
        model.eval()
        try:
            pair = self._two_records(model)
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                together = model(pair)
                alone = [torch.cat([model(pair[:1]), model(pair[1:])]) for _ in range(2)]
        except Exception:  # e.g. token id 1 beyond a vocabulary of one, a model on the meta device
            return
        finally:
            model.train(was_training)
        if together.is_meta or alone[0].shape != together.shape or not torch.equal(alone[0], alone[1]):
            return
        # float32 rounding differs between batch sizes (other kernels) by ~1e-6 relative; mixing moves O(1)
        if (together - alone[0]).abs().max() > 1e-3 * (1 + alone[0].abs().max()):
            raise InputError(
                f"model factory {self.factory}: a record's logits depend on the other records of its batch (in eval "
                "mode: a mean or other statistic over the batch dimension, or its row in the batch, as from a "
                "positional embedding of torch.arange(x.size(0)) on batch-first input?); dpaudit scores each record "
                "on its own and per-example clipping needs each example's loss to depend on that example alone: "
                "compute statistics per record (LayerNorm, GroupNorm), index positions along the sequence"
            )


def looks_like_probabilities(out: torch.Tensor) -> bool:
    """Whether every row of a model's outputs ``(B, K)`` lies in [0, 1] and sums to 1 (to 1e-5: float32
    rounding of a softmax is ~1e-7), i.e. the model ends with a softmax. Logits doing so by chance would
    need K random scores to sum to 1 to 1e-5 in every row."""
    if out.ndim != 2 or out.is_meta:  # a model built on the meta device (sizes only) has no values
        return False
    out = out.detach().double()
    sums = out.sum(1)
    return bool(((out >= 0) & (out <= 1)).all() and ((sums - 1).abs() <= 1e-5).all())


def load_factory(path: str):
    """The callable named by ``"package.module:function"`` (see :class:`PythonSpec`): the user's own code only
    (:func:`dpaudit.user_code.load_users_own`), as a file names it and a stranger's run may."""
    fn = load_users_own(path, "model factory", "'package.module:function'")
    if not callable(fn):
        raise InputError(f"model factory {path} is a {type(fn).__name__}, not callable")
    return fn


def factory_source_sha256(path: str) -> str:
    """sha256 of the source file that defines the factory (its module's file when it has none)."""
    import inspect
    import sys

    fn = load_factory(path)
    source = None
    try:
        source = inspect.getsourcefile(fn)
    except TypeError:  # a builtin or C callable
        pass
    source = source or getattr(sys.modules.get(getattr(fn, "__module__", "") or ""), "__file__", None)
    if not source:
        raise InputError(f"model factory {path}: cannot find its source file to record its hash")
    h = hashlib.sha256()
    with open(source, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


SPECS: dict[str, type[ModelSpec]] = {s.kind: s for s in (LogRegSpec, MLPSpec, CNNSpec, RNNSpec, PythonSpec)}


def read_model_spec(
    path: str | Path, *, tokens: bool = False, fits: Callable[[ModelSpec], None] | None = None
) -> ModelSpec:
    """A model spec from a JSON file in :meth:`ModelSpec.to_dict`'s format (``docs/model-spec.md``);
    any problem is one :class:`InputError` line naming the file. ``tokens``: the data are token ids, so
    a ``python`` spec that does not say its ``input_dtype`` reads ``int64`` (one that says ``float32``
    is refused by the data check, :func:`dpaudit.training.run.check_spec_fits`). ``fits``: a check of the
    spec against the data (raising InputError), run before a ``python`` factory's model is built and run: a
    spec whose input_shape is not the data's ([32, 32, 3] for N x 3 x 32 x 32 records) was reported as the
    factory's forward failing on that shape (torch's "expected input ... to have 3 channels"), not as the
    mismatch it is."""

    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: expected a model spec JSON file, got a directory")
    d = read_json(path)  # a missing file, a pipe or a device: one line, nothing opened  # size, depth and number limits
    if tokens and isinstance(d, dict) and d.get("kind") == "python" and "input_dtype" not in d:
        d = {**d, "input_dtype": "int64"}
    try:
        spec = model_spec_from_dict(d)
        if fits is not None:
            fits(spec)
        if isinstance(spec, PythonSpec):
            # the factory's failures surface now, before any data is read or trained on; seeded, so reading a spec
            # draws nothing from torch's global generator
            build_model(spec, seed=0)
            spec.check_state_dict_is_the_model()
        return spec
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:  # e.g. a string where a size belongs
        raise InputError(f"{path}: bad model spec ({e})") from None


def model_spec_from_dict(d: dict[str, Any]) -> ModelSpec:
    if not isinstance(d, dict) or "kind" not in d:
        if isinstance(d, dict) and isinstance(d.get("model"), dict) and "kind" in d["model"]:  # docs/model-spec.md
            raise InputError(
                "model spec must be a JSON object with a 'kind'; this looks like a run's checkpoint.json, whose "
                "spec is its 'model' object: save that object alone as spec.json"
            )
        raise InputError("model spec must be a JSON object with a 'kind'")
    kind = d["kind"]
    if kind not in SPECS:
        raise InputError(f"unknown model {kind!r}; valid: {', '.join(SPECS)}")
    cls = SPECS[kind]
    fields = {f for f in cls.__dataclass_fields__}
    unknown = set(d) - fields - {"kind"}
    if unknown:
        raise InputError(f"unknown field(s) for model {kind!r}: {', '.join(sorted(unknown))}")
    try:
        return cls(**{k: v for k, v in d.items() if k != "kind"})
    except TypeError as e:
        raise InputError(f"bad model spec for {kind!r}: {e}") from None


# Fields added to a zoo kind after runs were saved without them, with the value those runs were built with:
# a CNN checkpoint.json without "pool" was built with global average pooling (pool = 1).
LEGACY_SPEC_FIELDS: dict[str, dict[str, Any]] = {"cnn": {"pool": 1}}


def model_spec_from_checkpoint(d: dict[str, Any]) -> ModelSpec:
    """:func:`model_spec_from_dict` for a spec read back from a saved run (:data:`LEGACY_SPEC_FIELDS`; an mlp saved
    with no hidden layer, from before that was refused, still loads as the linear model it was trained as)."""
    if isinstance(d, dict) and d.get("kind") in LEGACY_SPEC_FIELDS:
        d = {**LEGACY_SPEC_FIELDS[d["kind"]], **d}
    token = _LOADING_SAVED_RUN.set(True)
    try:
        return model_spec_from_dict(d)
    finally:
        _LOADING_SAVED_RUN.reset(token)


def default_spec(
    kind: str, *, input_shape: tuple[int, ...], n_classes: int, vocab_size: int | None = None, **options: Any
) -> ModelSpec:
    """The spec for ``kind`` on data of the given shape, with optional overrides."""
    if kind not in SPECS:
        raise InputError(f"unknown model {kind!r}; valid: {', '.join(SPECS)}")
    extra: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    if kind == "rnn":
        extra["vocab_size"] = vocab_size or 0
    return model_spec_from_dict({"kind": kind, "input_shape": input_shape, "n_classes": n_classes, **extra})


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Train on one torch thread, the caller's thread count restored afterwards (also on an exception).

    Floating-point reductions depend on the thread count, so one thread gives the same weights on any machine;
    batches of 64 through a small model also run faster without the threads' synchronisation (measured 1.4 s vs
    4.6 s with 2 threads on a loaded 2-core machine). A bare ``torch.set_num_threads(1)`` in a job that joblib runs
    in-process (``workers=1``) left a notebook's torch on one thread for the rest of its session."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_model(spec: ModelSpec, *, seed: int | None = None, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Build the module; parameters initialised from ``seed`` (deterministic) when given."""
    if seed is None:
        model = spec.build()
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = spec.build()
    return model.to(dtype)


def check_private_layers(model: nn.Module) -> None:
    """Refuse, for private training (the DP trainers, the clippers, a DP claim at import), the layers whose
    training forward releases something of the data without noise: BatchNorm, InstanceNorm with
    ``track_running_stats=True``: it normalises each example by its own statistics,
    but its running mean and variance are averages over the training batches, saved with the model
    without noise (and used in eval mode), so no DP claim covers the released weights. So does an
    Embedding's ``max_norm``: the forward pass renormalises the looked-up rows of the weight in place
    (a record with a rare token shrinks that row when it is sampled, whatever the noise). (A user's own
    module that updates a buffer from the data is caught when training starts:
    :func:`check_buffers_unchanged`.)"""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            raise InputError(
                f"layer {name or type(m).__name__} is BatchNorm, which mixes examples in a batch so no "
                "per-example clipping can bound one example's influence (no DP claim holds); use GroupNorm "
                "or LayerNorm"
            )
        if isinstance(m, nn.Embedding | nn.EmbeddingBag) and m.max_norm is not None:
            raise InputError(
                f"layer {name or type(m).__name__} is {type(m).__name__} with max_norm: it renormalises, in place "
                "and without noise, the rows of the tokens each batch holds, so the weights show which tokens the "
                "training data contain (no DP claim covers it); remove max_norm (DP-SGD clips the gradients)"
            )
        if isinstance(m, nn.modules.instancenorm._InstanceNorm) and m.track_running_stats:
            raise InputError(
                f"layer {name or type(m).__name__} is {type(m).__name__} with track_running_stats=True: its "
                "running mean and variance average the training batches and are saved with the model without "
                "noise (no DP claim covers them); use track_running_stats=False, GroupNorm or LayerNorm"
            )


def check_full_precision(
    params: list[torch.Tensor],
    remedy: str = "keep the parameters in float32 (autocast='bf16', --autocast bf16, runs the forward and backward "
    "passes in bfloat16)",
) -> None:
    """Refuse trainable parameters in a low-precision floating dtype (bfloat16, float16) for private
    training: per-example norms, clip factors, the clipped sum and the noise would all be computed in
    that dtype, and a clipped gradient can then exceed C (by ~0.5% in bfloat16: 8 mantissa bits), which
    the sensitivity bound of the DP claim does not allow (Abadi et al. 2016, Alg. 1 needs ‖ḡ_i‖ ≤ C)."""
    low = next((p.dtype for p in params if p.dtype not in (torch.float32, torch.float64)), None)
    if low is not None:
        raise InputError(
            f"the model's parameters are {str(low).removeprefix('torch.')}: per-example norms and the clipped "
            "sum in it let a clipped gradient exceed C (by ~0.5% in bfloat16), which the DP claim does not "
            f"allow; {remedy}"
        )


class ParameterWatch:
    """Catches a model whose training forward or backward pass modifies a parameter in place
    (``F.embedding(..., max_norm=...)`` renormalising the looked-up rows, a clamp or a normalisation of a
    weight inside ``forward``): DP-SGD's analysis covers θ_{t+1} = θ_t − η·(Σ_i clip(g_i) + N(0, σ²C²I))/B
    only (Abadi et al. 2016, Alg. 1), so a change of θ made from the batch outside that update is released
    without noise, and one made from θ alone cannot be told apart from it here. Frozen parameters
    (``requires_grad=False``, a fine-tuned model's backbone) are saved with the model too: watched alike.

    Two signals: every in-place tensor op bumps the parameter's version counter (the one autograd's
    in-place correctness checks use, PyTorch docs "Autograd mechanics"; read as ``Tensor._version``, None
    if a torch lacks it), also under ``no_grad`` and through ``detach()`` (cheap, read on every call); a
    write through ``.data`` does not, so the first call also compares the values of the trainable ones with
    a copy taken before it (once: one copy of the trained parameters; a frozen backbone is not copied)."""

    def __init__(self, params: list[torch.Tensor], *, copy_values: bool) -> None:
        self.params = params
        self.versions = [getattr(p, "_version", None) for p in params]
        self.values = [p.detach().clone() if p.requires_grad else None for p in params] if copy_values else None

    def check(self, model: nn.Module, during: str = "the training forward or backward pass") -> None:
        """Raise :class:`InputError` naming the first parameter of ``model`` that changed ``during`` what."""
        if self.values is None and [getattr(p, "_version", None) for p in self.params] == self.versions:
            return  # the per-step path: one list comparison
        for i, p in enumerate(self.params):
            moved = getattr(p, "_version", None) != self.versions[i]
            if not moved and self.values is not None and self.values[i] is not None:
                moved = not torch.equal(p.detach(), self.values[i])
            if moved:
                name = next((n for n, q in model.named_parameters() if q is p), f"#{i}")
                raise InputError(
                    f"parameter {name} was modified in place during {during} (e.g. F.embedding(..., max_norm=...), "
                    "or a weight clamped or renormalised in forward): DP-SGD noises only its own update, so a "
                    "change made there is released without noise (no DP claim covers it); remove it, or apply a "
                    "weight-only constraint after the optimizer step"
                )


def released_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the floating-point buffers saved with the model (its state dict's non-parameters)."""
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    return {
        n: b.detach().clone()
        for n, b in model.state_dict(keep_vars=True).items()
        if n not in params and b.is_floating_point()
    }


def _another_input(x: torch.Tensor) -> torch.Tensor:
    """An input of ``x``'s shape and dtype that differs from it everywhere and is still valid: features shifted
    by 1, token ids swapped between 0 and 1 (every vocabulary has those)."""
    return x + 1 if x.is_floating_point() else (x == 0).to(x.dtype)


def _reversed(r: torch.Tensor) -> torch.Tensor:
    """A record (a batch of one) with its features, pixels or tokens in reverse order: still valid."""
    return r.flip(tuple(range(1, r.dim()))) if r.dim() > 1 else r


# Modules whose training flag switches only their random draws (dropout) on or off.
_RANDOM_IN_TRAINING = (nn.modules.dropout._DropoutNd, nn.MultiheadAttention, nn.RNNBase)

# The functional dropouts (nn.Dropout* call them), each the identity in eval mode (PyTorch docs, torch.nn.Dropout:
# "during evaluation the module simply computes an identity function"), and attention's dropout_p.
_DROPOUTS = frozenset(
    {
        torch.nn.functional.dropout,
        torch.nn.functional.dropout1d,
        torch.nn.functional.dropout2d,
        torch.nn.functional.dropout3d,
        torch.nn.functional.alpha_dropout,
        torch.nn.functional.feature_alpha_dropout,
        torch.dropout,
        torch.alpha_dropout,
        torch.feature_dropout,
        torch.feature_alpha_dropout,
    }
)


class _NoDropout(torch.overrides.TorchFunctionMode):
    """Every functional dropout the identity (as in eval mode) and ``scaled_dot_product_attention``'s dropout_p 0,
    while the model stays in training mode: what :func:`_moves_with_row` compares a record's rows under.

    Why not the whole model in eval mode (as before): a row dependence under ``if self.training`` (``h * x.shape[0]``,
    ``h + torch.arange(x.size(0))``) next to ``F.dropout(h, p, training=self.training)`` then went unseen, and a
    ``training=True`` written out kept drawing, so the model was not tested; both trained under DP-SGD with their
    claimed ε. Why not the same random state per row: dropout draws one mask for the whole batch's shape, so a
    record alone or one row down gets another record's mask whatever the state. With the dropouts the identity,
    every other operation runs as in training and the forward is deterministic; a dropout's own mask is drawn
    independently of the data, so it is no row dependence of the records."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUTS:
            return args[0] if args else kwargs["input"]
        if func is torch.nn.functional.scaled_dot_product_attention:
            if len(args) > 4:
                args = (*args[:4], 0.0, *args[5:])
            kwargs = {**kwargs, "dropout_p": 0.0} if "dropout_p" in kwargs else kwargs
        return func(*args, **kwargs)


def rounding_tolerance(eps: float, reference: Any) -> float:
    """√eps·(1 + max|reference|): how far two evaluations of one function (logits) may differ by rounding alone,
    ``eps`` the machine epsilon they are computed in, ``reference`` one of them (a torch tensor or numpy array).

    Why: a dot product of width n in floating point is off by at most γ_n·Σ|a_k b_k|, γ_n = n·u/(1 − n·u), u = eps/2
    (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed. 2002, eq. (3.4) and Lemma 3.1); another
    batch size, kernel blocking or backend reorders the sums, so the two results differ by ~eps·√width per layer in
    practice (measured 2.3e-7·(1 + max) over 31 user models in float32: benchmarks/RESULTS.md, "the torch DP
    trainers and a record's row in the batch"). √eps (3.5e-4 in float32, 1.5e-8 in float64) is far above that and
    far below the O(1) change of a different function (a missing layer, a record's row or batch size in its
    logits); relative to 1 + max so that logits near 0 keep an absolute floor. A NaN in ``reference`` gives NaN,
    which no difference is within. Used by :func:`_moves_with_row` and the JAX backend's ``check_same_logits`` and
    ``check_alone_as_in_batch``."""
    return math.sqrt(eps) * (1 + float(abs(reference).max()))


def _moves_with_row(model: nn.Module, base: torch.Tensor, run, drew: list[bool]) -> bool:
    """Whether a record's logits change when it is evaluated alone or one row further down the batch (``base``
    rolled by one): the part of :func:`check_per_record_in_training` that keeps the records and moves their rows.
    ``run(batch, 0)`` is its forward from a fixed random state; ``drew``, whether the forwards so far drew random
    numbers. A forward that draws them (dropout) cannot be compared across rows (a row's mask goes to another
    record), so the modules whose training flag only switches dropout go to eval mode and every functional dropout
    becomes the identity (:class:`_NoDropout`), the rest still in training mode; the whole model goes to eval mode
    only if it still draws (random numbers of its own), and a forward still random then is not tested.

    Tolerance: rounding of one function evaluated at other batch sizes (other kernel blockings),
    :func:`rounding_tolerance` in the logits' dtype (eps 2^-10 for float32 under TF32 on a GPU), as the JAX
    backend's :func:`~dpaudit.training.jax_backend.check_alone_as_in_batch`: summation-order error is ~eps·√width
    per layer, far below √eps (3.5e-4 in float32), while a positional embedding of the row moves logits by O(1)."""
    if any(drew):
        for m in model.modules():
            if isinstance(m, _RANDOM_IN_TRAINING):
                m.eval()
        random_run = run

        def run(batch: torch.Tensor, state: int) -> torch.Tensor | None:
            with _NoDropout():
                return random_run(batch, state)

        del drew[:]
        same = run(base, 0)
        if any(drew):
            model.eval()
            del drew[:]
            same = run(base, 0)
        if any(drew):
            return False
    else:
        same = run(base, 0)
    if same is None or not same.is_floating_point():
        return False
    eps = torch.finfo(same.dtype).eps
    if same.dtype == torch.float32 and same.device.type == "cuda":
        if torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32:
            eps = 2.0**-10  # TF32: 10 mantissa bits (NVIDIA A100 whitepaper, "TF32")
    tol = rounding_tolerance(eps, same)

    def moves(out: torch.Tensor | None, ref: torch.Tensor) -> bool:  # NaN counts as a change
        return out is not None and (out.shape != ref.shape or not bool(((out - ref).abs() <= tol).all()))

    rolled = run(base.roll(1, 0), 0)
    if moves(None if rolled is None else rolled.roll(-1, 0), same):
        return True
    for i in range(base.shape[0]):
        try:
            alone = run(base[i : i + 1], 0)
        except Exception:  # a model that cannot take a batch of one (a squeeze): the rolled batch tells
            return False
        if moves(alone, same[i : i + 1]):
            return True
    return False


def check_per_record_in_training(model: nn.Module, x: torch.Tensor) -> None:
    """Refuse, for private training, a model whose training-mode forward lets a record's logits depend on
    the other records of its batch (a hand-written batch normalisation or batch centring under
    ``if self.training``, mixup of the hidden states): DP-SGD clips per-example gradients of a loss Σ_i ℓ_i
    in which ℓ_i depends on example i alone (Abadi et al. 2016, Alg. 1); with mixing, removing one record
    changes other records' gradients, so the clipped sum's sensitivity is no longer C, and the ghost
    method (norms from the batched pass) computes norms of another function. The build-time check
    (:meth:`PythonSpec._check_per_record`) runs in eval mode and cannot see it.

    How: a batch of four records (``x``'s first four, the missing ones shifted or reversed copies of the
    first) and, for each row j, the same batch with row j replaced (by a shifted copy, a reversed copy,
    and ``x``'s fifth record when there is one); every pass from the same random state (same shapes, so
    Dropout draws the same masks), and, if the forward draws random numbers, all of it again from a
    second random state (a random permutation in the forward, as mixup draws, may leave the rows it pairs
    unchanged in one draw). Every other row must keep its logits. A model whose passes differ from the
    same state (randomness outside torch's generator) or that cannot run on four records is not tested.
    Then the same records one row further down and each alone (:func:`_moves_with_row`): replacing records
    keeps every record's row and the batch size, so a positional embedding of ``torch.arange(x.size(0))``
    on batch-first input passed (a row-dependent transformer trained under DP-SGD with its claimed ε).
    The random state and the buffers are restored, every module's mode too.

    Why not two records and row 0 alone, as before: a standardisation (x - mean) / std over two records
    is ±1/√2 per feature, the sign of x_0 - x_1 alone, so a change of row 1 that kept every feature's
    order went unseen (a 1-wide standardised layer passed 124 of 200 random digit pairs, F.batch_norm
    106), and row 0 alone misses mixing that flows the other way (a cumulative sum over the batch: 100
    of 100 passed); mixup passed 54 of 100."""
    n = 4
    rows = [x[i : i + 1] for i in range(min(x.shape[0], n))]
    first = rows[0]
    fill = [_another_input(_another_input(first)), _reversed(first), _another_input(_reversed(first))]
    rows += fill[: n - len(rows)]
    base = torch.cat(rows)
    spare = [x[n : n + 1]] if x.shape[0] > n else []
    variants = []  # (row replaced, batch)
    for j, r in enumerate(rows):
        for other in [_another_input(r), _reversed(r), *spare]:
            variants.append((j, torch.cat([*rows[:j], other, *rows[j + 1 :]])))
    buffers = {n: b for n, b in model.named_buffers()}
    saved = {n: b.detach().clone() for n, b in buffers.items()}
    devices = [x.device] if x.device.type == "cuda" else []
    modes = [(m, m.training) for m in model.modules()]

    def generator_state() -> torch.Tensor:
        return torch.cuda.get_rng_state(x.device) if x.device.type == "cuda" else torch.get_rng_state()

    drew = []  # whether the forward drew random numbers (else one random state tells all)

    def run(batch: torch.Tensor, state: int) -> torch.Tensor | None:
        with torch.random.fork_rng(devices=devices):  # each pass from the same random state
            if state:  # the second state: the generator moved on by one draw
                torch.rand(1, device=x.device)
            before = generator_state()
            try:
                out = model(batch)
            finally:
                for name, b in buffers.items():
                    b.copy_(saved[name])
            drew.append(not torch.equal(generator_state(), before))
        if not isinstance(out, torch.Tensor) or out.is_meta or out.shape[:1] != batch.shape[:1]:
            return None
        return out if out.is_floating_point() else out.float()

    mixed = moved = untested = False
    try:
        model.train()
        with torch.no_grad():
            for state in range(2):
                same, again = run(base, state), run(base, state)
                if same is None or again is None:
                    return
                # float32 rounding: the same shapes run the same kernels (equal bits on a CPU; a GPU's atomics ~1e-6)
                scale = 1e-3 * (1 + float(same.abs().max()))
                if not bool(((again - same).abs() <= scale).all()):
                    return  # random from outside torch's generator: cannot tell mixing from noise
                for j, batch in variants:
                    try:
                        out = run(batch, state)
                    except Exception:  # a copy it cannot take (float token ids shifted out of the vocabulary)
                        out = None
                    if out is None:  # mixing not tested; the rows of the real records still are
                        untested = True
                        break
                    keep = [i for i in range(n) if i != j]
                    # NaN (a batch std of 0) counts as a change
                    if not bool(((out[keep] - same[keep]).abs() <= scale).all()):
                        mixed = True
                        break
                if mixed or untested or not any(drew):
                    break
            moved = not mixed and _moves_with_row(model, base, run, drew)
    except Exception:  # the user's code: a model that cannot run on four records is not tested here
        return
    finally:
        for m, training in modes:
            m.training = training
    if moved:
        raise InputError(
            "the model's output for a record depends on its row in the batch or on the batch size (an arange or a "
            "size over the batch dimension, e.g. a positional embedding of torch.arange(x.size(0)) on batch-first "
            "input?): under "
            "Poisson sampling one record added or removed moves the other records to other rows and changes their "
            "gradients, so per-example clipping no longer bounds the sensitivity by C; index positions along the "
            "sequence dimension"
        )
    if mixed:
        raise InputError(
            "a record's logits depend on the other records of its batch in training mode (a statistic over "
            "the batch dimension under `if self.training`, as BatchNorm computes, or mixup?): per-example "
            "clipping needs each record's loss to depend on that record alone (with mixing, one record moves "
            "other records' gradients, so the clipped sum's sensitivity is no longer C); compute statistics per record "
            "(LayerNorm, GroupNorm)"
        )


def check_buffers_unchanged(model: nn.Module, before: dict[str, torch.Tensor], x: torch.Tensor) -> None:
    """Refuse a model whose training forward pass changed a saved floating-point buffer as a function of
    the data (a running statistic, as BatchNorm's): DP-SGD noises the gradients only, so such a buffer
    would be released computed from the private records without noise. ``before``:
    :func:`released_buffers` before that pass; ``x``: its input.

    A changed buffer is told apart from one updated from the weights alone (spectral normalisation's
    power-iteration vectors: post-processing of the DP weights, allowed) by two more training-mode
    forward passes from ``before``, on one record of ``x`` and on a different input; the buffers are
    restored afterwards, and the random state is left untouched. (Counters such as
    ``num_batches_tracked`` are integers, and caches kept out of the state dict are not released.)"""
    current = model.state_dict(keep_vars=True)
    changed = [n for n, b in before.items() if n in current and not torch.equal(current[n].detach(), b)]
    if not changed:
        return
    after = released_buffers(model)

    def from_before(inp: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            state = model.state_dict(keep_vars=True)
            for n in changed:
                state[n].copy_(before[n])
            with torch.random.fork_rng(devices=[inp.device] if inp.device.type == "cuda" else []):
                model(inp)
            state = model.state_dict(keep_vars=True)
            return {n: state[n].detach().clone() for n in changed}

    one = x[:1]
    other = _another_input(one)
    try:
        a, b = from_before(one), from_before(other)
    except Exception:  # a model that cannot run on one record: whether the data moved the buffer is unknown
        a, b = {n: torch.zeros(1) for n in changed}, {n: torch.ones(1) for n in changed}
    finally:
        with torch.no_grad():
            state = model.state_dict(keep_vars=True)
            for n in changed:
                state[n].copy_(after[n])
    for n in changed:
        if not torch.equal(a[n], b[n]):
            raise InputError(
                f"buffer {n} changed with the data in a training forward pass: a statistic of the training data "
                "saved with the model without noise, which no DP claim covers; keep it out of the state dict "
                "(register_buffer(..., persistent=False)) or do not update it from the data"
            )
