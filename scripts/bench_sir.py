"""Throughput of the SIR simulators at theta = (-0.5, -3), K = 10^6: ``python scripts/bench_sir.py``.

The exact simulator runs one batch per repeat on all numba threads; JIT compilation and a warm-up
batch are excluded. Reports the median over repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numba
import numpy as np
import torch

from dpsbi.simulators import gillespie_sir, tau_leap_sir

THETA = (-0.5, -3.0)
POPULATION = 1_000_000


def timed(run: Callable[[int], object], repeats: int) -> tuple[float, list[object]]:
    """Median wall time of ``run(repeat)`` over ``repeats`` calls (after a warm-up call) and the results."""
    run(-1)
    seconds, results = [], []
    for repeat in range(repeats):
        start = time.perf_counter()
        results.append(run(repeat))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), results


def bench_exact(batch: int, repeats: int) -> None:
    theta = np.tile(THETA, (batch, 1))

    def run(seed: int) -> np.ndarray:
        return gillespie_sir(theta, POPULATION, seed=seed + 1, return_all=True)

    seconds, results = timed(run, repeats)
    sir = np.concatenate(results)
    events = (POPULATION - 1 - sir[:, -1, 0]) + sir[:, -1, 2]  # infections + recoveries
    major = events >= POPULATION // 10
    events_per_second = events.sum() / (seconds * repeats)
    print(
        f"exact Gillespie (numba, {numba.get_num_threads()} threads), batch {batch}: "
        f"{batch / seconds:.1f} simulations/s ({1 - major.mean():.0%} minor outbreaks); "
        f"{events_per_second / 1e6:.0f} M events/s, i.e. "
        f"{events_per_second / events[major].mean():.1f} major outbreaks/s "
        f"({events[major].mean() / 1e6:.2f} M events each)"
    )


def bench_tau_leap(batch: int, repeats: int, dt: float) -> None:
    theta = torch.tensor(np.tile(THETA, (batch, 1)))
    generator = torch.Generator().manual_seed(0)
    seconds, _ = timed(lambda _: tau_leap_sir(theta, POPULATION, dt=dt, generator=generator), repeats)
    print(
        f"tau-leaping (torch CPU, {torch.get_num_threads()} threads, dt={dt}), batch {batch}: "
        f"{batch / seconds:.0f} simulations/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=120, help="trajectories per exact batch")
    parser.add_argument("--tau-batch", type=int, default=1000, help="trajectories per tau-leap batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dt", type=float, default=0.1)
    args = parser.parse_args()
    bench_exact(args.batch, args.repeats)
    bench_tau_leap(args.tau_batch, args.repeats, args.dt)


if __name__ == "__main__":
    main()
