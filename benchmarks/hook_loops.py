"""Gradient canaries in the training loops users write: each setup trained once, audited, one table row.

    PYTHONPATH=. .venv/bin/python benchmarks/hook_loops.py [--only opacus|func|optax|autocast]

Setups (a 10-32-2 MLP on 400 random records, Poisson q = 0.1, σ = 1, C = 1, T = 40, 60 canaries; the claim is
the RDP accounting of (σ, q, T) at δ = 1e-5): Opacus 1.6 (`attach(module=model)`: BatchMemoryManager with empty
logical batches, two param groups in reversed order with StepLR and momentum, tied weights, `zero_grad(set_to_none=
False)`, a scaled loss, a forward under `torch.autocast`), a hand-written torch.func DP-SGD loop (micro-batch
accumulation, autocast, loss scaling, planted σC/√2, the pair called per micro-batch, canaries built at 10·C,
clipping skipped), and a jitted optax chain (planted σC/√2, `multi_transform` with frozen leaves,
`inject_hyperparams`, `apply_if_finite` with a NaN step, the pair inside `MultiSteps`). Each row: steps observed,
the verdict of `dpaudit audit canaries` (with `--noise-multiplier 1`), the noise check's std ratios per group, or
the one-line refusal. A correct loop reads "violation" with probability at most 0.05 (the audit's α); the rows
here use fixed seeds. About 2 minutes on one CPU core. ``--only autocast`` measures instead how far Opacus' clipping
under ``torch.autocast`` lets a record exceed the clip (:func:`autocast_overshoot`; ghost clipping:
:func:`ghost_autocast_overshoot`), why the adapter refuses it.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np

N, Q, SIGMA, CLIP, T, M = 400, 0.1, 1.0, 1.0, 40, 60


def _audit(canaries, q: float = Q) -> str:
    from dpaudit.accounting import dpsgd_event, epsilon_for
    from dpaudit.workflows.hooks_audit import audit_canaries

    claimed = float(epsilon_for(dpsgd_event(noise_multiplier=SIGMA, sample_rate=q, steps=T), 1e-5, "rdp"))
    with tempfile.TemporaryDirectory() as tmp:
        d = canaries.save(Path(tmp) / "c")
        r = audit_canaries(d, claimed_epsilon=claimed, delta=1e-5, noise_multiplier=SIGMA)
    ratios = [g.ratio for g in r.noise.groups]
    return f"{r.steps} | {r.verdict} | {min(ratios):.3f}–{max(ratios):.3f}"


def _row(name: str, fn) -> str:
    from dpaudit.errors import InputError

    try:
        out = fn()
    except Exception as e:  # a refusal: dpaudit's line (under jit, the last line of JAX's error)
        if not isinstance(e, InputError) and "InputError" not in str(e):
            raise
        out = "— | refused | " + str(e).strip().splitlines()[-1].removeprefix("InputError: ")[:110] + "…"
    return f"| {name} | {out} |"


# ---- Opacus -----------------------------------------------------------------------------------------------------


def _opacus(*, tied=False, groups=False, batch=int(N * Q)):
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from dpaudit.hooks import GradientCanaries

    torch.manual_seed(0)
    if tied:
        model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.ReLU(), torch.nn.Linear(10, 10), torch.nn.ReLU(),
                                    torch.nn.Linear(10, 2))  # fmt: skip
        model[2].weight = model[0].weight
    else:
        model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    named = dict(model.named_parameters())
    if groups:  # another order than named_parameters(), their own lr and weight decay
        late = [p for n, p in named.items() if n.startswith("2")]
        early = [p for n, p in named.items() if n.startswith("0")]
        params = [{"params": late, "lr": 0.05}, {"params": early, "lr": 0.1, "weight_decay": 1e-3}]
    else:
        params = list(named.values())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9 if groups else 0.0)
    X = torch.randn(N, 10)
    data = TensorDataset(X, (X[:, 0] > 0).long())
    model, opt, loader = PrivacyEngine().make_private(
        module=model, optimizer=opt, data_loader=DataLoader(data, batch_size=batch), noise_multiplier=SIGMA,
        max_grad_norm=CLIP, poisson_sampling=True,
    )  # fmt: skip
    canaries = GradientCanaries({n: p.shape for n, p in model.named_parameters()}, count=M,
                                sample_rate=loader.sample_rate, clip=None, seed=1)  # fmt: skip
    canaries.attach(opt, module=model)
    return model, opt, loader, canaries


def _opacus_loop(*, autocast=False, set_to_none=True, scale=1.0, **kw) -> str:
    import torch

    model, opt, loader, canaries = _opacus(**kw)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5, 0.5) if kw.get("groups") else None
    while canaries.steps_ < T:
        for xb, yb in loader:
            opt.zero_grad(set_to_none=set_to_none)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(xb)
            (scale * torch.nn.functional.cross_entropy(out.float(), yb)).backward()
            opt.step()
            if sched is not None:
                sched.step()
            if canaries.steps_ == T:
                break
    return _audit(canaries)


def _opacus_bmm() -> str:
    import torch
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    model, opt, loader, canaries = _opacus(batch=2)  # q = 0.005: empty logical batches
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=1, optimizer=opt) as batches:
        while canaries.steps_ < T:
            for xb, yb in batches:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                if canaries.steps_ == T:
                    break
    return _audit(canaries, q=loader.sample_rate)


def opacus_rows() -> list[str]:
    return [
        _row("Opacus: plain loop", _opacus_loop),
        _row("Opacus: BatchMemoryManager, physical batch 1, q = 0.005 (empty batches)", _opacus_bmm),
        _row("Opacus: 2 param groups reversed, momentum, StepLR", lambda: _opacus_loop(groups=True)),
        _row("Opacus: tied weights", lambda: _opacus_loop(tied=True)),
        _row("Opacus: zero_grad(set_to_none=False)", lambda: _opacus_loop(set_to_none=False)),
        _row("Opacus: loss × 1024 (GradScaler-like, never unscaled)", lambda: _opacus_loop(scale=1024.0)),
        _row("Opacus: forward under torch.autocast(bf16)", lambda: _opacus_loop(autocast=True)),
    ]


# ---- torch.func --------------------------------------------------------------------------------------------------


def _func_loop(*, accum=1, autocast=False, scale=1.0, noise=1.0, per_micro=False, canary_clip=CLIP, clip=True) -> str:
    import torch
    from torch.func import functional_call, grad, vmap

    from dpaudit.hooks import GradientCanaries

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    X = torch.randn(N, 10)
    y = (X[:, 0] > 0).long()
    canaries = GradientCanaries({n: p.shape for n, p in model.named_parameters()}, count=M, sample_rate=Q,
                                clip=canary_clip, seed=1)  # fmt: skip

    def loss(p, x, t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = functional_call(model, p, (x[None],))
        return scale * torch.nn.functional.cross_entropy(out.float(), t[None])

    def clipped_sum(params, idx):  # Σ_i clip_C(g_i), the loss scale undone after clipping at scale·C
        g = vmap(grad(loss), in_dims=(None, 0, 0))(params, X[idx], y[idx])
        norms = torch.sqrt(sum((v.reshape(len(idx), -1) ** 2).sum(1) for v in g.values()))
        f = (scale * CLIP / (norms + 1e-12)).clamp(max=1.0) if clip else torch.ones_like(norms)
        return {n: (v * f.view(-1, *[1] * (v.dim() - 1))).sum(0) / scale for n, v in g.items()}

    gen = torch.Generator().manual_seed(0)
    for _ in range(T):
        params = {n: p.detach() for n, p in model.named_parameters()}
        idx = torch.nonzero(torch.rand(N, generator=gen) < Q).flatten()
        sums = [clipped_sum(params, part) for part in torch.tensor_split(idx, accum)]
        if per_micro:  # the misuse: the pair per micro-batch, each with its own noise σC
            for s in sums:
                out = canaries.inject(canaries.steps_, s)
                canaries.observe(canaries.steps_, {n: v + SIGMA * CLIP * torch.randn(v.shape, generator=gen)
                                                   for n, v in out.items()})  # fmt: skip
            noisy = out
        else:
            total = canaries.inject(canaries.steps_, {n: sum(s[n] for s in sums) for n in sums[0]})
            noisy = {n: v + noise * SIGMA * CLIP * torch.randn(v.shape, generator=gen) for n, v in total.items()}
            canaries.observe(canaries.steps_, noisy)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p -= 0.1 * noisy[n] / (Q * N)
    return _audit(canaries)


def func_rows() -> list[str]:
    return [
        _row("torch.func: plain DP-SGD", _func_loop),
        _row("torch.func: 4 micro-batches accumulated, one inject", lambda: _func_loop(accum=4)),
        _row("torch.func: forward under torch.autocast(bf16)", lambda: _func_loop(autocast=True)),
        _row("torch.func: loss × 1024, clipped at 1024·C, unscaled", lambda: _func_loop(scale=1024.0)),
        _row("torch.func: planted noise σC/√2", lambda: _func_loop(noise=2**-0.5)),
        _row("torch.func: the pair per micro-batch (k = 2; claim for T)", lambda: _func_loop(accum=2, per_micro=True)),
        _row("torch.func: canaries built with clip 10·C", lambda: _func_loop(canary_clip=10 * CLIP)),
        _row("torch.func: clipping skipped (invisible to the hooks)", lambda: _func_loop(clip=False)),
    ]


# ---- optax -------------------------------------------------------------------------------------------------------


def _optax_loop(*, noise=1.0, frozen=False, hyper=False, finite=False, multisteps=False) -> str:
    import jax
    import jax.numpy as jnp
    import optax

    from dpaudit.hooks import GradientCanaries
    from dpaudit.hooks.jax_adapter import pytree_shapes
    from examples.optax_canaries import clip_and_sum, gaussian_noise

    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.standard_normal((N, 10)), jnp.float32)
    y = jnp.asarray((np.asarray(X)[:, 0] > 0).astype(np.int32))
    k1, k2, key = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"h": {"w": 0.1 * jax.random.normal(k1, (10, 32)), "b": jnp.zeros(32)},
              "o": {"w": 0.1 * jax.random.normal(k2, (32, 2)), "b": jnp.zeros(2)}}  # fmt: skip
    shapes = pytree_shapes(params)
    if frozen:  # the hidden layer frozen by multi_transform: canaries on the trained leaves only
        shapes = {k: s for k, s in shapes.items() if k.startswith("['o']")}
    canaries = GradientCanaries(shapes, count=M if not frozen else 20, sample_rate=Q, clip=CLIP, seed=1)

    def loss(p, x, t, m):
        h = jax.nn.relu(x @ p["h"]["w"] + p["h"]["b"])
        return -m * jax.nn.log_softmax(h @ p["o"]["w"] + p["o"]["b"])[t]

    def tail(lr):
        return [canaries.optax_inject(), gaussian_noise(noise * SIGMA * CLIP, key), canaries.optax_observe(),
                optax.scale(1 / (Q * N)), optax.sgd(lr)]  # fmt: skip

    clip = clip_and_sum(CLIP)
    pre = not (finite or multisteps)  # else the clipped sum is computed before the wrapper
    if hyper:
        tx = optax.inject_hyperparams(lambda learning_rate: optax.chain(clip, *tail(learning_rate)))(
            learning_rate=optax.linear_schedule(0.1, 0.01, T)
        )
    elif frozen:
        zero = optax.stateless(lambda u, p: jax.tree_util.tree_map(lambda v: jnp.zeros(v.shape[1:]), u))
        labels = {"h": {"w": "frozen", "b": "frozen"}, "o": {"w": "train", "b": "train"}}
        tx = optax.multi_transform({"train": optax.chain(clip, *tail(0.1)), "frozen": zero}, labels)
    elif finite:
        tx = optax.apply_if_finite(optax.chain(*tail(0.1)), max_consecutive_errors=3)
    elif multisteps:
        tx = optax.MultiSteps(optax.chain(*tail(0.1)), every_k_schedule=2)
    else:
        tx = optax.chain(clip, *tail(0.1))
    state = tx.init(params)

    @jax.jit
    def step(p, s, mask, bad):
        g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0))(p, X, y, mask)
        if not pre:
            g = clip.update(g, optax.EmptyState())[0]
            g = jax.tree_util.tree_map(lambda v: v * jnp.where(bad, jnp.nan, 1.0), g)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    batches = np.random.default_rng(5)
    for t in range(T * (2 if multisteps else 1)):
        mask = jnp.asarray(batches.random(N) < Q, jnp.float32)
        params, state = step(params, state, mask, finite and t == 5)
    jax.block_until_ready(params)
    return _audit(canaries)


def optax_rows() -> list[str]:
    return [
        _row("optax (jit): plain chain", _optax_loop),
        _row("optax (jit): planted noise σC/√2", lambda: _optax_loop(noise=2**-0.5)),
        _row("optax (jit): multi_transform, hidden layer frozen", lambda: _optax_loop(frozen=True)),
        _row("optax (jit): inject_hyperparams with an lr schedule", lambda: _optax_loop(hyper=True)),
        _row("optax (jit): apply_if_finite, NaN gradient at step 5", lambda: _optax_loop(finite=True)),
        _row("optax (jit): the pair inside MultiSteps(k = 2)", lambda: _optax_loop(multisteps=True)),
    ]


def autocast_overshoot(seed: int, dtype: str) -> float:
    """Opacus under ``torch.autocast``: the largest clipped per-example contribution of one Poisson batch, over C
    (its norm recomputed in float64 from Opacus' own per-example gradients and clip factors); a 10-256-2 MLP, inputs
    N(0, 25), C = 0.1 (so nearly every record is clipped)."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(10, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    X = 5 * torch.randn(N, 10)
    model, opt, loader = PrivacyEngine().make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=SIGMA, max_grad_norm=0.1,
        data_loader=DataLoader(TensorDataset(X, (X[:, 0] > 0).long()), batch_size=100), poisson_sampling=True,
    )  # fmt: skip
    xb, yb = next(iter(loader))
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        out = model(xb)
    torch.nn.functional.cross_entropy(out.float(), yb).backward()
    g = opt.grad_samples  # what clip_and_accumulate clips: Opacus' per-parameter norms, then their norm, in `dtype`
    norms = torch.stack([v.reshape(len(v), -1).norm(2, dim=-1) for v in g], dim=1).norm(2, dim=1)
    factor = (opt.max_grad_norm / (norms + 1e-6)).clamp(max=1.0).double()
    exact = torch.cat([v.reshape(len(v), -1).double() for v in g], 1).norm(dim=1)
    return float((factor * exact).max() / opt.max_grad_norm)


def ghost_autocast_overshoot(seed: int) -> float:
    """Opacus' ghost clipping (``grad_sample_mode="ghost"``) under ``torch.autocast(bfloat16)``: the largest clipped
    gradient of 40 records, each its own batch (so ``p.grad`` after Opacus' two backward passes is that record's
    clipped gradient, as summed), over C, its norm in float64; the MLP, inputs and C of :func:`autocast_overshoot`."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(10, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    X = 5 * torch.randn(N, 10)
    Y = (X[:, 0] > 0).long()
    model, opt, criterion, _ = PrivacyEngine().make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=SIGMA, max_grad_norm=0.1,
        data_loader=DataLoader(TensorDataset(X, Y), batch_size=100), poisson_sampling=True,
        criterion=torch.nn.CrossEntropyLoss(), grad_sample_mode="ghost",
    )  # fmt: skip
    worst = 0.0
    for i in range(40):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(X[i : i + 1])
        criterion(out, Y[i : i + 1]).backward()
        worst = max(worst, float(torch.sqrt(sum(p.grad.double().square().sum() for p in model.parameters()))))
    return worst / 0.1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("opacus", "func", "optax", "autocast"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.only == "autocast":
        for dtype in ("bfloat16", "float16"):
            print(dtype, "largest clipped contribution / C:", [f"{autocast_overshoot(s, dtype):.4f}" for s in range(4)])
        print("ghost bfloat16 largest clipped record / C:", [f"{ghost_autocast_overshoot(s):.4f}" for s in range(4)])
        return
    print("| setup | steps | verdict | noise std / σC (groups) |")
    print("|---|---|---|---|")
    for name, rows in (("opacus", opacus_rows), ("func", func_rows), ("optax", optax_rows)):
        if args.only in (None, name):
            for row in rows():
                print(row, flush=True)


if __name__ == "__main__":
    main()
