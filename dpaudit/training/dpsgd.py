"""DP-SGD and DP-Adam: per-example clipping, Gaussian noise, and the privacy claim they support.

One logical step (Abadi et al. 2016, arXiv:1607.00133, Alg. 1):

1. sample a batch: Poisson (every record independently with probability q = B/N) or, with
   ``sampling="shuffle"``, the next B records of a fresh per-epoch permutation;
2. Σ_i g_i / max(1, ‖g_i‖/C) over the batch (:mod:`dpaudit.training.clipping`, split into
   physical chunks of at most ``PerfConfig.max_physical_batch`` examples, chunk sums added; on CUDA
   each chunk is padded to one of a few sizes, :func:`padded_size`, with rows of clip factor 0);
3. add N(0, σ²C²I) once to that sum and divide by the *expected* batch size B (not the realised
   Poisson size, which would make the divisor data dependent);
4. an SGD or Adam step on the result. The step is post-processing of the noisy gradient, so DP-Adam
   (Adam on the privatised gradient, as DP-Adam in Bu et al. 2021, arXiv:2102.03013, App. A) has
   the same claim as DP-SGD.

The privacy claim recorded in the checkpoint is an event from :mod:`dpaudit.events` that anyone
can re-account, together with the ε it gives at the chosen δ.
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Callable
from contextlib import closing, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from dpaudit import numfmt
from dpaudit.accounting import calibrate_noise_multiplier, dpsgd_event, epsilon_for
from dpaudit.errors import InputError, UnreachableTargetError
from dpaudit.events import Event, Gaussian, SelfComposed
from dpaudit.models import check_private_layers
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.base import Trainer, TrainOutcome, host_to_device, make_optimizer
from dpaudit.training.clipping import Clipper, check_autocast, make_clipper
from dpaudit.training.config import DPConfig
from dpaudit.validation import FLOAT32_MAX, check_non_negative, check_positive, check_positive_int

if TYPE_CHECKING:
    from dpaudit.hooks import GradientCanaries
    from dpaudit.training.dirac import DiracCanaries

POISSON_ANALYSIS = (
    "DP-SGD with Poisson subsampling at rate q = B/N, composed over all steps: the subsampled Gaussian "
    "mechanism under add/remove-one neighbours (Abadi et al. 2016, arXiv:1607.00133; Mironov et al. 2019, "
    "arXiv:1908.10530)."
)
SHUFFLE_ANALYSIS = (
    "Shuffled fixed-size batches, no amplification by subsampling claimed (accounting shuffling as Poisson "
    "under-reports ε: Chua et al. 2024, arXiv:2403.17673): each record is in one batch per epoch, so under "
    "replace-one neighbours (clipped-sum sensitivity 2C) each epoch is one Gaussian mechanism with noise "
    "multiplier σ/2, composed over the epochs touched."
)
JL_ANALYSIS = (
    "DP-SGD-JL with Poisson subsampling at rate q = B/N, composed over all steps: per-example norms are "
    "estimated with r JL projections, so a record's clipped gradient has norm up to C·Z_r, "
    "Z_r = 1/sqrt(chi2_r/r); each step is f-DP with f = T(Z_r, N(Z_r/σ, 1) || Z_r, N(0, 1)) before "
    "subsampling (Bu et al. 2021, arXiv:2102.03013, Lemma 4.3, Thm 4.1), accounted with PLD under add/remove "
    "neighbours. Not the plain DP-SGD formula, which under-reports ε for this mechanism."
)


@dataclass(frozen=True)
class PrivacySetting:
    """The settings the accountant needs, resolved for one training run.

    ``steps`` logical steps of expected batch size ``batch_size`` on ``dataset_size`` records.
    For ``shuffle``, an epoch is ⌈N/B⌉ steps (the last batch of a permutation may be shorter).
    """

    noise_multiplier: float
    batch_size: int
    dataset_size: int
    steps: int
    sampling: str
    rate: float | None = None  # a fixed Poisson rate q; None: batch_size / dataset_size
    jl_projections: int | None = None  # DP-SGD-JL: r JL projections (the JLGaussian event)

    def __post_init__(self) -> None:
        check_non_negative(noise_multiplier=self.noise_multiplier)
        check_positive_int(batch_size=self.batch_size)
        check_positive_int(dataset_size=self.dataset_size)
        check_positive_int(steps=self.steps)
        if self.batch_size > self.dataset_size:
            raise InputError(
                f"batch size {self.batch_size} is larger than the training set ({self.dataset_size} records)"
            )

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.dataset_size if self.rate is None else self.rate

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.dataset_size // self.batch_size)

    @property
    def epochs_touched(self) -> int:
        """Epochs (permutations) at least partly used by ``steps`` shuffled steps."""
        return -(-self.steps // self.steps_per_epoch)

    @property
    def neighbouring(self) -> str:
        return "add_remove" if self.sampling == "poisson" else "replace_one"

    def event(self) -> Event:
        """The mechanism as an event of :mod:`dpaudit.events`.

        Poisson: SelfComposed(PoissonSampled(q, Gaussian(σ)), T) under add/remove neighbours
        (Abadi et al. 2016, Alg. 1; the sampled Gaussian mechanism of Mironov et al. 2019).

        Shuffle: SelfComposed(Gaussian(σ), E) under replace-one neighbours. A replaced record
        changes one batch per epoch, whose clipped sum moves by at most 2C against noise σC; the
        other steps of the epoch have the same law on both datasets given the (secret, data
        independent) permutation, so each epoch is one Gaussian mechanism of sensitivity 2C, i.e.
        noise multiplier σ/2 (Dwork & Roth 2014, Thm A.1), and epochs compose adaptively. By the
        convention of :mod:`dpaudit.events` the event keeps σ and the accountant applies the
        factor 2 for ``replace_one`` (``dpaudit.accounting.base.replace_factor``); writing σ/2 in
        the event as well would count the factor twice and under-report ε.
        """
        if self.sampling == "poisson":
            return dpsgd_event(
                noise_multiplier=self.noise_multiplier,
                sample_rate=self.sample_rate,
                steps=self.steps,
                jl_projections=self.jl_projections,  # DP-SGD-JL: Bu et al. 2021, Lemma 4.3 / Thm 4.1
            )
        if self.jl_projections is not None:
            raise InputError("DP-SGD-JL is analysed for Poisson sampling only (Bu et al. 2021, Lemma 4.3)")
        return SelfComposed(Gaussian(self.noise_multiplier), self.epochs_touched)

    def with_noise(self, noise_multiplier: float) -> PrivacySetting:
        return PrivacySetting(
            noise_multiplier,
            self.batch_size,
            self.dataset_size,
            self.steps,
            self.sampling,
            self.rate,
            self.jl_projections,
        )


def calibrate(setting: PrivacySetting, dp: DPConfig) -> float:
    """The smallest noise multiplier whose claim meets ``dp.target_epsilon`` at ``dp.delta``
    (the accounting layer's calibration; the result provably meets the target).

    Remembered per question (the setting, target, δ and accountant: all it reads): the answer is a pure
    function of them, and the same question comes back, e.g. for every reference model of one recipe
    (``attacks.reference.train_models``: one calibration, not one per model) and for ``train --canaries``'
    design check before the training calibrates again."""
    return _calibrate(calibrate_noise_multiplier, setting, dp.target_epsilon, dp.delta, dp.accountant)


@functools.lru_cache(maxsize=256)
def _calibrate(
    root_finder: Callable[..., float], setting: PrivacySetting, target_epsilon: float, delta: float, accountant: str
) -> float:
    # ``root_finder`` is the accounting layer's calibrate_noise_multiplier, in the key so that a replaced one (a
    # test's fake) is asked, never a remembered answer of the real one.
    extra: dict[str, Any] = {}
    if setting.jl_projections is not None:
        from dpaudit.accounting.jl import epsilon_lower_bound

        q = setting.with_noise(1.0).event().event.sample_rate  # SelfComposed(PoissonSampled(q, JLGaussian))

        def floor(s: float) -> float:
            return epsilon_lower_bound(s, setting.jl_projections, q, setting.steps, delta)

        # Each PLD evaluation of the JL mixture takes tens of seconds: a fast formal lower bound answers an
        # unreachable target at once, and sigma to 1% (the claim is verified whatever the tolerance).
        extra = {"lower_bound": floor, "tol": 1e-2}
    try:
        return float(
            root_finder(
                target_epsilon=target_epsilon,
                delta=delta,
                make_event=lambda s: setting.with_noise(s).event(),
                accountant=accountant,
                neighbouring=setting.neighbouring,
                **extra,
            )
        )
    except UnreachableTargetError as e:
        raise UnreachableTargetError(
            f"ε = {numfmt.upper(target_epsilon)} at δ = {numfmt.exact(delta)} is unreachable for "
            f"{setting.steps} steps "
            f"({setting.sampling} sampling, batch {setting.batch_size} of {setting.dataset_size}): {e}"
        ) from None


def privacy_claim(setting: PrivacySetting, dp: DPConfig) -> dict[str, Any]:
    """The JSON-ready claim stored in the checkpoint; ``epsilon`` is recomputable from ``event``."""
    event = setting.event()
    epsilon = float(epsilon_for(event, dp.delta, dp.accountant, neighbouring=setting.neighbouring))
    return {
        "epsilon": epsilon,
        "delta": dp.delta,
        "accountant": dp.accountant,
        "neighbouring": setting.neighbouring,
        "event": event.to_dict(),
        "noise_multiplier": setting.noise_multiplier,
        "sample_rate": setting.sample_rate,
        "steps": setting.steps,
        "clip": dp.clip,
        "batch_size": setting.batch_size,
        "dataset_size": setting.dataset_size,
        "sampling": setting.sampling,
        "analysis": (
            JL_ANALYSIS
            if setting.jl_projections is not None
            else POISSON_ANALYSIS
            if setting.sampling == "poisson"
            else SHUFFLE_ANALYSIS
        ),
        "secure_noise": dp.secure_noise,
        # DP-SGD-JL only (other claims keep their keys): the r of the JLGaussian event
        **({"jl_projections": setting.jl_projections} if setting.jl_projections is not None else {}),
    }


def poisson_sampler(n: int, q: float, generator: torch.Generator) -> Callable[[], torch.Tensor]:
    """Indices of a Poisson sample: each of n records independently with probability q.

    Uniforms are drawn in float64 so that P(u < q) = q up to 2⁻⁵³ (float32 would round q to a
    multiple of 2⁻²⁴). The batch may be empty; it is never padded or resized.

    Drawn on the host (a CPU generator) whatever the training device: the batch size must be known
    on the host to shape the step, and a draw on a GPU would need a device-to-host sync per step
    (``nonzero``) to learn it; on the host the draw (n uniforms, ~1 ms per 10⁵ records) overlaps the
    GPU's queued work, and the same seed gives the same batches on every device. The indices reach
    the data's device in :func:`set_private_gradients` with one non-blocking copy.
    """

    def sample() -> torch.Tensor:
        return torch.nonzero(torch.rand(n, generator=generator, dtype=torch.float64) < q).squeeze(1)

    return sample


def shuffle_sampler(n: int, batch_size: int, generator: torch.Generator) -> Callable[[], torch.Tensor]:
    """Consecutive batches of a fresh random permutation per epoch (the last one may be shorter),
    so each record is in exactly one batch per epoch."""
    state = {"perm": torch.empty(0, dtype=torch.int64), "pos": n}

    def sample() -> torch.Tensor:
        if state["pos"] >= n:
            state["perm"], state["pos"] = torch.randperm(n, generator=generator), 0
        idx = state["perm"][state["pos"] : state["pos"] + batch_size]
        state["pos"] += batch_size
        return idx

    return sample


def noise_generator(device: torch.device, seed: int, secure: bool) -> torch.Generator:
    """The generator of the Gaussian noise: seeded from ``seed`` (reproducible) or, when ``secure``,
    from 64 bits of ``secrets`` (os.urandom). The generator itself (torch's Mersenne Twister on CPU,
    Philox on CUDA) is not a cryptographic one, and floating-point attacks on Gaussian sampling
    (Mironov 2012) are not addressed; ``secure`` only makes the noise unpredictable from the seed."""
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(64) if secure else seed)
    return gen


def set_private_gradients(
    clipper: Clipper,
    X: torch.Tensor,
    y: torch.Tensor,
    idx: torch.Tensor,
    *,
    clip: float,
    noise_std: float,
    batch_size: int,
    max_physical_batch: int | None,
    generator: torch.Generator,
    canaries: GradientCanaries | None = None,
    step: int = 0,
    pad: bool | None = None,
) -> None:
    """Set ``p.grad`` of every clipped parameter to (Σ_{i∈idx} clip_C(g_i) + N(0, noise_std² I)) / B.

    ``canaries`` (audits only; :class:`dpaudit.hooks.GradientCanaries`): the white-box gradient
    canaries of step ``step`` are added to the clipped sums before the noise, as more records would
    be, and the noisy sums are observed before the division by B.

    ``idx``: the batch's record indices on the host (as drawn by the samplers; indices already on
    the data's device are used as they are). The batch is processed in chunks of at most
    ``max_physical_batch`` examples (the physical batch cap: a Poisson batch of any size runs in
    bounded memory) whose clipped sums are added, so the result does not depend on the chunking
    (up to float rounding). The noise is
    added once, to the sum over the whole logical batch (Abadi et al. 2016, arXiv:1607.00133,
    Alg. 1, "add noise"), and the divisor is the expected batch size B, a constant (ibid., 1/L).
    An empty batch gives a noise-only step.

    ``pad`` (None: on CUDA only, where the clipper supports it): each chunk is padded to
    :func:`padded_size` rows with copies of its first row whose clip factor is exactly 0
    (:meth:`Clipper._clip_factors` proves the sum unchanged), so a run sees a few physical shapes
    instead of one per Poisson batch size (cuDNN builds an execution plan per new shape). The
    padding depends only on the batch size the host already knows, adds exactly 0 to the released
    sum, and changes neither the mechanism nor the claim.
    """
    # The previous step's gradients are replaced below and read by nothing before: release them now
    # rather than hold them through the clipping (non-private SGD sets them to None before its backward).
    for p in clipper.params:
        p.grad = None
    sums: list[torch.Tensor] | None = None
    chunk = max_physical_batch or max(len(idx), 1)
    if pad is None:
        pad = X.device.type == "cuda"
    pad = pad and getattr(clipper, "pads", False)
    # ``idx`` is drawn on the host (:func:`poisson_sampler`), so its size, and the chunks' sizes,
    # are known there without asking the device; it is sent to the data's device with one queued
    # copy per step (no host sync), while a memory-mapped X (StreamedFeatures) reads rows by the
    # host indices. Chunks are eager torch calls; padded, they take few distinct sizes.
    on_device = host_to_device(idx, y.device)
    one = len(idx) <= chunk  # one chunk: no split ops
    for part, dev in [(idx, on_device)] if one else zip(idx.split(chunk), on_device.split(chunk), strict=True):
        n = len(part)
        size = padded_size(n, max_physical_batch) if pad else n
        if size > n:  # padding rows: copies of the chunk's first row (a real, in-range record)
            dev = torch.cat([dev, dev[:1].expand(size - n)])
            part = part if isinstance(X, torch.Tensor) else torch.cat([part, part[:1].expand(size - n)])
        xb = X[dev] if isinstance(X, torch.Tensor) else X[part]
        grads = (clipper(xb, y[dev], clip, valid=n) if size > n else clipper(xb, y[dev], clip)).grads
        if sums is None:
            sums = list(grads)  # fresh tensors owned by us: accumulate in place
        else:
            torch._foreach_add_(sums, list(grads))
    if sums is None:
        sums = [torch.zeros_like(p) for p in clipper.params]
    if canaries is not None:
        sums = list(canaries.inject(step, sums))
    # One multi-tensor kernel per operation over all parameters (torch's foreach ops; on a GPU a
    # launch per parameter would cost more host time than the arithmetic), same values as a loop.
    if noise_std > 0:
        torch._foreach_add_(sums, _gaussian_like(sums, generator), alpha=noise_std)
    if canaries is not None:
        canaries.observe(step, sums)
    torch._foreach_div_(sums, batch_size)
    for p, s in zip(clipper.params, sums, strict=True):
        p.grad = s


def padded_size(n: int, cap: int | None = None) -> int:
    """The physical size of a chunk of ``n`` (<= ``cap``) rows: n rounded up to a multiple of
    max(8, 2^(⌊log2 n⌋ − 3)), at most ``cap`` (None: no cap). At most 8 sizes per octave of n (and
    the 8 multiples of 8 up to 64), so sizes up to N take at most 8·max(1, ⌈log2 N⌉ − 5) + 9 values;
    the padding is < 12.5% of n for n >= 64 and < 8 rows below."""
    step = max(8, 1 << max(n.bit_length() - 4, 0))
    size = -(-n // step) * step if n > 0 else 0
    return size if cap is None else min(size, cap)


def _gaussian_like(tensors: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
    # One standard-normal draw per coordinate, from one randn call per dtype (fewer kernel launches
    # than one per parameter); the split into views is deterministic, so runs stay reproducible.
    t0 = tensors[0]
    if all(t.dtype == t0.dtype and t.device == t0.device for t in tensors):
        flat = torch.randn(sum(t.numel() for t in tensors), generator=generator, device=t0.device, dtype=t0.dtype)
        pieces = flat.split([t.numel() for t in tensors])  # 1-d pieces: a vector needs no view op
        return [z if t.dim() == 1 else z.view_as(t) for z, t in zip(pieces, tensors, strict=True)]
    return [torch.randn(t.shape, generator=generator, device=t.device, dtype=t.dtype) for t in tensors]


class DPTrainer(Trainer):
    """DP-SGD (Abadi et al. 2016, Alg. 1) with the optimizer named by ``optimizer``.

    Assumes the loss of a record depends on that record only (no BatchNorm; refused) and that
    every record appears at most once in the training tensors (the claim is per row).
    Seeds: model initialisation from ``config.seed`` (done by the caller), batch sampling from
    ``config.seed + 1``, noise from ``config.seed + 2``: runs are bit-reproducible on CPU unless
    ``secure_noise``.
    """

    private = True
    streams = True
    optimizer: ClassVar[str]
    jl: ClassVar[bool] = False  # DP-SGD-JL (dpaudit.training.jl): norms estimated by JL projections

    def make_clipper(self, model: nn.Module) -> Clipper:
        """The per-example clipping of this algorithm (exact, by ``PerfConfig.clipping``)."""
        if self.perf.autocast is None:
            return make_clipper(model, self.perf.clipping)
        device = next(model.parameters()).device
        return make_clipper(model, self.perf.clipping, autocast=check_autocast(self.perf.autocast, device))

    def fit(
        self,
        model: nn.Module,
        X: torch.Tensor,
        y: torch.Tensor,
        *,
        progress: Progress = NULL_PROGRESS,
    ) -> TrainOutcome:
        return self._fit(model, X, y, progress=progress, canary=None)[0]

    def fit_with_canary(
        self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, canary: GradientCanary
    ) -> tuple[TrainOutcome, float]:
        """Train with a white-box gradient canary; returns the outcome and the canary's score."""
        return self._fit(model, X, y, progress=NULL_PROGRESS, canary=canary)

    def noise_std(self, setting: PrivacySetting, clip: float) -> float:
        """Standard deviation of the Gaussian noise added to the clipped sum: σ·C (Abadi et al. 2016,
        Alg. 1). One place, so an audit's planted-bug trainer (``dpaudit demo``) can get it wrong."""
        return setting.noise_multiplier * clip

    def setting_for(self, n: int) -> PrivacySetting:
        """The privacy setting of training on ``n`` records (σ calibrated when a target ε is given)."""
        config, dp = self.config, self.config.dp
        if config.batch_size > n:
            raise InputError(f"batch size {config.batch_size} is larger than the training set ({n} records)")
        setting = PrivacySetting(
            noise_multiplier=0.0 if dp.noise_multiplier is None else dp.noise_multiplier,
            batch_size=config.batch_size,
            dataset_size=n,
            steps=config.num_steps(n),
            sampling=dp.sampling,
            rate=dp.sample_rate,
            jl_projections=dp.jl_projections,
        )
        if (dp.jl_projections is not None) != self.jl:
            raise InputError(
                f"--algo {self.name} needs --jl-projections R"
                if self.jl
                else f"--jl-projections needs --algo dpsgd-jl or dpadam-jl, not {self.name}"
            )
        if dp.target_epsilon is not None:
            setting = setting.with_noise(calibrate(setting, dp))
        # The noise N(0, (σC)² I) is drawn into float32 tensors: a σ·C beyond float32's largest value is no
        # noise a step can add (torch refuses the conversion mid-training; no useful setting comes near it).
        if setting.noise_multiplier * dp.clip > FLOAT32_MAX:
            sigma = "--noise-multiplier" if dp.target_epsilon is None else "the calibrated noise multiplier"
            raise InputError(
                f"expected {sigma} × --clip (the noise's standard deviation, {setting.noise_multiplier:g} × "
                f"{dp.clip:g}) <= {FLOAT32_MAX:.4g}, the largest float32"
            )
        return setting

    def _fit(
        self,
        model: nn.Module,
        X: torch.Tensor,
        y: torch.Tensor,
        *,
        progress: Progress,
        canary: GradientCanary | DiracCanaries | None,
    ) -> tuple[TrainOutcome, Any]:
        config, dp, perf = self.config, self.config.dp, self.perf
        if dp is None:  # Trainer.__init__ refuses this already
            raise InputError(f"algorithm {self.name!r} is private: give --noise-multiplier or --epsilon")
        clip = check_positive(clip=dp.clip)
        n = X.shape[0]
        if n == 0:
            raise InputError("the training set is empty")
        check_private_layers(model)
        setting = self.setting_for(n)
        claim = privacy_claim(setting, dp)  # before training: an unreachable claim fails fast

        clipper = self.make_clipper(model)
        params = clipper.params
        opt = make_optimizer(self.optimizer, params, config)
        batch_gen = torch.Generator().manual_seed(config.seed + 1)
        sample = (
            poisson_sampler(n, setting.sample_rate, batch_gen)
            if dp.sampling == "poisson"
            else shuffle_sampler(n, config.batch_size, batch_gen)
        )
        noise_gen = noise_generator(X.device, config.seed + 2, dp.secure_noise)

        hooks = None if canary is None else canary.attach(clipper, X, y, setting, clip)
        history: list[dict[str, float]] = []
        model.train()
        # The ghost clipper's forward hooks leave the model with the training loop (a wrapper
        # around a clipper may have no close(), as it may have no describe() below).
        release = closing(clipper) if hasattr(clipper, "close") else nullcontext()
        with progress.task(f"train {self.name}", setting.steps) as advance, release:
            for step in range(setting.steps):
                set_private_gradients(
                    clipper,
                    X,
                    y,
                    sample(),
                    clip=clip,
                    noise_std=self.noise_std(setting, clip),
                    batch_size=config.batch_size,
                    max_physical_batch=perf.max_physical_batch,
                    generator=noise_gen,
                    canaries=hooks,
                    step=step,
                    pad=None if dp.sampling == "poisson" else False,  # shuffled batches: <= 2 sizes already
                )
                opt.step()
                if (epoch := config.epoch_ended(step + 1, n, setting.steps)) is not None:
                    # No losses or batch sizes of the private data here: the claim does not cover them.
                    history.append({"epoch": epoch, "steps": step + 1})
                advance(1)
        if (check := getattr(clipper, "check_norms_finite", None)) is not None:  # a wrapper may lack it
            check()
        model.eval()
        if self.jl:  # which AD path computed the projections (recorded in the checkpoint with the claim)
            claim["jl"] = {"projections": dp.jl_projections, "ad_path": getattr(clipper, "ad_path_", None)}
        score = canary.score() if canary is not None else math.nan
        describe = getattr(clipper, "describe", None)  # what --clipping auto chose (performance only)
        used = {"clipping_used": describe()} if describe is not None else {}
        outcome = TrainOutcome(model=model, privacy=claim, history=history, performance=used)
        return outcome, score


class GradientCanary:
    """A white-box Dirac gradient canary for auditing DP-SGD (Nasr et al. 2021, arXiv:2101.04535,
    §4 "gradient canaries"; Nasr et al. 2023, arXiv:2302.07956, §3): one canary of
    :class:`dpaudit.hooks.GradientCanaries`, the mechanism every white-box canary of dpaudit shares.

    The canary is one extra "record" whose clipped gradient is C·e_j on a single coordinate j; when
    ``included`` it is Poisson-sampled at rate q like every record and added to the clipped sum
    before the noise. The auditor sees every noisy update (white-box threat model) and reads
    o_t = (noisy sum)_j / C at each step. With the data's gradients vanishing at j,
    o_t ~ N(b_t, σ²), b_t ~ Bernoulli(q) when included and o_t ~ N(0, σ²) otherwise, so the most
    powerful test per step (Neyman–Pearson) has the log-likelihood ratio
        log(1 − q + q·exp((o_t − 1/2)/σ²)),
    summed over the independent steps to give the score (higher = included;
    :func:`dpaudit.hooks.core.dirac_scores`).

    j is chosen before training, from the data only (never from the inclusion bit): the coordinate
    of the smallest per-example gradient energy Σ_i g_ij² over (up to 256) training records at
    initialisation — exactly zero, e.g., for first-layer weights of a constant feature.

    Per-step mode (Nasr et al. 2023, §3): at every step the canary is offered independently with
    probability 1/2 — the auditor's coin, from its own stream of ``seed`` — and, when offered,
    Poisson-sampled at rate q like any record. ``inserted[t]`` is step t's coin; the steps are the
    trials of :mod:`dpaudit.audit.whitebox`.
    """

    def __init__(self, *, included: bool, seed: int, per_step: bool = False) -> None:
        self.included, self.seed, self.per_step = bool(included), int(seed), bool(per_step)
        self.hooks_: GradientCanaries | None = None
        self._q = self._sigma = 0.0

    def attach(self, clipper: Clipper, X: torch.Tensor, y: torch.Tensor, setting: PrivacySetting, clip: float):
        from dpaudit.training.dirac import canary_hooks, low_energy_coordinates

        if setting.sampling != "poisson":
            raise InputError("the gradient canary audit needs Poisson sampling")
        self._q, self._sigma = setting.sample_rate, setting.noise_multiplier
        self.hooks_ = canary_hooks(
            clipper, setting, clip, seed=self.seed, coordinates=low_energy_coordinates(clipper.model, X, y, 1),
            included=[self.included], inclusion="step" if self.per_step else "run",
        )  # fmt: skip
        return self.hooks_

    @property
    def observations(self) -> list[float]:
        return [] if self.hooks_ is None else self.hooks_.observations().observations[:, 0].tolist()

    @property
    def inserted(self) -> list[bool]:
        if self.hooks_ is None or not self.per_step:
            return []
        return self.hooks_.observations().coins[:, 0].tolist()

    def score(self) -> float:
        from dpaudit.hooks.core import dirac_scores

        return float(dirac_scores(np.asarray(self.observations), self._q, self._sigma))


class DPSGDTrainer(DPTrainer):
    name = "dpsgd"
    optimizer = "sgd"


class DPAdamTrainer(DPTrainer):
    name = "dpadam"
    optimizer = "adam"
