"""Does ``torch.compile`` speed up training steps? ``python scripts/bench_compile.py``

One SPPE step (M = 1 plain MC, 10 atoms) and one SPLE step (M = 8 RQMC) on regression at epsilon 1, batch 100,
one torch thread: eager, then with the flow's ``log_prob`` compiled. Prints the first step (compilation
included) and the mean of the next ``--steps`` steps.
"""

from __future__ import annotations

import argparse
import time

import torch

import dpsbi
from dpsbi.inference import ConditionalFlow, FlowSettings
from dpsbi.inference.losses import sple_loss, sppe_loss
from dpsbi.inference.parameters import ParameterSpace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = dpsbi.tasks.load("regression", epsilon=1.0)
    theta = task.prior.sample((100,))
    s = task.simulate(theta)
    z, y = task.transform.inv(theta), task.release(s)
    log_prior = ParameterSpace(task).log_prior_z(z)
    for method in ("SPPE", "SPLE"):
        for compiled in (False, True):
            torch.manual_seed(0)
            flow = ConditionalFlow(FlowSettings(), *((z, y) if method == "SPPE" else (y, z)))
            if compiled:
                flow.net.log_prob = torch.compile(flow.net.log_prob)
            optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
            generator = torch.Generator().manual_seed(0)

            def step() -> None:
                optimizer.zero_grad()
                if method == "SPPE":
                    loss = sppe_loss(
                        flow, z, s, task.mechanism, 1, False, generator, atoms=10, log_prior=log_prior
                    )
                else:
                    loss = sple_loss(flow, z, s, task.mechanism, 8, True, generator)
                loss.backward()
                optimizer.step()

            tic = time.perf_counter()
            step()
            first = time.perf_counter() - tic
            tic = time.perf_counter()
            for _ in range(args.steps):
                step()
            mean = (time.perf_counter() - tic) / args.steps
            print(
                f"{method} {'compiled' if compiled else 'eager'}: first step {first:.1f} s, then {1e3 * mean:.1f} ms/step",
                flush=True,
            )


if __name__ == "__main__":
    main()
