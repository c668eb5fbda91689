"""benchmarks/step_profile.py (issue 26): the per-step profile that tells a host-bound GPU step from a
device-bound one. Run on the CPU here (no device events); gpu_check.sh runs it on a GPU."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.benchmark_modules import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("step_profile"), import_benchmark("dpsgd_throughput")


def test_ops_counts_top_level_calls_only(bench):
    # ones() dispatches empty + fill_ inside it, mul() and add() nothing else: 3 top-level ops per step.
    step_profile, _ = bench

    def step():
        torch.ones(3).mul(2).add(1)

    r = step_profile.profile_step(step, steps=4, device=torch.device("cpu"))
    assert r["ops"] == 3
    assert r["kernel_ms"] is None and r["launches"] is None  # no device events on a CPU
    names = {key for key, _, _ in r["top"]}
    assert {"aten::ones", "aten::mul", "aten::add"} <= names


def test_ghost_step_profile_on_cpu(bench):
    step_profile, dpsgd_throughput = bench
    model, x, y = dpsgd_throughput.workloads(4, torch.device("cpu"), "small")["tied"]
    make = dpsgd_throughput.makers(x, y, loop=False)
    base = step_profile.profile_step(make["non-private"](copy.deepcopy(model)), 3, torch.device("cpu"))
    ghost = step_profile.profile_step(make["ours ghost"](copy.deepcopy(model)), 3, torch.device("cpu"))
    assert base["wall_ms"] > 0 and ghost["wall_ms"] > 0
    # The ghost step runs the same forward/backward plus norms, book-keeping and noise: more ops.
    assert ghost["ops"] > base["ops"] > 10
    assert any(key == "aten::bmm" for key, _, _ in ghost["top"])  # the tied weight's ghost norms
