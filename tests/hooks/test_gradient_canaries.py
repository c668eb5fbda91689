"""The gradient-canary hooks: what inject adds, what observe records, the formats, and the refusals.

Oracles: with zero gradients and no noise, an observation is exactly the canary's draw (1 or 0), so the
draws can be counted against Binomial(T, q); the noise summary is recomputed by a plain loop over
the untouched coordinates from the noise the test itself added.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.errors import InputError
from dpaudit.hooks import GradientCanaries, load_observations
from dpaudit.hooks.core import dirac_scores

SHAPES = {"fc.weight": (20, 10), "fc.bias": (10,)}


def _loop(canaries, T, *, sigma=0.0, seed=1, kind="numpy", as_dict=True):
    """A hand-written loop: random 'clipped sums', the hooks around N(0, σ²C²) noise; returns the noise."""
    rng = np.random.default_rng(seed)
    noises = []
    for t in range(T):
        g = {n: rng.normal(size=s) * 0.0 for n, s in SHAPES.items()}
        z = {n: rng.normal(size=s) * sigma * canaries.clip for n, s in SHAPES.items()}
        if kind == "torch":
            import torch

            g = {n: torch.as_tensor(v, dtype=torch.float32) for n, v in g.items()}
        elif kind == "jax":
            import jax.numpy as jnp

            g = {n: jnp.asarray(v, dtype=jnp.float32) for n, v in g.items()}
        grads = g if as_dict else list(g.values())
        out = canaries.inject(t, grads)
        vals = out if as_dict else dict(zip(SHAPES, out, strict=True))
        if kind == "torch":
            import torch

            noisy = {n: vals[n] + torch.as_tensor(z[n], dtype=vals[n].dtype) for n in SHAPES}
        elif kind == "jax":
            noisy = {n: vals[n] + jnp.asarray(z[n], dtype=vals[n].dtype) for n in SHAPES}
        else:
            noisy = {n: vals[n] + z[n] for n in SHAPES}
        canaries.observe(t, noisy if as_dict else [noisy[n] for n in SHAPES])
        noises.append(z)
    return noises


def test_inject_adds_c_at_drawn_included_canaries_only():
    T, q = 400, 0.25
    c = GradientCanaries(SHAPES, count=40, sample_rate=q, clip=2.0, seed=3)
    _loop(c, T)
    obs = c.observations()
    o = obs.observations
    assert set(np.unique(o)) <= {0.0, 1.0}  # noise-free: exactly C/C at a drawn canary, else 0
    assert np.all(o[:, ~obs.included] == 0)
    draws = o[:, obs.included].sum(axis=0)
    # Each included canary is drawn Binomial(T, q) times: all within 5 sd (bound 1 - 40·P(|Z| > 5) ≈ 1).
    assert np.all(np.abs(draws - q * T) <= 5 * np.sqrt(T * q * (1 - q)))
    assert 10 <= obs.included.sum() <= 30
    # with σ = 0 the score is the count of draws
    assert np.array_equal(dirac_scores(o, q, 0.0), o.sum(axis=0))


@pytest.mark.parametrize("kind", ["torch", "jax"])
def test_frameworks_give_the_numpy_observations(kind):
    pytest.importorskip(kind)
    ref = GradientCanaries(SHAPES, count=30, sample_rate=0.3, clip=1.0, seed=5)
    _loop(ref, 20, sigma=1.0)
    other = GradientCanaries(SHAPES, count=30, sample_rate=0.3, clip=1.0, seed=5)
    _loop(other, 20, sigma=1.0, kind=kind)
    a, b = ref.observations(), other.observations()
    np.testing.assert_allclose(b.observations, a.observations, rtol=1e-5, atol=1e-5)  # float32 round trip
    np.testing.assert_allclose(b.noise_ss, a.noise_ss, rtol=1e-5)


def test_torch_keeps_dtype_and_sequence_input_gives_sequence():
    torch = pytest.importorskip("torch")
    c = GradientCanaries(SHAPES, count=5, sample_rate=1.0, clip=1.0, seed=0)
    grads = [torch.zeros(s, dtype=torch.float64) for s in SHAPES.values()]
    out = c.inject(0, grads)
    assert isinstance(out, list) and all(o.dtype == torch.float64 for o in out)
    assert all(float(g.abs().sum()) == 0 for g in grads)  # the caller's tensors are not modified
    assert sum(float(o.sum()) for o in out) == c.included_.sum()  # q = 1: every included canary drawn


@pytest.mark.parametrize("layout", ["numpy-fortran", "torch-transposed", "torch-channels-last"])
def test_a_gradient_not_in_row_major_memory_gets_its_canaries_at_their_coordinates(layout):
    """A NumPy gradient in Fortran order (e.g. computed as (d.T @ x).T) lost its canaries: they were added to the
    temporary copy reshape(-1) makes, so the loop released none while the audit took C at every drawn one. A
    non-contiguous torch gradient (a channels_last conv weight's, a transpose) raised torch's RuntimeError. Now
    each drawn canary is C at its row-major flat coordinate (the one observe reads), in the caller's layout."""
    shapes = {"w": (4, 3, 2, 2)}
    c = GradientCanaries(shapes, count=20, sample_rate=1.0, clip=1.0, seed=4)
    if layout == "numpy-fortran":
        g = np.asfortranarray(np.zeros(shapes["w"]))
    else:
        torch = pytest.importorskip("torch")
        if layout == "torch-transposed":
            g = torch.zeros(2, 2, 3, 4, dtype=torch.float64).permute(3, 2, 1, 0)
        else:
            g = torch.zeros(shapes["w"], dtype=torch.float64).to(memory_format=torch.channels_last)
    out = c.inject(0, {"w": g})["w"]
    flat = np.asarray(out).reshape(-1)  # row-major, whatever the memory layout
    expected = np.zeros(flat.size)
    expected[c.coordinates_] = c.included_  # q = 1: every included canary drawn, C = 1
    assert np.array_equal(flat, expected) and float(np.asarray(g).sum()) == 0  # the caller's array unchanged
    if layout != "numpy-fortran":
        assert out.stride() == g.stride()  # the caller's layout comes back
    c.observe(0, {"w": out})
    assert np.array_equal(c.observations().observations[0], c.included_.astype(float))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_noise_added_in_place_to_a_float64_sum_is_the_noise_observed(kind):
    """inject kept its record of the float64 sum it returned as a view (np.asarray of a float64 array or CPU
    tensor), so a loop adding the noise in place (g += z; g.add_(z)) moved the record with it: noise read as 0,
    the noise check's ratio 0 and a correct loop a "violation". Oracle: Σ z² over the untouched coordinates."""
    c = GradientCanaries(SHAPES, count=25, sample_rate=0.5, clip=1.0, seed=2)
    rng = np.random.default_rng(0)
    for t in range(3):
        g = {n: np.zeros(sh) for n, sh in SHAPES.items()}
        if kind == "torch":
            torch = pytest.importorskip("torch")
            g = {n: torch.as_tensor(v) for n, v in g.items()}
        out = c.inject(t, g)
        z = {n: rng.normal(size=sh) for n, sh in SHAPES.items()}
        for n, v in out.items():
            v += torch.as_tensor(z[n]) if kind == "torch" else z[n]  # in place
        c.observe(t, out)
        free = np.setdiff1d(np.arange(210), c.coordinates_)
        expected = np.concatenate([z[n].reshape(-1) for n in SHAPES])[free]
        assert c.observations().noise_ss[t].sum() == pytest.approx(float(expected @ expected), rel=1e-12)


def test_noise_summary_matches_a_plain_loop_over_untouched_coordinates():
    c = GradientCanaries(SHAPES, count=25, sample_rate=0.5, clip=1.5, seed=2)
    noises = _loop(c, 6, sigma=1.3, seed=9)
    obs = c.observations()
    offsets = {"fc.weight": 0, "fc.bias": 200}
    touched = set(obs.coordinates.tolist())
    for g, (name, shape) in enumerate(SHAPES.items()):
        free = [j for j in range(int(np.prod(shape))) if offsets[name] + j not in touched]
        assert obs.noise_count[g] == len(free)
        for t in range(6):
            z = noises[t][name].reshape(-1)
            assert obs.noise_ss[t, g] == pytest.approx(sum(z[j] ** 2 for j in free), rel=1e-9)


def test_prefix_and_names(tmp_path):
    c = GradientCanaries({"_module." + n: s for n, s in SHAPES.items()}, count=4, sample_rate=0.5, clip=1, seed=0)
    assert list(c.param_shapes) == list(SHAPES)
    out = c.inject(0, {"_module." + n: np.zeros(s) for n, s in SHAPES.items()})
    assert set(out) == {"_module." + n for n in SHAPES}  # the caller's names come back
    c.observe(0, out)


def test_bad_input_is_one_line_input_error(tmp_path):
    c = GradientCanaries(SHAPES, count=4, sample_rate=0.5, clip=1.0, seed=0)
    zeros = {n: np.zeros(s) for n, s in SHAPES.items()}
    with pytest.raises(InputError, match="before inject"):
        c.observe(0, zeros)
    with pytest.raises(InputError, match="expected step 0"):
        c.inject(1, zeros)
    c.inject(0, zeros)
    with pytest.raises(InputError, match="again before observe"):
        c.inject(1, zeros)
    with pytest.raises(InputError, match="expected step 0"):
        c.observe(1, zeros)
    with pytest.raises(InputError, match="another model"):
        c.observe(0, {"fc.weight": np.zeros((20, 11)), "fc.bias": np.zeros(10)})
    with pytest.raises(InputError, match="another model"):
        c.observe(0, {"other": np.zeros(3)})
    with pytest.raises(InputError, match="never observed"):
        c.observations()
    with pytest.raises(InputError, match="parameters"):
        GradientCanaries(SHAPES, count=1000, sample_rate=0.5, clip=1.0, seed=0)
    with pytest.raises(InputError, match="sample_rate"):
        GradientCanaries(SHAPES, count=4, sample_rate=1.5, clip=1.0, seed=0)
    with pytest.raises(InputError, match="clip"):
        GradientCanaries(SHAPES, count=4, sample_rate=0.5, clip=None, seed=0).inject(0, zeros)
    # Fewer than the one-run audit's holdout design takes: refused before the training loop, not by the audit after
    # it. Per-step inclusion and bits the experiment sets itself (included=) are other designs.
    with pytest.raises(InputError, match=r"expected count >= 4, got 3: the one-run audit"):
        GradientCanaries(SHAPES, count=3, sample_rate=0.5, clip=1.0, seed=0)
    assert GradientCanaries(SHAPES, count=3, sample_rate=0.5, clip=1.0, seed=0, inclusion="step").count == 3
    assert GradientCanaries(SHAPES, count=1, sample_rate=0.5, clip=1.0, seed=0, included=[True]).count == 1


def test_a_missing_gradient_and_a_second_observe_are_named_as_such():
    """A None gradient (a torch parameter frozen or unused: p.grad is None) was refused as "dtype object", and a
    second observe of a step as "observe before inject"; each line now says what happened."""
    c = GradientCanaries(SHAPES, count=4, sample_rate=0.5, clip=1.0, seed=0)
    zeros = {n: np.zeros(s) for n, s in SHAPES.items()}
    with pytest.raises(InputError, match=r"parameter 'fc\.bias' has no gradient"):
        c.inject(0, {**zeros, "fc.bias": None})
    c.observe(0, c.inject(0, zeros))
    with pytest.raises(InputError, match=r"observe\(step=0\) again: step 0 was already observed"):
        c.observe(0, zeros)
    with pytest.raises(InputError, match="before inject"):
        c.observe(1, zeros)
    assert c.steps_ == 1


def test_save_load_round_trip_never_overwrites(tmp_path):
    c = GradientCanaries(SHAPES, count=8, sample_rate=0.5, clip=1.0, seed=4)
    _loop(c, 5, sigma=1.0)
    c.save(tmp_path / "c")
    back = load_observations(tmp_path / "c")
    a = c.observations()
    assert back.steps == 5 and back.param_shapes == a.param_shapes
    for k in ("coordinates", "included", "observations", "noise_ss", "noise_count", "projections"):
        np.testing.assert_array_equal(getattr(back, k), getattr(a, k))
    assert not any(p.suffix in {".pkl", ".pt", ".npy"} for p in (tmp_path / "c").iterdir())
    with pytest.raises(InputError, match="already exists"):
        c.save(tmp_path / "c")
    c.save(tmp_path / "c", force=True)
    with pytest.raises(InputError, match="not a gradient-canary directory"):
        load_observations(tmp_path)


def test_design_is_fixed_by_the_seed_and_coins_do_not_move_coordinates():
    a = GradientCanaries(SHAPES, count=10, sample_rate=0.5, clip=1.0, seed=0)
    b = GradientCanaries(SHAPES, count=10, sample_rate=0.5, clip=1.0, seed=0, included=np.ones(10, bool))
    assert np.array_equal(a.coordinates_, b.coordinates_) and b.included_.all()
    assert not np.array_equal(
        a.included_, GradientCanaries(SHAPES, count=10, sample_rate=0.5, clip=1, seed=1).included_
    )


@pytest.mark.parametrize("dtype", ["int32", "float16", "torch.bfloat16"])
def test_inject_refuses_gradients_a_canary_cannot_be_added_to_exactly(dtype):
    """A canary is C added to the clipped sum. Before, an int32 sum truncated C = 0.5 to 0 (the canary silently
    absent) and a float16 sum of 3000 (or a bfloat16 one of 300) rounded it away, while the audit scored C
    released: now a one-line refusal, nothing recorded."""
    if dtype.startswith("torch"):
        torch = pytest.importorskip("torch")
        g = torch.full((8,), 300.0, dtype=torch.bfloat16)
    else:
        g = np.full(8, 3000.0, dtype)
    c = GradientCanaries({"w": (8,)}, count=8, sample_rate=1.0, clip=0.5, seed=0, included=[True] * 4 + [False] * 4)
    with pytest.raises(InputError, match=f"dtype {dtype.removeprefix('torch.')}, not float32 or float64"):
        c.inject(0, {"w": g})
    assert c.steps_ == 0 and c._pending is None


def test_jax_pytree_hooks_match_the_dict_api():
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from dpaudit.hooks.jax_adapter import pytree_hooks, pytree_shapes

    params = {"fc": {"w": jnp.zeros((20, 10)), "b": jnp.zeros(10)}}
    shapes = pytree_shapes(params)
    assert shapes == {"['fc']['b']": (10,), "['fc']['w']": (20, 10)}
    c = GradientCanaries(shapes, count=12, sample_rate=1.0, clip=1.0, seed=0)
    inject, observe = pytree_hooks(c)
    g = inject(0, params)
    assert float(g["fc"]["w"].sum() + g["fc"]["b"].sum()) == c.included_.sum()
    observe(0, g)
    np.testing.assert_array_equal(c.observations().observations[0], c.included_.astype(float))


def test_a_canary_directory_from_another_model_is_refused(tmp_path):
    """Files that do not fit one model (design from one run, arrays from another; shapes edited) are refused
    on load, one line, naming the reason; through the CLI, exit 2."""
    import json

    from typer.testing import CliRunner

    from dpaudit.cli.main import app
    from dpaudit.errors import CheckpointError

    a = GradientCanaries(SHAPES, count=8, sample_rate=0.5, clip=1.0, seed=0)
    _loop(a, 4, sigma=1.0)
    a.save(tmp_path / "a")
    other = {"w": (2000,), "b": (10,)}  # two groups and 8 canaries too, so every array has the same shape
    b = GradientCanaries(other, count=8, sample_rate=0.5, clip=1.0, seed=0)
    for t in range(4):
        b.observe(t, b.inject(t, {n: np.zeros(s) for n, s in other.items()}))
    b.save(tmp_path / "b")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "canaries.json").write_bytes((tmp_path / "a" / "canaries.json").read_bytes())
    (mixed / "canaries.safetensors").write_bytes((tmp_path / "b" / "canaries.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="another model"):
        load_observations(mixed)
    edited = tmp_path / "edited"
    edited.mkdir()
    design = json.loads((tmp_path / "a" / "canaries.json").read_text())
    design["param_shapes"] = {"fc.weight": [20, 9], "fc.bias": [10]}
    (edited / "canaries.json").write_text(json.dumps(design))
    (edited / "canaries.safetensors").write_bytes((tmp_path / "a" / "canaries.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="another model"):
        load_observations(edited)
    for d in (mixed, edited):
        r = CliRunner().invoke(app, ["audit", "canaries", str(d), "--claimed-epsilon", "1", "--delta", "1e-5"])
        assert r.exit_code == 2 and "another model" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert load_observations(tmp_path / "a").steps == 4  # the untouched directory still loads


def test_record_and_gradient_canary_directories_are_not_confused(tmp_path):
    """`canaries make` and the hooks both write canaries.json + canaries.safetensors: each reader names the other."""
    from dpaudit.canaries import make_canary_dir, read_canary_dir
    from dpaudit.data import load_dataset

    make_canary_dir("digits", count=5, kind="mislabeled", out=tmp_path / "records")
    with pytest.raises(InputError, match=r"dpaudit canaries make.*dpaudit import --canaries"):
        load_observations(tmp_path / "records")
    c = GradientCanaries(SHAPES, count=4, sample_rate=0.5, clip=1.0, seed=0)
    _loop(c, 2)
    c.save(tmp_path / "grad")
    with pytest.raises(InputError, match="dpaudit audit canaries"):
        read_canary_dir(tmp_path / "grad", load_dataset("digits"))


def test_dirac_scores_take_a_noise_multiplier_whose_square_overflows():
    """sigma**2 raised OverflowError (`audit canaries --noise-multiplier 1e200`, exit 3); the likelihood ratio
    of a noise that large is flat: every canary scores log(1) = 0."""
    o = np.array([[0.0, 1.0], [2.0, -1.0]])
    np.testing.assert_allclose(dirac_scores(o, 0.3, 1e200), 0.0, atol=1e-12)


def test_a_directory_saved_before_the_cross_group_summary_still_loads_and_is_checked_without_it(tmp_path):
    from safetensors.numpy import load_file, save_file

    from dpaudit.audit.noise import noise_check
    from dpaudit.fileio import write_manifest

    c = GradientCanaries(SHAPES, count=8, sample_rate=0.5, clip=1.0, seed=0)
    _loop(c, 3, sigma=1.0)
    d = c.save(tmp_path / "c")
    arrays = load_file(str(d / "canaries.safetensors"))
    assert arrays["cross"].shape == (3, 2, 2)
    del arrays["cross"]
    save_file(arrays, str(d / "canaries.safetensors"))
    write_manifest(d, written_by="dpaudit")  # as that older version wrote it
    obs = load_observations(d)
    assert obs.cross is None
    check = noise_check(obs.noise_ss, obs.noise_count, obs.projections, noise_std=1.0, cross=obs.cross)
    assert check.cross_group_p_value is None and check.details["alpha_independence"] == pytest.approx(0.025)
    # Continued, it would save a cross-group summary of its later steps only as if of all of them: refused.
    with pytest.raises(InputError, match="saved before the cross-group noise summary existed, so it cannot be cont"):
        GradientCanaries.resume(d)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("param_shapes", [4, 3], "param_shapes: expected an object"),  # was AttributeError, exit 3
        ("param_shapes", {"w": [2**70]}, "expected sizes"),  # was OverflowError, exit 3
        ("sample_rate", True, "sample_rate: expected a number"),  # was read as 1.0
        ("sample_rate", 1.5, "expected sample_rate in"),
        ("seed", 1.5, "seed: expected an integer"),  # was read as 1
        ("inclusion", "x", "unknown inclusion"),  # was read as "run"
        ("clip", -1.0, "expected clip > 0"),
        ("steps", None, "steps: expected an integer"),
    ],
)
def test_a_strangers_canary_design_is_checked_field_by_field(tmp_path, field, value, message):
    """canaries.json from someone else (its manifest rewritten to match, as a stranger's folder would be): each field
    is typed and in range, one line. Edited without the manifest rewritten, the folder is refused as changed since
    it was saved: an edited clip (1 -> 1.5) or sample rate was audited as if observed."""
    import json

    from dpaudit.errors import CheckpointError
    from dpaudit.fileio import write_manifest

    c = GradientCanaries(SHAPES, count=4, sample_rate=0.5, clip=1.0, seed=0)
    _loop(c, 2)
    d = c.save(tmp_path / "c")
    design = json.loads((d / "canaries.json").read_text())
    (d / "canaries.json").write_text(json.dumps({**design, "clip": 1.5}))
    with pytest.raises(CheckpointError, match=r"canaries\.json changed since they were saved"):
        load_observations(d)
    (d / "canaries.json").write_text(json.dumps({**design, field: value}))
    write_manifest(d, written_by="dpaudit")
    with pytest.raises(CheckpointError, match=message):
        load_observations(d)


@pytest.mark.parametrize("inclusion", ["run", "step"])
def test_a_run_resumed_from_its_save_records_what_one_uninterrupted_run_does(tmp_path, inclusion):
    """Before there was no way to continue an interrupted run: new canaries with the same seed restarted at step 0
    with the same draws as steps 0, 1, ... (and a save over the first part's directory lost it). resume() advances
    the streams past the saved steps and reads the sums back: 6 + 4 steps equal 10 uninterrupted, array for array."""
    kw = dict(count=30, sample_rate=0.4, clip=1.5, seed=7, inclusion=inclusion)
    whole = GradientCanaries(SHAPES, **kw)
    _loop(whole, 10, sigma=1.0, seed=3)
    first = GradientCanaries(SHAPES, **kw)
    rng = np.random.default_rng(3)  # the loop's own randomness, continued across the restart as the model's would be
    for t in range(10):
        if t == 6:
            first.meta["implementation_noise_multiplier_min"] = 0.5  # an adapter's record (a noise schedule's range)
            first.save(tmp_path / "c")
            first = GradientCanaries.resume(tmp_path / "c")
            assert first.meta["implementation_noise_multiplier_min"] == 0.5  # kept: the audit refuses σ above it
            with pytest.raises(InputError, match="expected step 6"):  # a model restored from another step is refused
                first.inject(0, {n: np.zeros(sh) for n, sh in SHAPES.items()})
        g = {n: rng.normal(size=sh) * 0.0 for n, sh in SHAPES.items()}
        z = {n: rng.normal(size=sh) * 1.5 for n, sh in SHAPES.items()}
        out = first.inject(t, g)
        first.observe(t, {n: out[n] + z[n] for n in SHAPES})
    first.save(tmp_path / "c", force=True)
    a, b = whole.observations(), load_observations(tmp_path / "c")
    for name in ("coordinates", "included", "observations", "coins", "noise_ss", "noise_count", "projections"):
        np.testing.assert_array_equal(getattr(b, name), getattr(a, name), err_msg=name)
    np.testing.assert_allclose(b.cross, a.cross, rtol=1e-12)  # the same sums, added in another order
    assert b.steps == 10 and (b.clip, b.seed, b.inclusion) == (a.clip, a.seed, a.inclusion)


def test_designs_the_audit_cannot_use_are_refused_in_the_users_terms(tmp_path):
    """A tiny design (2 canaries on a 2-parameter model) was refused with the internals' "holdout guess-count
    selection needs at least 4 canaries"; 4, all included by their fair coins, with "needs each included
    independently with probability 1/2", as if the coins were not fair; a canary on every coordinate with the noise
    check's "needs ... one coordinate without a canary" (no way out given). Each now says what to do."""
    from typer.testing import CliRunner

    from dpaudit.cli.main import app

    args = ["--claimed-epsilon", "1", "--delta", "1e-5", "--noise-multiplier", "1"]
    cases = [(2, "2 gradient canaries: the one-run audit needs at least 4"), (4, "probability 0.12"),
             (6, "every parameter coordinate carries a canary (6), so the noise check")]  # fmt: skip
    for count, message in cases:
        included = [True] * count if count < 6 else [True, False] * 3
        c = GradientCanaries({"w": (6,)}, count=count, sample_rate=0.5, clip=1.0, seed=0, included=included)
        _ = c.inject(0, [np.zeros(6)])
        c.observe(0, [np.ones(6)])
        c.save(tmp_path / str(count))
        res = CliRunner().invoke(app, ["audit", "canaries", str(tmp_path / str(count)), *args])
        assert res.exit_code == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.output


def test_a_run_whose_noisy_sums_went_nan_is_refused_naming_the_step(tmp_path):
    """A diverged run (NaN gradients from step 2 on) was refused as a malformed file ("cross has shape (3, 2, 2),
    expected (3, 2, 2) finite values") with two groups, or "scores must be finite" with one; now one line says
    which steps and why."""
    c = GradientCanaries(SHAPES, count=10, sample_rate=0.5, clip=1.0, seed=0)
    for t in range(4):
        out = c.inject(t, {n: np.full(s, np.nan if t >= 2 else 0.0) for n, s in SHAPES.items()})
        c.observe(t, {n: v + 1.0 for n, v in out.items()})
    c.save(tmp_path / "c")
    with pytest.raises(InputError, match=r"at 2 of 4 steps hold NaN or inf \(the first at step 2\): training diverged"):
        load_observations(tmp_path / "c")


def test_canaries_from_a_tied_models_state_dict_are_told_to_use_named_parameters():
    # state_dict() lists a tied embedding/output weight under both names, named_parameters() (its gradients) once:
    # the refusal said only "missing ['lm_head.weight']: canaries designed for another model?".
    import torch

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(30, 8)
            self.lm_head = torch.nn.Linear(8, 30, bias=False)
            self.lm_head.weight = self.emb.weight

    model = Tied()
    shapes = {n: t.shape for n, t in model.state_dict().items()}
    c = GradientCanaries(shapes, count=4, sample_rate=0.5, clip=1.0, seed=0)
    grads = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    with pytest.raises(InputError, match=r"missing \['lm_head.weight'\], unexpected \[\]") as e:
        c.inject(0, grads)
    assert "named_parameters() lists once" in str(e.value) and "\n" not in str(e.value)
    # built from named_parameters(), the same loop runs
    c = GradientCanaries({n: p.shape for n, p in model.named_parameters()}, count=4, sample_rate=0.5, clip=1.0, seed=0)
    c.observe(0, c.inject(0, grads))
    assert c.steps_ == 1


def test_gradients_of_parameters_left_out_of_the_canaries_are_named_as_possibly_frozen():
    """A torch.func (or jax.grad) loop differentiates every parameter it is given, requires_grad or not: canaries built
    from the trained parameters then got the frozen ones' gradients too, and the refusal said only "unexpected
    ['0.bias', '0.weight']: canaries designed for another model?". It now says they may be frozen and what to pass."""
    c = GradientCanaries({"fc.weight": (20, 10)}, count=4, sample_rate=0.5, clip=1.0, seed=0)
    grads = {n: np.zeros(s) for n, s in SHAPES.items()}
    with pytest.raises(InputError, match=r"unexpected \['fc.bias'\]\).*frozen ones\?.*only the gradients") as e:
        c.inject(0, grads)
    assert "named_parameters() lists once" not in str(e.value) and "\n" not in str(e.value)
