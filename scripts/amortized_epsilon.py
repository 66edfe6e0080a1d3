"""One SPPE fit over a range of epsilon (0.1-1 unless ``--range``) on a user's two-parameter model, scored by C2ST
against exact posteriors at unseen (release, epsilon) pairs (six by default): the measurement behind the amortized
defaults (docs/YOUR_MODEL.md, 6).

The model: ``theta ~ N(0, I_2)``, confidential ``s = M theta + N(0, 0.3^2 I)`` with ``M = [[1, 0], [0.7, 1]]``,
released with Laplace noise of L1 sensitivity 0.2 (scale 2 to 0.2 over the range); its exact posterior is
computed on a 500 x 500 grid (the likelihood of each coordinate is a normal-Laplace convolution in closed
form). Prints one JSON line: settings, fit wall and CPU seconds, seconds for 2000 draws (``--draws``) at all six
pairs in one batched call, the C2STs (as many posterior as exact draws), their mean and worst.

    python scripts/amortized_epsilon.py                     # SPPE(task, amortized=True, epsilon_range=(0.1, 1))
    python scripts/amortized_epsilon.py '{"rounds": 5}'     # keyword arguments over those
    python scripts/amortized_epsilon.py --range 0.1 10 --epsilons 0.15 1 8 --releases 20   # a hundredfold range

The row also gives each epsilon's mean and worst C2ST and its mean posterior sd over the exact one's
(``dpsbi.metrics.spread_ratios``), per parameter and overall.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import numpy as np
import torch
from scipy.special import log_ndtr, logsumexp

import dpsbi
from dpsbi.mechanisms import Laplace
from dpsbi.metrics import c2st, spread_ratios

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
    # log erfc(z) = log 2 + log Phi(-sqrt(2) z): finite where erfc underflows (small b, far x)
    first = t2 / (2 * b * b) - x / b + math.log(2) + log_ndtr(-(t2 / b - x) / TAU)
    second = t2 / (2 * b * b) + x / b + math.log(2) + log_ndtr(-(t2 / b + x) / TAU)
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


def pairs_at(epsilons: tuple[float, ...], releases: int) -> list[tuple[torch.Tensor, float]]:
    """``releases`` (release, epsilon) pairs at each of ``epsilons``, each a fresh prior draw's release."""
    generator = torch.Generator().manual_seed(123)
    pairs = []
    for epsilon in epsilons:
        for _ in range(releases):
            theta = torch.randn(1, 2, generator=generator)
            mechanism = Laplace(epsilon, SENSITIVITY, dim=2)
            pairs.append((mechanism.sample(simulator(theta, generator), generator=generator)[0], epsilon))
    return pairs


def main(
    settings: dict,
    n: int = 2000,
    epsilon_range: tuple[float, float] = RANGE,
    epsilons: tuple[float, ...] = PAIR_EPSILONS,
    releases: int = 1,
) -> dict:
    torch.set_num_threads(1)
    task = make_task()
    wall, cpu = time.perf_counter(), time.process_time()
    fit = {"amortized": True, "epsilon_range": epsilon_range, "progress": False, "seed": 1}
    estimator = dpsbi.SPPE(task, **fit, **settings)
    posterior = estimator.run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    pairs = pairs_at(epsilons, releases)  # at epsilons the fit never saw exactly
    start = time.perf_counter()
    y, at = torch.stack([y for y, _ in pairs]), torch.tensor([e for _, e in pairs])
    draws = posterior.sample_batched((n,), y=y, epsilon=at, seed=0)
    sampling = time.perf_counter() - start
    exact = [exact_draws(y.numpy(), eps, n, seed=b) for b, (y, eps) in enumerate(pairs)]
    scores = [round(c2st(draws[:, b], exact[b]), 3) for b in range(len(pairs))]
    sd_ratios = [spread_ratios(draws[:, b], exact[b])["sd_ratio"] for b in range(len(pairs))]
    row = {
        "settings": settings,
        "fit_wall_s": round(wall, 1),
        "fit_cpu_s": round(cpu, 1),
        f"draws_{n}_at_{len(pairs)}_pairs_s": round(sampling, 3),
        "c2st": scores,
        "mean": round(sum(scores) / len(scores), 3),
        "worst": max(scores),
        "rounds": len(estimator.history),
    }
    by_epsilon = {}
    for k, epsilon in enumerate(epsilons):
        part = slice(k * releases, (k + 1) * releases)
        ratios = torch.tensor(sd_ratios[part])  # (releases, 2)
        by_epsilon[str(epsilon)] = {
            "c2st_mean": round(statistics.mean(scores[part]), 4),
            "c2st_worst": max(scores[part]),
            "sd_ratio_mean": round(float(ratios.mean()), 4),
            "sd_ratio_by_parameter": [round(v, 4) for v in ratios.mean(0).tolist()],
        }
    return {**row, "epsilon_range": list(epsilon_range), "releases": releases, "by_epsilon": by_epsilon}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "settings", nargs="?", type=json.loads, default={}, help="SPPE keyword arguments as JSON"
    )
    parser.add_argument("--draws", type=int, default=2000, help="posterior and exact draws at each pair")
    parser.add_argument(
        "--range", type=float, nargs=2, default=RANGE, metavar=("LOW", "HIGH"), help="the fit's epsilon range"
    )
    parser.add_argument(
        "--epsilons", type=float, nargs="+", default=PAIR_EPSILONS, help="the epsilons scored, inside --range"
    )
    parser.add_argument("--releases", type=int, default=1, help="prior-predictive releases at each epsilon")
    args = parser.parse_args()
    low, high = args.range
    if not 0 < low < high or not all(low <= e <= high for e in args.epsilons):
        parser.error(
            f"need 0 < LOW < HIGH and every --epsilons inside it, got {args.range} and {args.epsilons}"
        )
    row = main(args.settings, args.draws, (low, high), tuple(args.epsilons), args.releases)
    print(json.dumps(row), flush=True)
