"""Command-line entry points (placeholder default job until the Hydra experiments land)."""

from __future__ import annotations

import torch

from . import tasks


def run() -> None:
    """Simulate the default task at its true parameter and print the confidential statistic and its release."""
    task = tasks.load("regression", epsilon=1.0)
    generator = torch.Generator().manual_seed(0)
    s = task.simulate(task.true_theta, generator)
    y = task.release(s, generator=generator)
    print(task)
    print("confidential statistic:", [round(v, 4) for v in s[0].tolist()])
    print("DP release:            ", [round(v, 4) for v in y[0].tolist()])
    print("stored release y_obs:  ", [round(v, 4) for v in task.y_obs[0].tolist()])


def sample() -> None:
    """Sampling from a saved posterior arrives with the estimators."""
    raise SystemExit("dpsbi-sample: no saved-posterior support yet")
