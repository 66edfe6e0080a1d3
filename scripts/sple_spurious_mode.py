"""Where SPLE's draws on a privatized outbreak curve leave the exact posterior, and whose error that is.

For an ``experiment=sir_outbreaks_private`` SPLE run directory: per round, the share of SPLE's draws below the
exact reference's smallest ``log_gamma`` (the spurious low-gamma mode) and the round's C2ST; then, at the
chosen round, the learned likelihood ``log q(y_obs | theta)`` and the exact model's likelihood
``log mean_j eta(y_obs | s_j)`` (``s_j`` simulated by the exact simulator at ``theta``, ``--reps`` of them) at
reference draws and at draws of the spurious mode. A mode where the learned likelihood is close to the main
mode's while the exact one is far lower is the likelihood flow's error, not the sampler's::

    NUMBA_NUM_THREADS=1 python scripts/sple_spurious_mode.py multirun/outbreaks_private_sple12/0_sir_ebola_guinea_epsNone_sple
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from dpsbi.baselines.pmmh import PseudoMarginal
from dpsbi.experiment.outputs import read_draws
from dpsbi.inference.posterior import load_posterior


def draws(path: Path) -> torch.Tensor:
    """Parameter draws ``(n, 2)`` from a run's CSV file."""
    return read_draws(path)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an SPLE run directory of experiment=sir_outbreaks_private")
    parser.add_argument("--round", type=int, help="the round to probe (default: the last)")
    parser.add_argument("--points", type=int, default=12, help="draws probed in each region")
    parser.add_argument("--reps", type=int, default=400, help="exact simulations per probed draw")
    args = parser.parse_args()
    reference = draws(args.run / "reference.csv")
    floor = float(reference[:, 1].min())
    rows = json.loads((args.run / "sple" / "rounds.json").read_text())
    for row in rows:
        own = draws(args.run / "sple" / f"samples_round_{row['round']:02d}.csv")
        share = float((own[:, 1] < floor).float().mean())
        print(
            f"round {row['round']}: C2ST {row['c2st']:.3f}, draws below the reference's log_gamma: {share:.3f}"
        )
    number = args.round or rows[-1]["round"]
    posterior = load_posterior(args.run / "sple" / "rounds" / f"round_{number:02d}.pt", "cpu")
    task = posterior.task
    own = draws(args.run / "sple" / f"samples_round_{number:02d}.csv")
    generator = torch.Generator().manual_seed(0)
    pseudo_marginal = PseudoMarginal(
        task.simulate, task.mechanism, task.y_obs, args.reps
    )  # log mean_j eta(y_obs | s_j)
    regions = {"reference": reference, "spurious mode": own[own[:, 1] < floor]}
    for name, region in regions.items():
        if len(region) == 0:
            print(f"round {number}, {name}: no draws")
            continue
        theta = region[torch.randperm(len(region), generator=generator)[: args.points]]
        with torch.no_grad():
            learned = posterior.log_likelihood_z(
                task.y_obs.reshape(1, -1), posterior.space.to_z(theta)
            ).numpy()
        exact = pseudo_marginal.log_estimate(theta, generator).numpy()
        print(
            f"round {number}, {name} ({len(theta)} draws, mean theta {np.round(theta.double().mean(0).numpy(), 2)}): "
            f"log likelihood at y_obs, median: learned {np.median(learned):.1f}, exact {np.median(exact):.1f}"
        )


if __name__ == "__main__":
    main()
