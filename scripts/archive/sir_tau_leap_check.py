"""How far the tau-leap SIR model's private posterior is from the exact (Gillespie) model's, at a stored release.

docs/RESULTS.md runs its SIR grid with ``task.simulator=tau_leap`` (the exact simulator makes ~100-200
simulations per second on 2 cores). This script builds the importance reference of both models at the same
release and prints their means, sds, ESS and the C2ST between them:
``python scripts/archive/sir_tau_leap_check.py [--epsilon 1] [--draws 20000]``.
"""

from __future__ import annotations

import argparse
import time

import torch

import dpsbi
from dpsbi.experiment.reference import reference_posterior
from dpsbi.metrics import c2st


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--draws", type=int, default=20_000, help="importance draws per model")
    parser.add_argument("--particles", type=int, default=2000, help="SMC-ABC pilot particles per model")
    parser.add_argument("--samples", type=int, default=1000, help="resampled reference draws compared")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    refs = {}
    for simulator in ("tau_leap", "exact"):
        task = dpsbi.tasks.load("sir", epsilon=args.epsilon, simulator=simulator)
        start = time.time()
        refs[simulator] = reference_posterior(
            task,
            {"name": "sir", "epsilon": args.epsilon, "simulator": simulator},
            "importance",
            args.samples,
            None,
            seed=0,
            progress=False,
            pilot_simulations=0,
            max_simulations=0,
            importance_particles=args.particles,
            importance_draws=args.draws,
        )
        ref = refs[simulator]
        print(f"{simulator}: {time.time() - start:.0f} s, {ref.num_simulations} simulations; {ref.note}")
        print(f"  mean {ref.samples.mean(0).tolist()}  sd {ref.samples.std(0).tolist()}")
    tau, exact = refs["tau_leap"].samples, refs["exact"].samples
    print(
        f"(mean tau-leap - mean exact) / sd exact: {((tau.mean(0) - exact.mean(0)) / exact.std(0)).tolist()}"
    )
    print(f"sd tau-leap / sd exact: {(tau.std(0) / exact.std(0)).tolist()}")
    print(
        f"C2ST(tau-leap reference, exact reference) = {c2st(tau, exact):.3f} ({args.samples} vs {args.samples})"
    )


if __name__ == "__main__":
    main()
