"""Every setting a registered trainer is given is honoured or refused, never silently ignored.

The walk: each field of :class:`TrainConfig`, :class:`DPConfig` and :class:`PerfConfig` set away from its default
(:data:`VARIANTS`; a new field without a variant fails :func:`test_every_config_field_has_a_variant`), for each
trainer of the registry. A cell passes when the trainer refuses it (InputError) or its outcome (weights, claim,
performance record) differs from the default's; an identical outcome is a setting silently ignored. The cells where
an identical outcome is right are listed in :data:`UNOBSERVABLE`, each with its reason.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
import torch

from dpaudit.errors import InputError
from dpaudit.models import build_model, default_spec
from dpaudit.training.algorithms import TRAINERS
from dpaudit.training.config import (
    OPTION_READERS,
    PERTURBATION_ALGOS,
    DPConfig,
    PerfConfig,
    TrainConfig,
    check_config_read,
)

# One value away from the default per field (a field of the DP config is varied only for the private trainers).
VARIANTS = {
    "epochs": 2, "steps": 3, "batch_size": 4, "lr": 0.3, "momentum": 0.5, "weight_decay": 0.2, "seed": 7,
    "clip": 3.0, "noise_multiplier": 0.5, "target_epsilon": 8.0, "delta": 1e-6, "sampling": "shuffle",
    "accountant": "pld", "secure_noise": True, "sample_rate": 0.3, "jl_projections": 8,
    "device": "cpu", "max_physical_batch": 4, "clipping": "loop", "backend": "jax", "autocast": "bf16",
}  # fmt: skip
NON_BATCHED = (*PERTURBATION_ALGOS, "dpagd", "dpagd-huber")
# (field, algo) -> why the same outcome is right there (allowed, not required: a chunked sum may differ in its bits).
UNOBSERVABLE: dict[tuple[str, str], str] = {
    **{
        (f, a): "the exact solve / full-batch descent takes no minibatch steps; the defaults 30, 64, 0.1 are values "
        "the recipes fill in, so they cannot be told from given (`dpaudit train` refuses them given; the record drops "
        "them: settings_read)"
        for f in ("epochs", "batch_size", "lr")
        for a in NON_BATCHED
    },
    **{
        ("delta", a): "a pure ε-DP claim holds at every δ (Dwork & Roth 2014, Def. 2.4 with δ = 0)"
        for a in ("outpert", "objpert")
    },
    **{
        ("max_physical_batch", a): "performance only: the chunked private step sums the same clipped gradients"
        for a in OPTION_READERS["max_physical_batch"]
    },
    ("accountant", "outpert-gaussian"): "its claim is accounted with PLD whatever is asked (ConvexLearner.claim), "
    "so pld is what it does (check_config_read lets it through)",
    # fit_model resolves the device (resolve_device) before any trainer runs; "cpu" is where every trainer on this
    # machine runs, and the numpy learners always do.
    **{("device", a): "cpu, where every trainer runs on this machine" for a in TRAINERS},
}


def _base(algo: str) -> TrainConfig:
    dp = None
    if TRAINERS[algo].private:
        kw = {"target_epsilon": 4.0} if algo in NON_BATCHED else {"noise_multiplier": 1.0}
        if algo.endswith("-jl"):
            kw.update(jl_projections=2, accountant="pld")
        dp = DPConfig(**kw)
    return TrainConfig(
        algo=algo,
        epochs=1,  # steps None: --steps overrides --epochs (TrainConfig.num_steps), so each is varied alone
        batch_size=8,
        lr=0.1,
        weight_decay=0.1 if algo in NON_BATCHED else 0.0,
        dp=dp,
    )


def _variant(config: TrainConfig, field: str):
    """(config, perf) with ``field`` at its variant, or None where the field is not part of the trainer's configs."""
    value = VARIANTS[field]
    if field in PerfConfig.__dataclass_fields__:
        return config, PerfConfig(**{field: value})
    if field in DPConfig.__dataclass_fields__:
        if config.dp is None:
            return None  # refused as a whole: Trainer.__init__ (a non-private trainer given a DP config)
        kw = {field: value}
        if field in ("noise_multiplier", "target_epsilon"):  # exactly one of them
            kw = {"noise_multiplier": None, "target_epsilon": None, field: value}
        if field == "accountant" and config.dp.accountant == "pld":
            kw[field] = "rdp"
        return dataclasses.replace(config, dp=dataclasses.replace(config.dp, **kw)), PerfConfig()
    return dataclasses.replace(config, **{field: value}), PerfConfig()


def _outcome(config: TrainConfig, perf: PerfConfig, monkeypatch):
    rng = np.random.default_rng(0)
    X = torch.tensor(rng.normal(size=(40, 5)), dtype=torch.float32)
    y = (X[:, 0] > 0).long()
    kind = {"kind": "logreg"} if config.algo in NON_BATCHED else {"kind": "mlp", "hidden": (4,)}
    model = build_model(default_spec(**kind, input_shape=(5,), n_classes=2), seed=0)
    out = TRAINERS[config.algo](config, perf).fit(model, X, y)
    return torch.cat([p.detach().flatten() for p in out.model.parameters()]), out.privacy, out.performance


@pytest.fixture
def fast_accounting(monkeypatch):
    """The DP-SGD trainers' ε and σ calibration replaced by functions of the event and accountant, and of the target
    (a JL PLD evaluation takes seconds): a changed setting still changes the claim."""
    from dpaudit.training import dpsgd

    def fake(event, delta, accountant="rdp", **kw):
        return float(zlib.crc32(repr((event, accountant)).encode()))

    monkeypatch.setattr(dpsgd, "epsilon_for", fake)
    monkeypatch.setattr(dpsgd, "calibrate_noise_multiplier", lambda *, target_epsilon, **kw: 10.0 / target_epsilon)


def test_every_config_field_has_a_variant():
    fields = {*TrainConfig.__dataclass_fields__, *DPConfig.__dataclass_fields__, *PerfConfig.__dataclass_fields__}
    assert fields - {"algo", "dp"} == set(VARIANTS)


# Each fit of the JL trainers takes a jvp per direction, and outpert-gaussian's claim a PLD evaluation: 10-16 s each
# walk on the shared 2-core machine; the fast cases below refuse their unread settings.
SLOW_WALKS = ("dpsgd-jl", "dpadam-jl", "outpert-gaussian")


@pytest.mark.parametrize(
    "algo", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW_WALKS else a for a in sorted(TRAINERS)]
)
def test_a_setting_a_trainer_is_given_is_honoured_or_refused(algo, fast_accounting, monkeypatch):
    """Planted (each fails here): check_config_read removed from Trainer.__init__ (autocast with dpsgd-jl, clip
    with outpert, max_physical_batch with sgd, ...); "momentum" read by adam again; backend jax let through."""
    config = _base(algo)
    reference = _outcome(config, PerfConfig(), monkeypatch)
    ignored = []
    for field in VARIANTS:
        try:
            cell = _variant(config, field)
            if cell is None:
                continue
            got = _outcome(*cell, monkeypatch)
        except InputError:
            continue
        same = torch.equal(got[0], reference[0]) and got[1:] == reference[1:]
        if same and (field, algo) not in UNOBSERVABLE:
            ignored.append(field)
    assert not ignored, ignored


@pytest.mark.parametrize(
    ("algo", "config", "perf", "flag"),
    [
        ("dpsgd-jl", {}, {"autocast": "bf16"}, "--autocast"),  # the JL estimate in float32 only (the known cell)
        ("dpadam-jl", {}, {"clipping": "ghost"}, "--clipping"),
        ("sgd", {}, {"max_physical_batch": 8}, "--max-physical-batch"),
        ("outpert", {"clip": 5.0}, {}, "--clip"),
        ("objpert", {"sampling": "shuffle"}, {}, "--sampling"),
        ("dpagd", {"accountant": "pld"}, {}, "--accountant"),
        ("outpert", {}, {"device": "cuda"}, "--device"),
        ("adam", {"momentum": 0.9}, {}, "--momentum"),
        ("dpagd", {"momentum": 0.9}, {}, "--momentum"),
        ("dpsgd", {"jl_projections": 8, "accountant": "pld"}, {}, "--jl-projections"),  # NOT_GIVEN: None (pass 23)
    ],
)
def test_the_unread_setting_is_named_in_one_line(algo, config, perf, flag):
    """The refusal is check_options_read's line, as `dpaudit train` gives it (CUDA is never touched: refused first)."""
    base = _base(algo)
    dp_fields = {k: v for k, v in config.items() if k in DPConfig.__dataclass_fields__}
    rest = {k: v for k, v in config.items() if k not in dp_fields}
    cfg = dataclasses.replace(base, dp=dataclasses.replace(base.dp, **dp_fields) if dp_fields else base.dp, **rest)
    with pytest.raises(InputError, match=rf"^{flag} does not apply to --algo {algo} \(it is read by --algo "):
        check_config_read(algo, cfg, PerfConfig(**perf))
    with pytest.raises(InputError, match=rf"^{flag} does not apply to --algo {algo} "):
        TRAINERS[algo](cfg, PerfConfig(**perf))


def test_output_perturbation_with_the_gaussian_mechanism_takes_the_accountant_it_is_accounted_with():
    """outpert-gaussian's claim is accounted with PLD (convex.ConvexLearner.claim): --accountant pld asks for what it
    does and is not refused, unlike every other non-DP-SGD trainer (dpagd above). Planted (mutation pass 23): the
    exemption dropped, or taken for rdp instead of pld."""
    base = _base("outpert-gaussian")
    cfg = dataclasses.replace(base, dp=dataclasses.replace(base.dp, accountant="pld"))
    check_config_read("outpert-gaussian", cfg, PerfConfig())
    TRAINERS["outpert-gaussian"](cfg, PerfConfig())
    with pytest.raises(InputError, match=r"^--accountant does not apply to --algo outpert \("):
        check_config_read("outpert", dataclasses.replace(cfg, algo="outpert"), PerfConfig())


def test_a_torch_trainer_refuses_the_jax_backend_and_jax_trainer_still_builds():
    with pytest.raises(InputError, match=r"^DPSGDTrainer trains with torch, not --backend jax: use "):
        TRAINERS["dpsgd"](_base("dpsgd"), PerfConfig(backend="jax"))
    jb = pytest.importorskip("dpaudit.training.jax_backend")
    assert jb.JaxTrainer(_base("dpsgd"), PerfConfig(backend="jax")).reference.perf.backend == "torch"


def test_a_run_recorded_with_a_setting_its_algorithm_never_read_still_loads_for_reference_models():
    """An adam run trained with --momentum 0.9 before that was refused recorded it (Adam ignored it): its reference
    models train without it, as the run did. Planted: configs_from_meta without settings_read, or keeping every
    recorded performance field -> refused."""
    from dpaudit.training.run import configs_from_meta

    training = {**_base("adam").to_dict(), "momentum": 0.9}
    performance = {**PerfConfig().to_dict(), "max_physical_batch": 8}  # recorded before 88aca7b refused it
    config, perf = configs_from_meta({"training": training, "performance": performance})
    assert config.momentum == 0.0 and config.lr == 0.1 and perf == PerfConfig()
    TRAINERS["adam"](config, perf)
    # A DP-SGD run keeps what it read.
    performance = {**PerfConfig().to_dict(), "max_physical_batch": 8, "clipping": "loop"}
    config, perf = configs_from_meta({"training": _base("dpsgd").to_dict(), "performance": performance})
    assert (perf.max_physical_batch, perf.clipping) == (8, "loop")
