"""Long validation of DA-MCMC (Ju et al. 2022) against exact references, with the numbers the report quotes.

Regression (epsilon = 1, stored release): DA-MCMC against exact ABC importance sampling from the prior
(C2ST, means and sds in Monte Carlo errors). Naive Bayes (epsilon = 10, stored release): DA-MCMC against the
exact posterior moments obtained by summing out the latent counts (dpsbi/tasks/naive_bayes_posterior.py), which ABC-IS
cannot reach at this epsilon (its ESS is printed). Run from the repository root:
``python scripts/archive/validate_da_mcmc.py [--chains 256] [--iterations 6000]``.
"""

from __future__ import annotations

import argparse
import time

import torch

import dpsbi
from dpsbi.baselines.da_mcmc import da_mcmc
from dpsbi.baselines.exact_abc import abc_is, seeded
from dpsbi.metrics import c2st


def weighted_moments(result) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and sd of weighted draws."""
    mean = (result.weights[:, None] * result.samples).sum(0)
    return mean, (result.weights[:, None] * (result.samples - mean) ** 2).sum(0).sqrt()


def report(name: str, result, mean: torch.Tensor, sd: torch.Tensor, seconds: float) -> None:
    """Print DA-MCMC moments against reference moments, in units of the chain's Monte Carlo error."""
    ess = result.info["ess"].clamp(max=result.samples.shape[0])
    got_mean, got_sd = result.samples.mean(0), result.samples.std(0)
    print(f"{name}: {seconds:.0f} s, record acceptance {result.info['acceptance_rate']:.3f}")
    print("  IAT ", [round(v, 1) for v in result.info["iat"].tolist()])
    print("  R-hat", [round(v, 3) for v in result.info["rhat"].tolist()])
    print("  mean DA ", [round(v, 4) for v in got_mean.tolist()])
    print("  mean ref", [round(v, 4) for v in mean.tolist()])
    print("  z(mean) ", [round(v, 2) for v in ((got_mean - mean) / (sd / ess.sqrt())).tolist()])
    print("  sd DA   ", [round(v, 4) for v in got_sd.tolist()])
    print("  sd ref  ", [round(v, 4) for v in sd.tolist()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chains", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=6000)
    parser.add_argument("--burn-in", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the per-record updates are many tiny ops: threads only add overhead
    generator = torch.Generator().manual_seed(0)

    task = dpsbi.tasks.load("regression", epsilon=1.0)
    reference = abc_is(task, 1_000_000, seed=1, progress=False)
    start = time.time()
    result = da_mcmc(task, args.iterations, num_chains=args.chains, burn_in=args.burn_in, seed=0)
    seconds = time.time() - start
    report("regression, epsilon=1", result, *weighted_moments(reference), seconds)
    ref = reference.resample(5000, generator)
    draws = result.samples[torch.randperm(result.samples.shape[0], generator=generator)[:5000]]
    print(
        f"  ABC-IS ESS {reference.ess:.0f} of 1e6; C2ST(DA, ABC-IS) = {c2st(draws, ref):.3f} (5000 vs 5000)"
    )
    with seeded(2):
        print(f"  C2ST(prior, ABC-IS) = {c2st(task.prior.sample((5000,)), ref):.3f}")

    task = dpsbi.tasks.load("naive_bayes", epsilon=10.0)
    exact = task.exact_posterior(task.y_obs)
    mean, sd = exact.mean.double(), exact.stddev.double()
    start = time.time()
    result = da_mcmc(
        task, args.iterations // 2, num_chains=args.chains // 4, burn_in=args.burn_in // 4, seed=0
    )
    report("naive Bayes, epsilon=10", result, mean.float(), sd.float(), time.time() - start)
    wrong = da_mcmc(
        dpsbi.tasks.load("naive_bayes", epsilon=1.0, y_obs=task.y_obs), 1000, num_chains=64, seed=0
    )
    print(
        "  mutant (mechanism at epsilon=1): z(mean)",
        [
            round(v, 1)
            for v in (
                (wrong.samples.mean(0) - mean.float()) / (sd.float() / wrong.info["ess"].sqrt())
            ).tolist()
        ],
    )
    start = time.time()
    reference = abc_is(task, 2_000_000, seed=1, progress=False)
    print(
        f"  ABC-IS from the prior: ESS {reference.ess:.1f} of 2e6 simulations ({time.time() - start:.0f} s)"
    )


if __name__ == "__main__":
    main()
