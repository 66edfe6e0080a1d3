"""The census table's reference posterior from its exact likelihood, kept in dpsbi/data/references.

Self-normalised importance sampling of ``p(theta | y_obs)`` with the exact likelihood of the released table
(``task.exact_log_likelihood``: the C-fold convolution of ``Pois(k; N p_i) q(y_i | k)`` at the invariant total,
``q`` the clamped discrete Gaussian kernel; see ``dpsbi/tasks/census.py``) from a defensive Gaussian mixture fitted
to a pilot around the Laplace approximation (``dpsbi.experiment.reference.likelihood_importance``). No simulation
and no tolerance: the draws are exact up to Monte Carlo error (the Kish ESS is recorded). ``--store`` draws are
kept by systematic resampling, each a distinct proposal point (no repeats for C2ST to recognise).

    OMP_NUM_THREADS=1 python scripts/census_references.py --draws 200000
    OMP_NUM_THREADS=1 python scripts/census_references.py --age-groups 500 --draws 40000 --store 4000

writes ``dpsbi/data/references/census_table.csv`` (``census_table_groups<G>.csv`` for other age groups) and its
provenance ``.json``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import subprocess
import sys
import time

import torch

import dpsbi
from dpsbi.experiment import stored_references
from dpsbi.experiment.reference import likelihood_importance


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--age-groups", type=int, default=None, help="equal age groups (default: DHC's 23)")
    parser.add_argument("--draws", type=int, default=200_000, help="importance draws")
    parser.add_argument("--store", type=int, default=10_000, help="draws kept in the repository")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.time()
    kwargs = {} if args.age_groups is None else {"age_groups": args.age_groups}
    task = dpsbi.tasks.load("census_table", **kwargs)
    draws, info = likelihood_importance(task, args.draws, args.store, seed=args.seed)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    provenance = {
        "method": (
            "self-normalised importance sampling with the exact likelihood (C-fold convolution of Pois(k; N p_i) "
            "q(y_i | k) at the invariant total, q the clamped discrete Gaussian kernel); proposal: defensive "
            "Gaussian mixture fitted to a pilot around the Laplace approximation; "
            f"{args.store} draws by {info['resampling']}"
        ),
        **info,
        "ess": round(info["ess"], 1),
        "seed": args.seed,
        "command": "OMP_NUM_THREADS=1 python scripts/census_references.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "git_commit": commit,
        "made": datetime.date.today().isoformat(),
        "wall_seconds_this_invocation": round(time.time() - started),
    }
    stem = "census_table" if args.age_groups is None else f"census_table_groups{args.age_groups}"
    path = stored_references.write(stem, task, draws, provenance)
    print(
        f"{task.dim_s} cells: ESS {info['ess']:.0f} of {args.draws}; mean {info['weighted_mean']} sd "
        f"{info['weighted_sd']}; MC se {[round(v, 5) for v in info['monte_carlo_se_of_mean']]}; wrote {path} "
        f"in {time.time() - started:.0f} s"
    )
    assert math.isfinite(info["ess"])


if __name__ == "__main__":
    main()
