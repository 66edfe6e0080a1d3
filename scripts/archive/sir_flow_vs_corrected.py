"""Where SIR's amortized flow is too wide: at releases of ONE confidential epidemic (the true parameter's, seed 0,
as scripts/privacy_utility.py's curve) at one epsilon, the flow's draws against the same flow corrected by
importance sampling with the fitted task's own simulator (``dpsbi.baselines.corrected``, resampled without repeats),
per release: C2ST and each parameter's sd ratio (flow / corrected). With a posterior trained on the tau-leaping
simulator the correction is the tau-leaping model's posterior (12 CPU s a release at 20 000 proposals), which
matches the exact references at SIR's stored releases (docs/RESULTS.md, "SIR's flow alone: a context-shifted
flow, a million tau-leaping simulations, and where it misses").

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/sir_flow_vs_corrected.py POSTERIOR EPSILON RELEASES OUT
"""

import json
import sys

import torch

import dpsbi
from dpsbi.baselines import corrected, smoothed_resample
from dpsbi.baselines.fitted_proposal import covariance_supported


def main() -> None:
    path, epsilon, releases, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    task = dpsbi.tasks.load("sir", epsilon=1.0, simulator="tau_leap")
    posterior = dpsbi.load_posterior(path, task=task)
    s = task.simulate(task.true_theta, torch.Generator().manual_seed(0)).expand(releases, -1)
    y = task.mechanism.with_epsilon(epsilon).sample(s, generator=torch.Generator().manual_seed(0))
    with open(out, "a") as f:
        for k in range(releases):
            flow = posterior.sample((2000,), y=y[k : k + 1], epsilon=epsilon, seed=k).cpu()
            result = corrected(posterior, 20000, y=y[k : k + 1], epsilon=epsilon, seed=k, progress=False)
            if not covariance_supported(result.ess, task.dim_unconstrained):
                continue
            exact = smoothed_resample(
                task, result.samples, result.weights, 2000, torch.Generator().manual_seed(k)
            )[0]
            row = {
                "epsilon": epsilon,
                "release": k,
                "y": [round(v, 4) for v in y[k].tolist()],
                "c2st": round(dpsbi.metrics.c2st(flow, exact, seed=0), 4),
                "sd_ratio": [round(v, 3) for v in (flow.std(0) / exact.std(0)).tolist()],
                "mean_shift": [round(v, 3) for v in ((flow.mean(0) - exact.mean(0)) / exact.std(0)).tolist()],
                "corrected_sd": [round(v, 4) for v in exact.std(0).tolist()],
                "ess": round(result.ess),
            }
            f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
