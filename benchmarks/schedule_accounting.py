"""Time of accounting DP-SGD schedules of many phases (a noise multiplier or sample rate that changes every epoch),
ours against dp_accounting's on the same composition, in the same run.

The schedule of n phases: 20,000 steps in all (20,000 / n a phase), the noise multiplier falling linearly from 2.0
to 0.8 (per-epoch noise decay), the sample rate alternating 0.004 / 0.008 (a batch size changed every epoch):
n distinct (sigma, q). delta = 1e-5. For each n and accountant it prints our epsilon, CPU and wall seconds, and
dp_accounting's epsilon and CPU seconds on ComposedDpEvent([SelfComposedDpEvent(PoissonSampledDpEvent(q,
GaussianDpEvent(sigma)), t), ...]) (RDP: our orders; PLD: our coarsest grid step, pessimistic), and the ratio of their
CPU time to ours. dp_accounting has no GDP accountant: there the peer is the closed form of the CLT (Bu, Dong, Long &
Su 2020, mu = sqrt(sum_k T_k q_k^2 (e^(1/sigma_k^2) - 1))) through our gdp_epsilon. A run over ``--timeout`` seconds
is stopped and printed as such (SIGALRM, in process).

Run (from the repository root; the "before" numbers of benchmarks/RESULTS.md came from the same script with
PYTHONPATH at an export of the previous commit):

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/schedule_accounting.py \
        [--phases 10,100,500,2000] [--accountants rdp,pld,gdp] [--peer-max-phases rdp=500,pld=100] [--timeout 900]
"""

from __future__ import annotations

import argparse
import math
import signal
import time
import warnings

DELTA = 1e-5
TOTAL_STEPS = 20_000


def schedule(n: int) -> list[tuple[float, float, int]]:
    steps = TOTAL_STEPS // n
    return [(2.0 - 1.2 * k / max(n - 1, 1), 0.004 if k % 2 == 0 else 0.008, steps) for k in range(n)]


class _Timeout(Exception):
    pass


def _timed(fn, timeout: int):
    """(result or None when stopped, CPU seconds, wall seconds)."""

    def stop(signum, frame):
        raise _Timeout

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(timeout)
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        out = fn()
    except _Timeout:
        out = None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return out, time.process_time() - cpu, time.perf_counter() - wall


def ours(phases, accountant: str) -> float:
    from dpaudit.accounting import dpsgd_schedule_event, epsilon_for

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GDP's CLT caveat
        return epsilon_for(dpsgd_schedule_event(phases), DELTA, accountant)


def peer(phases, accountant: str) -> float:
    if accountant == "gdp":
        from dpaudit.accounting import gdp_epsilon

        return gdp_epsilon(math.sqrt(sum(t * q * q * math.expm1(1.0 / (s * s)) for s, q, t in phases)), DELTA)
    import dp_accounting as dpa

    event = dpa.ComposedDpEvent(
        [dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(s)), t) for s, q, t in phases]
    )
    if accountant == "rdp":
        from dpaudit.accounting.rdp import DEFAULT_ORDERS

        acc = dpa.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    else:
        from dpaudit.accounting import PldAccountant, dpsgd_schedule_event

        mine = PldAccountant().compose(dpsgd_schedule_event(phases))
        acc = dpa.pld.PLDAccountant(value_discretization_interval=mine._grids(mine.jl_initial_cap)[0])
    acc.compose(event)
    return acc.get_epsilon(DELTA)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", default="10,100,500,2000")
    ap.add_argument("--accountants", default="rdp,pld,gdp")
    ap.add_argument("--peer-max-phases", default="rdp=500,pld=100,gdp=100000")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--no-peer", action="store_true", help="ours only (e.g. for the previous commit's times)")
    args = ap.parse_args()
    limits = dict(kv.split("=") for kv in args.peer_max_phases.split(","))
    for accountant in args.accountants.split(","):  # imports and first-call set-up, not timed
        ours(schedule(2), accountant)
    print("phases  acc   ours eps        ours cpu s  wall s   peer eps        peer cpu s  peer/ours", flush=True)
    for n in (int(v) for v in args.phases.split(",")):
        phases = schedule(n)
        for accountant in args.accountants.split(","):
            eps, cpu, wall = _timed(lambda a=accountant, p=phases: ours(p, a), args.timeout)
            shown = f"{eps:<14.8g}" if eps is not None else f"{'stopped':14s}"
            line = f"{n:6d}  {accountant:4s}  {shown}  {cpu:10.2f}  {wall:6.1f}"
            if not args.no_peer and n <= int(limits.get(accountant, 0)):
                p_eps, p_cpu, _ = _timed(lambda a=accountant, p=phases: peer(p, a), args.timeout)
                ratio = f"{p_cpu / cpu:9.2f}" if cpu > 0 else "      n/a"
                line += f"   {p_eps:<14.8g}  {p_cpu:10.2f}  {ratio}" if p_eps is not None else "   stopped"
            print(line, flush=True)


if __name__ == "__main__":
    main()
