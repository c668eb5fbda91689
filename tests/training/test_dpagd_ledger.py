"""DP-AGD's ledger charges every NoisyMax it runs (issue 27: the re-run after GRADAVG went uncharged)."""

from __future__ import annotations

import numpy as np

from dpaudit.training import dpagd as agd


def test_every_noisy_max_run_is_charged_including_the_rerun_after_gradavg(monkeypatch):
    """Count the NoisyMax selections the algorithm actually makes (a spy on noisy_argmin) and compare
    with the ledger's noisy_max count, over runs where GRADAVG happens (a step of size 0 chosen)."""
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(60, 4))
    Z /= np.maximum(1.0, np.linalg.norm(Z, axis=1, keepdims=True))
    s = np.where(Z[:, 0] > 0, 1.0, -1.0)
    calls = []
    real = agd.noisy_argmin

    def spy(values, scale, rng):
        calls.append(scale)
        return real(values, scale, rng)

    monkeypatch.setattr(agd, "noisy_argmin", spy)
    averaged = 0
    for seed in range(12):
        calls.clear()
        config = agd.DPAGDConfig(epsilon=[0.05, 0.3, 2.0][seed % 3], delta=1e-5, splits=[5, 20, 60][seed % 3])
        result = agd.dpagd(Z, s, config, np.random.default_rng(seed))
        counts = result.ledger.totals()["count"]
        assert counts["noisy_max"] == len(calls), (counts, len(calls))
        kinds = [k for k, _ in result.ledger.charges]
        # every GRADAVG is followed by the NoisyMax that selects a step for the averaged gradient
        assert all(kinds[i + 1] == "noisy_max" for i, k in enumerate(kinds) if k == "gradavg")
        averaged += counts["gradavg"]
    assert averaged > 0  # the re-run after GRADAVG is exercised
