"""Independent bracket of a DP-SGD-JL run's recorded ε (no dpaudit code): per step the law of
Z_r = 1/sqrt(χ²_r/r) is revealed and the pair is P = (1-q)N(0,1) + qN(Z_r/σ,1) vs Q = N(0,1) (removal) or
swapped (addition) (Bu et al. 2021, arXiv:2102.03013, Lemma 4.3, Thm 4.1); the PLD of the mixture over Z_r's
quantile bins (upper ends: pessimistic, the last bin's mass 1e-10 charged to δ per step; lower ends:
optimistic), losses rounded up to a grid of 2e-3, composed by convolution; δ(ε) = E_P[(1 - e^{ε-L})_+]
(Sommer et al. 2019, "Privacy loss classes", Eq. 4). The larger ε of the two directions is printed.

Run: /work/main/.venv/bin/python benchmarks/jl_epsilon_bracket.py Q SIGMA R STEPS DELTA
(the 2026-11-28 eighth-session check: 0.238095238 1.3671875 16 5 1e-5 -> [3.9600, 3.9829], recorded 3.97412).
"""

import sys

import numpy as np
from scipy import optimize, stats

q, s, r, T, delta = (float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
h, tail_u = 2e-3, 1e-10
u = np.concatenate([np.linspace(0, 0.99, 991), 1 - np.geomspace(1e-2, tail_u, 400)[1:], [1.0]])
with np.errstate(divide="ignore"):
    Z = 1 / np.sqrt(stats.chi2.ppf(1 - u, r) / r)  # increasing in u; Z[-1] = inf


def pld(direction, zs, w):
    y = np.linspace(-12, 12 + zs.max() / s, 40001)
    parts = []
    for z, wt in zip(zs, w, strict=True):
        p_mix, p0 = (1 - q) * stats.norm.pdf(y) + q * stats.norm.pdf(y - z / s), stats.norm.pdf(y)
        P, L = (p_mix, np.log(p_mix / p0)) if direction == "remove" else (p0, np.log(p0 / p_mix))
        idx = np.ceil(L / h).astype(int)  # rounded up: pessimistic in the loss
        parts.append((idx.min(), np.bincount(idx - idx.min(), weights=wt * P / P.sum())))
    lo = min(a for a, _ in parts)
    tot = np.zeros(max(a + len(b) for a, b in parts) - lo)
    for a, b in parts:
        tot[a - lo : a - lo + len(b)] += b
    return lo, tot


def epsilon(lo, p, extra):
    out = p
    for _ in range(T - 1):
        out = np.convolve(out, p)
    L = (T * lo + np.arange(len(out))) * h
    return optimize.brentq(lambda e: np.sum(np.where(L > e, out * (1 - np.exp(e - L)), 0)) + extra - delta, 0, 50)


w = np.diff(u)
upper = max(epsilon(*pld(d, Z[1:-1], w[:-1]), T * tail_u) for d in ("remove", "add"))
lower = max(epsilon(*pld(d, Z[:-1], w), 0.0) for d in ("remove", "add"))
print(f"epsilon in [{lower:.4f}, {upper:.4f}]")
