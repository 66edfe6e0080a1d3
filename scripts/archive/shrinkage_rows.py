"""Sequential calls (each one host read), evaluations per update and CPU seconds of the torch elliptical slice
sampler on a grouped Gaussian target (groups x 500 chains, the default MCMC settings, 2000 draws a group), by the
CPU's rows-a-round rule (``MIN_ROWS``) and by the GPU's (every chain's one row: ``mcmc.rows_per_round`` off a
CPU), both run on the CPU:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/shrinkage_rows.py [--groups 2 20 200]

The thirtieth session's figures (docs/RESULTS.md, "On a GPU"): at 200 groups 647 calls (12.4 an update) by the
CPU's rule, 220 (4.2) by the GPU's, for 1.82 against 3.67 evaluations an update.
"""

import argparse
import time

import torch

from dpsbi.inference import mcmc
from dpsbi.inference.mcmc import MCMCSettings, slice_sample_groups

MEAN = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
TRIL = torch.linalg.cholesky(
    torch.tensor([[1.0, 1.8, 0.9], [1.8, 4.0, 3.0], [0.9, 3.0, 9.0]], dtype=torch.float64)
)
RULES = {
    "cpu": lambda device, chains: mcmc.MIN_ROWS,
    "gpu": lambda device, chains: max(mcmc.MIN_ROWS, chains),
}


def log_density(x: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Group ``g``'s Gaussian (its mean shifted by ``g / 10``) at ``x (n, k, 3)``: ``(n, k)``."""
    return torch.distributions.MultivariateNormal(MEAN + group[:, None, None] / 10, scale_tril=TRIL).log_prob(
        x
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 20, 200])
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = MCMCSettings()
    steps = settings.warmup + settings.thin * -(-2000 // settings.num_chains)
    for groups in args.groups:
        init = MEAN + 3 * torch.randn(
            groups, settings.num_chains, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
        )
        for name, rule in RULES.items():
            mcmc.rows_per_round = rule
            info: dict = {}
            start = time.process_time()
            slice_sample_groups(log_density, init, 2000, settings, seed=1, width=4.0, info=info)
            print(
                f"{groups:4d} groups, {name} rule: {info['calls']} calls ({info['calls'] / steps:.1f} an update), "
                f"{info['host_reads']} host reads, {info['evaluations_per_update']:.2f} evaluations an update, "
                f"{time.process_time() - start:.1f} CPU s",
                flush=True,
            )


if __name__ == "__main__":
    main()
