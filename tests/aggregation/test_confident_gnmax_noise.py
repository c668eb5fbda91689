"""Confident-GNMax's answer noise against its law (issue 27: halving it went uncaught).

With two classes whose vote counts differ by g and a threshold every query passes, the answer is the
minority class exactly when N(0, σ²) − N(0, σ²) > g, i.e. with probability Φ(−g / (σ√2)) (Papernot et
al. 2018, arXiv:1802.08908, Alg. 1, the answer step argmax_j n_j + N(0, σ₂²)).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import norm

from dpaudit import aggregation

QUERIES = 20_000


def test_confident_gnmax_answer_frequency_matches_phi():
    sigma, gap = 2.0, 2.0
    hist = np.tile(np.array([[10, 10 - gap]]), (QUERIES, 1))
    # threshold 0 with sigma1 = 1: max count 10 passes unless N(0, 1) < -10 (probability ~1e-23).
    config = aggregation.AggregatorConfig("confident-gnmax", sigma=sigma, sigma1=1.0, threshold=0.0)
    answers = aggregation.aggregate(hist, config, seed=0)
    assert np.all(answers >= 0)
    p = float(norm.cdf(-gap / (sigma * math.sqrt(2.0))))  # 0.240; half the noise would give 0.079
    observed = float(np.mean(answers == 1))
    se = math.sqrt(p * (1 - p) / QUERIES)  # 0.003
    assert abs(observed - p) < 5 * se, (observed, p)
