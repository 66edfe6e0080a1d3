"""The share of prior draws inside a sequential SPPE fit's truncated region, round by round: after each round, the
posterior's density threshold (``density_threshold`` at ``truncate`` 1e-4, 100 000 draws, their densities from the
drawing pass), the share of 100 000 prior draws (seeded) at or above it (what a truncated proposal keeps), the same
quantile of ``log_prob`` at the same draws (the threshold before the forty-fifth session) and the largest difference
between the two densities of a draw (RESULTS, "Truncated proposals in 0.37x the CPU time"). One eager fit at the
defaults but ``--rounds``, one torch thread, a JSON row a round on stdout:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/truncated_share.py --task naive_bayes --epsilon 10 --rounds 4
"""

import argparse
import json

import torch

import dpsbi
from dpsbi.experiment.config import build_task
from dpsbi.inference.truncation import density_threshold
from dpsbi.seeds import seeded_global_streams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="naive_bayes")
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = build_task({"name": args.task, "epsilon": args.epsilon})

    def on_round(index: int, posterior: dpsbi.inference.FlowPosterior, num_simulations: int) -> None:
        threshold = density_threshold(posterior, 1e-4, 100_000, seed=123)
        with seeded_global_streams(index):
            theta = task.prior.sample((100_000,))
        share = float((posterior.log_prob(theta).double() >= threshold).double().mean())
        draws, log_q = posterior.sample_and_log_prob((100_000,), seed=123)  # the threshold's draws
        log_prob = posterior.log_prob(draws)
        row = {
            "task": args.task,
            "epsilon": args.epsilon,
            "round": index,
            "share": share,
            "threshold": float(threshold),
            "threshold_of_log_prob": float(torch.quantile(log_prob.double(), 1e-4)),
            "largest_difference": float((log_q - log_prob).abs().max()),
        }
        print(json.dumps(row), flush=True)

    estimator = dpsbi.SPPE(task, seed=0, progress=False, rounds=args.rounds, training=dict(compile=False))
    estimator.on_round_end = on_round
    estimator.run()


if __name__ == "__main__":
    main()
