"""One SPPE fit over epsilon in (0.1, 1) on a user's two-parameter model, scored by C2ST against exact posteriors
at six unseen (release, epsilon) pairs: the measurement behind the amortized defaults (docs/YOUR_MODEL.md, 6).

The model: ``theta ~ N(0, I_2)``, confidential ``s = M theta + N(0, 0.3^2 I)`` with ``M = [[1, 0], [0.7, 1]]``,
released with Laplace noise of L1 sensitivity 0.2 (scale 2 to 0.2 over the range); its exact posterior is
computed on a 500 x 500 grid (the likelihood of each coordinate is a normal-Laplace convolution in closed
form). Prints one JSON line: settings, fit wall and CPU seconds, seconds for 2000 draws (``--draws``) at all six
pairs in one batched call, the C2STs (as many posterior as exact draws), their mean and worst.

    python scripts/amortized_epsilon.py                     # SPPE(task, amortized=True, epsilon_range=(0.1, 1))
    python scripts/amortized_epsilon.py '{"rounds": 5}'     # keyword arguments over those
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch
from scipy.special import erfc, logsumexp

import dpsbi
from dpsbi.mechanisms import Laplace
from dpsbi.metrics import c2st

M = torch.tensor([[1.0, 0.0], [0.7, 1.0]])
TAU, SENSITIVITY, RANGE = 0.3, 0.2, (0.1, 1.0)
PAIR_EPSILONS = (0.12, 0.25, 0.5, 0.8, 0.95, 0.18)


def simulator(theta, rng):
    return theta @ M.T + TAU * torch.randn(theta.shape, generator=rng)


def make_task(epsilon: float = 0.3):
    return dpsbi.tasks.from_simulator(
        dpsbi.tasks.normal([0.0, 0.0], [1.0, 1.0]), simulator, Laplace(epsilon, SENSITIVITY, dim=2), None
    )


def log_convolution(x: np.ndarray, b: float) -> np.ndarray:
    """Log density of ``N(0, TAU^2) + Laplace(b)`` at ``x``."""
    t2 = TAU**2
    first = t2 / (2 * b * b) - x / b + np.log(erfc((t2 / b - x) / (math.sqrt(2) * TAU)))
    second = t2 / (2 * b * b) + x / b + np.log(erfc((t2 / b + x) / (math.sqrt(2) * TAU)))
    return np.logaddexp(first, second) - np.log(4 * b)


def exact_draws(y: np.ndarray, epsilon: float, n: int, seed: int, width: float = 4.5, points: int = 500):
    """``n`` draws of the exact posterior at release ``y`` and ``epsilon``: grid cells, jittered within the cell."""
    b = SENSITIVITY / epsilon
    grid = np.linspace(-width, width, points)
    theta = np.stack([g.ravel() for g in np.meshgrid(grid, grid, indexing="ij")], -1)
    mean = theta @ M.numpy().T
    log_p = (
        -0.5 * (theta**2).sum(-1)
        + log_convolution(y[0] - mean[:, 0], b)
        + log_convolution(y[1] - mean[:, 1], b)
    )
    rng = np.random.default_rng(seed)
    index = rng.choice(len(log_p), size=n, p=np.exp(log_p - logsumexp(log_p)))
    h = grid[1] - grid[0]
    return torch.tensor(theta[index] + rng.uniform(-h / 2, h / 2, size=(n, 2)), dtype=torch.float32)


def main(settings: dict, n: int = 2000) -> dict:
    torch.set_num_threads(1)
    task = make_task()
    wall, cpu = time.perf_counter(), time.process_time()
    estimator = dpsbi.SPPE(task, amortized=True, epsilon_range=RANGE, progress=False, seed=1, **settings)
    posterior = estimator.run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    generator = torch.Generator().manual_seed(123)
    pairs = []
    for epsilon in PAIR_EPSILONS:  # releases of fresh prior draws, at epsilons the fit never saw exactly
        theta = torch.randn(1, 2, generator=generator)
        pairs.append(
            (
                Laplace(epsilon, SENSITIVITY, dim=2).sample(simulator(theta, generator), generator=generator)[
                    0
                ],
                epsilon,
            )
        )
    start = time.perf_counter()
    draws = posterior.sample_batched(
        (n,), y=torch.stack([y for y, _ in pairs]), epsilon=torch.tensor(PAIR_EPSILONS), seed=0
    )
    sampling = time.perf_counter() - start
    scores = [
        round(c2st(draws[:, b], exact_draws(y.numpy(), eps, n, seed=b)), 3)
        for b, (y, eps) in enumerate(pairs)
    ]
    return {
        "settings": settings,
        "fit_wall_s": round(wall, 1),
        "fit_cpu_s": round(cpu, 1),
        f"draws_{n}_at_6_pairs_s": round(sampling, 3),
        "c2st": scores,
        "mean": round(sum(scores) / len(scores), 3),
        "worst": max(scores),
        "rounds": len(estimator.history),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "settings", nargs="?", type=json.loads, default={}, help="SPPE keyword arguments as JSON"
    )
    parser.add_argument("--draws", type=int, default=2000, help="posterior and exact draws at each pair")
    args = parser.parse_args()
    print(json.dumps(main(args.settings, args.draws)), flush=True)
