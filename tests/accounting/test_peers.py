"""Cross-checks against peer libraries (optional dependencies, used only here as oracles)."""

from __future__ import annotations

import math

import pytest

from dpaudit.accounting import PldAccountant, RdpAccountant, dpsgd_event
from dpaudit.accounting.rdp import DEFAULT_ORDERS
from dpaudit.events import FixedSizeSampled, Gaussian

pytestmark = pytest.mark.peers

# (sample_rate, noise_multiplier, steps): MNIST/TF Privacy tutorial, Opacus CIFAR-10 example-like
# settings, small and large noise, short and long runs.
DPSGD_GRID = [
    (256 / 60000, 1.1, 14063),
    (0.01, 1.0, 1000),
    (0.001, 0.8, 100000),
    (0.05, 2.0, 500),
    (512 / 50000, 1.5, 2000),
    (0.1, 0.6, 100),
    (1e-4, 5.0, 10),
    (0.02, 0.9, 10000),
]


def _dpa_event(q, sigma, steps):
    dpa = pytest.importorskip("dp_accounting")
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)


@pytest.mark.parametrize(("q", "sigma", "steps"), DPSGD_GRID)
@pytest.mark.parametrize("delta", [1e-5, 1e-8])
def test_rdp_matches_dp_accounting(q, sigma, steps, delta):
    dpa = pytest.importorskip("dp_accounting")
    theirs = dpa.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    theirs.compose(_dpa_event(q, sigma, steps))
    ours = RdpAccountant().compose(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps))
    assert ours.epsilon(delta) == pytest.approx(theirs.get_epsilon(delta), rel=1e-6)
    eps = ours.epsilon(delta)
    assert ours.delta(eps) == pytest.approx(theirs.get_delta(eps), rel=1e-6)


@pytest.mark.parametrize(("q", "sigma", "steps"), DPSGD_GRID[:4])
def test_rdp_default_grid_never_looser_than_dp_accounting_default(q, sigma, steps):
    dpa = pytest.importorskip("dp_accounting")
    theirs = dpa.rdp.RdpAccountant()
    theirs.compose(_dpa_event(q, sigma, steps))
    ours = RdpAccountant().compose(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps)).epsilon(1e-5)
    assert ours <= theirs.get_epsilon(1e-5) * (1 + 1e-9)


@pytest.mark.parametrize(("q", "sigma", "steps"), [(256 / 60000, 1.1, 14063), (0.01, 1.0, 1000), (0.05, 2.0, 500)])
def test_pld_matches_dp_accounting(q, sigma, steps):
    dpa = pytest.importorskip("dp_accounting")
    ours = PldAccountant().compose(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps))
    # On the finest grid ours evaluates (finer than 1e-4 nats when one step's loss spans few points of it:
    # PldAccountant._grids), and never looser than dp_accounting's default grid.
    finest = ours._grids(ours.jl_initial_cap)[-1]
    theirs = dpa.pld.PLDAccountant(value_discretization_interval=finest)
    theirs.compose(_dpa_event(q, sigma, steps))
    assert ours.epsilon(1e-5) == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-2)
    # δ where it is a real tail mass (1e-8), abs=0: δ(1.0) was ~1e-15 on some rows (both accountants' tail
    # floors: 1.0e-15 vs 1.5e-15 at (1e-4, 5.0, 10)), below approx's default abs of 1e-12, so it could not fail
    eps8 = theirs.get_epsilon(1e-8)
    assert ours.delta(eps8) == pytest.approx(theirs.get_delta(eps8), rel=1e-2, abs=0)
    default = dpa.pld.PLDAccountant()
    default.compose(_dpa_event(q, sigma, steps))
    assert ours.epsilon(1e-5) <= default.get_epsilon(1e-5) * (1 + 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(("q", "sigma", "steps"), DPSGD_GRID[3:])
def test_pld_matches_dp_accounting_more(q, sigma, steps):
    test_pld_matches_dp_accounting(q, sigma, steps)


def test_sampling_without_replacement_matches_dp_accounting():
    # dp_accounting's noise multiplier for SampledWithoutReplacement is relative to the replace-one
    # sensitivity (2C); ours is relative to C, so sigma_theirs = sigma_ours / 2.
    dpa = pytest.importorskip("dp_accounting")
    theirs = dpa.rdp.RdpAccountant(
        orders=list(DEFAULT_ORDERS), neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE
    )
    theirs.compose(
        dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(1000, 10, dpa.GaussianDpEvent(1.0)), 500)
    )
    ours = RdpAccountant(neighbouring="replace_one").compose(FixedSizeSampled(10, 1000, Gaussian(2.0)), 500)
    assert ours.epsilon(1e-5) == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize(("q", "sigma", "steps"), DPSGD_GRID[:5])
def test_rdp_matches_opacus(q, sigma, steps):
    accountants = pytest.importorskip("opacus.accountants")
    theirs = accountants.RDPAccountant()
    theirs.history = [(sigma, q, steps)]
    ours = RdpAccountant().compose(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps)).epsilon(1e-5)
    assert ours == pytest.approx(theirs.get_epsilon(1e-5, alphas=list(DEFAULT_ORDERS)), rel=1e-6)


@pytest.mark.parametrize(("q", "sigma", "steps"), [(256 / 60000, 1.1, 14063), (0.01, 1.0, 1000)])
def test_pld_close_to_opacus_prv(q, sigma, steps):
    accountants = pytest.importorskip("opacus.accountants")
    theirs = accountants.PRVAccountant()
    theirs.history = [(sigma, q, steps)]
    prv = theirs.get_epsilon(1e-5)  # an estimate with +-0.01 error bars on epsilon
    ours = PldAccountant().compose(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps)).epsilon(1e-5)
    assert ours == pytest.approx(prv, rel=1.5e-2)
    assert math.isfinite(ours)
