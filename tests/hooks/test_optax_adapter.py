"""The optax adapter: ``canaries.optax_inject()`` / ``optax_observe()`` in an ``optax.chain``, jitted.

Oracle: the framework-neutral core called by hand (the dict API) on the same clipped sums and the same
noise, with canaries built from the same seed; the optax pair must record exactly the same observations,
noise sums of squares and projections — eagerly, under ``jax.jit`` and inside ``jax.lax.scan``.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.errors import InputError
from dpaudit.hooks import GradientCanaries

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy

T = 6
PARAMS = {"fc": {"w": np.zeros((20, 10), np.float32), "b": np.zeros(10, np.float32)}}


def _data(seed: int = 3):
    """T clipped sums and T noise draws (float32 trees like PARAMS)."""
    rng = np.random.default_rng(seed)

    def tree():
        return {"fc": {"w": rng.normal(size=(20, 10)).astype(np.float32), "b": rng.normal(size=10).astype(np.float32)}}

    return [tree() for _ in range(T)], [tree() for _ in range(T)]


def _canaries(seed: int = 0):
    from dpaudit.hooks.jax_adapter import pytree_shapes

    return GradientCanaries(pytree_shapes(PARAMS), count=15, sample_rate=0.5, clip=1.5, seed=seed)


def _known_noise(noise):
    """optax: + the t-th of the given noise trees at step t (so the oracle can add the same)."""
    stacked = jax.tree_util.tree_map(lambda *v: jnp.stack(v), *noise)

    def init(params):
        return jnp.zeros([], jnp.int32)

    def update(updates, count, params=None):
        z = jax.tree_util.tree_map(lambda s: s[count], stacked)
        return jax.tree_util.tree_map(jnp.add, updates, z), count + 1

    return optax.GradientTransformation(init, update)


def _oracle(sums, noise):
    c = _canaries()
    for t in range(T):
        named = {"['fc']['w']": sums[t]["fc"]["w"], "['fc']['b']": sums[t]["fc"]["b"]}
        out = c.inject(t, named)
        c.observe(t, {n: out[n] + z for n, z in zip(named, (noise[t]["fc"]["w"], noise[t]["fc"]["b"]), strict=True)})
    return c.observations()


def _assert_same(a, b):
    for k in ("coordinates", "included", "observations", "noise_ss", "noise_count", "projections"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)


@pytest.mark.parametrize("how", ["eager", "jit", "scan"])
def test_optax_pair_records_what_the_core_records(how, tmp_path):
    sums, noise = _data()
    c = _canaries()
    tx = optax.chain(c.optax_inject(), _known_noise(noise), c.optax_observe())
    state = tx.init(PARAMS)
    if how == "scan":

        @jax.jit
        def run(state):
            def body(s, g):
                u, s = tx.update(g, s, PARAMS)
                return s, u

            return jax.lax.scan(body, state, jax.tree_util.tree_map(lambda *v: jnp.stack(v), *sums))

        state, outs = run(state)
        last = jax.tree_util.tree_map(lambda v: v[-1], outs)
    else:
        update = jax.jit(tx.update) if how == "jit" else tx.update
        for t in range(T):
            last, state = update(sums[t], state, PARAMS)
    got = c.observations()  # no explicit barrier: observations() waits for the dispatched steps
    assert got.steps == T and int(state[0].step) == T and int(state[2].step) == T  # the step counters
    want = _oracle(sums, noise)
    _assert_same(got, want)
    # What the chain hands on is the noisy sum: the clipped sum + C at each drawn canary + the noise.
    flat = np.concatenate([np.asarray(last["fc"]["b"]).ravel(), np.asarray(last["fc"]["w"]).ravel()])
    plain = np.concatenate([(sums[-1]["fc"][k] + noise[-1]["fc"][k]).ravel() for k in ("b", "w")])
    added = (flat - plain)[want.coordinates] / 1.5  # canaries' coordinates first in (b, w) = flatten order
    assert np.all(np.isin(np.round(added, 4), [0.0, 1.0])) and added.sum() > 0
    np.testing.assert_allclose(np.delete(flat, want.coordinates), np.delete(plain, want.coordinates), rtol=0, atol=0)
    c.save(tmp_path / "c")
    assert (tmp_path / "c" / "canaries.json").is_file() and c.meta["framework"] == "optax"


def test_optax_refusals():
    c = _canaries()
    other = {"fc": {"w": np.zeros((20, 11), np.float32), "b": np.zeros(10, np.float32)}}
    with pytest.raises(InputError, match="another model"):
        optax.chain(c.optax_inject(), c.optax_observe()).init(other)
    with pytest.raises(InputError, match="another model"):
        c.optax_inject().init({"conv": np.zeros(3, np.float32)})
    tx = optax.chain(c.optax_inject(), c.optax_observe())
    state = tx.init(PARAMS)
    with pytest.raises(InputError, match="another model"):  # at trace time, before anything runs
        jax.jit(tx.update)(other, state)
    with pytest.raises(InputError, match="clip"):
        GradientCanaries({"w": (4,)}, count=4, sample_rate=0.5, clip=None, seed=0).optax_inject()


def _two_jitted_steps(c, sums, noise):
    """The canaries' chain, jitted, after two steps in order: (its jitted update, the chain)."""
    tx = optax.chain(c.optax_inject(), _known_noise(noise), c.optax_observe())
    update = jax.jit(tx.update)
    state = tx.init(PARAMS)
    for t in range(2):
        _, state = update(sums[t], state)
    return update, tx


def test_optax_misuse_at_run_time_is_dpaudits_one_line_message():
    """The chain in the wrong order (observe before inject) and an optimizer state re-initialised mid-run
    (steps out of order): dpaudit's one-line message, eagerly an InputError, under jit the last line of
    JAX's error; nothing is recorded by the refused call."""
    sums, noise = _data()
    c = _canaries()
    wrong = optax.chain(c.optax_observe(), _known_noise(noise), c.optax_inject())
    with pytest.raises(InputError, match=r"observe\(step=0\) before inject"):
        wrong.update(sums[0], wrong.init(PARAMS))
    c = _canaries()
    update, tx = _two_jitted_steps(c, sums, noise)
    with pytest.raises(Exception, match=r"InputError: inject\(step=0\): expected step 2") as err:
        jax.block_until_ready(update(sums[0], tx.init(PARAMS)))  # a fresh state: its counter restarts at 0
        jax.effects_barrier()
    assert str(err.value).strip().splitlines()[-1].startswith("InputError: inject(step=0)")
    assert c.observations().steps == 2


def test_the_barrier_does_not_raise_a_refusal_twice_but_raises_anything_else(monkeypatch):
    """On a GPU the runtime keeps a refused callback's error in its ordered-effects token, and
    ``jax.effects_barrier`` (what ``observations()`` waits on) raises it again (seen on an H200). That
    refusal was already raised at the user's call and recorded nothing, so it is not raised twice; any
    other runtime error still is. Simulated here: the CPU runtime does not keep callback errors."""
    sums, noise = _data()
    c = _canaries()
    update, tx = _two_jitted_steps(c, sums, noise)
    with pytest.raises(Exception, match=r"expected step 2"):
        jax.block_until_ready(update(sums[0], tx.init(PARAMS)))
        jax.effects_barrier()
    kept = f"INTERNAL: CpuCallback error calling callback: ... InputError: {c._refused} [executable_name='jit']"

    def barrier_keeping(message):
        def barrier():
            raise RuntimeError(message)

        return barrier

    monkeypatch.setattr(jax, "effects_barrier", barrier_keeping(kept))
    assert c.observations().steps == 2
    monkeypatch.setattr(jax, "effects_barrier", barrier_keeping("INTERNAL: device lost"))
    with pytest.raises(RuntimeError, match="device lost"):
        c.observations()


def test_leaves_a_canary_cannot_be_added_to_exactly_and_traced_pytree_hooks_are_one_line_refusals():
    """Before: ``pytree_shapes`` took an integer leaf, and the jitted chain silently dropped the canary that
    landed on its (float0) gradient while the audit scored it as C; bfloat16 gradients got C rounded to 0 or
    2C (half each at |sum| in [256, 512)); ``pytree_hooks`` called inside ``jax.jit`` raised JAX's
    TracerArrayConversionError traceback, and a Python-float leaf an AttributeError. Now: one line each,
    at trace time under jit."""
    from dpaudit.hooks.jax_adapter import pytree_hooks, pytree_shapes

    with pytest.raises(InputError, match=r"leaf \['n'\] has dtype int32, not floating point"):
        pytree_shapes({"w": jnp.zeros(3), "n": jnp.zeros((), jnp.int32)})
    assert pytree_shapes({"w": jnp.zeros(3), "s": 1.0}) == {"['s']": (), "['w']": (3,)}
    p = {"w": jnp.ones((3, 2)), "n": jnp.array(3, jnp.int32)}  # shapes built by hand, the integer leaf kept
    c = GradientCanaries({"['n']": (), "['w']": (3, 2)}, count=6, sample_rate=1.0, clip=1.0, seed=0)
    tx = optax.chain(c.optax_inject(), c.optax_observe())
    g = jax.grad(lambda p: jnp.square(p["w"]).sum(), allow_int=True)(p)
    with pytest.raises(InputError, match="has dtype float0, not float32 or float64"):
        jax.jit(tx.update)(g, tx.init(p), p)
    half = jax.tree_util.tree_map(lambda v: v.astype(jnp.bfloat16), PARAMS)
    c = _canaries()
    tx = optax.chain(c.optax_inject(), c.optax_observe())
    with pytest.raises(InputError, match="has dtype bfloat16, not float32 or float64"):
        jax.jit(tx.update)(half, tx.init(half))  # bfloat16 parameters are fine (init); their gradients are not
    inject, _ = pytree_hooks(_canaries())
    with pytest.raises(InputError, match="traced JAX array"):
        jax.jit(lambda g: inject(0, g))(PARAMS)


def test_leaves_frozen_by_another_transformation_are_named_so_not_as_a_tied_torch_weight():
    """Canaries built from every leaf, the pair in the trained partition of an ``optax.multi_transform`` (the frozen
    leaves are not in its tree): the refusal gave torch's tied-weight hint ("named_parameters() lists once"); it
    now names multi_transform/masked. The same from the plain pytree functions given the trained subtree."""
    from dpaudit.hooks.jax_adapter import pytree_hooks

    c = _canaries()
    trained = {"fc": {"w": PARAMS["fc"]["w"]}}
    with pytest.raises(InputError, match=r"missing \[\"\['fc'\]\['b'\]\"\].*optax\.multi_transform") as e:
        c.optax_inject().init(trained)
    assert "named_parameters" not in str(e.value)
    inject, _ = pytree_hooks(c)
    with pytest.raises(InputError, match=r"optax\.multi_transform") as e:
        inject(0, jax.tree_util.tree_map(jnp.asarray, trained))
    assert "named_parameters" not in str(e.value)


def test_the_pair_inside_optax_multisteps_is_refused_naming_it():
    """``optax.MultiSteps`` (gradient accumulation) runs the wrapped chain at every mini-step and keeps its state only
    every k-th: the second mini-step's inject came with step 0 again and was refused as "expected step 1", which
    did not say why. The line now names MultiSteps and the fix (accumulate the clipped sums, one update)."""
    sums, noise = _data()
    c = _canaries()
    tx = optax.MultiSteps(optax.chain(c.optax_inject(), _known_noise(noise), c.optax_observe()), every_k_schedule=2)
    update = jax.jit(tx.update)
    state = tx.init(PARAMS)
    with pytest.raises(Exception, match=r"InputError: inject\(step=0\): expected step 1: .*optax\.MultiSteps") as err:
        for t in range(2):
            _, state = update(sums[t], state, PARAMS)
        jax.effects_barrier()
    assert str(err.value).strip().splitlines()[-1].startswith("InputError: inject(step=0)")
    assert c.observations().steps == 1  # the first mini-step; the refused one recorded nothing
