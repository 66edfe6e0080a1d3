"""An independent check of a stored SIR reference's spread: importance sampling of the exact private posterior
at the task's stored release, with a trained SPPE posterior as proposal (``dpsbi.baselines.corrected``, plain: no
adapted second stage; the binomial kernel averaged over 4 exact-simulator runs a draw, unbiased), its weighted
mean and sd beside the stored reference's (docs/RESULTS.md, "SIR's sequential recipe"):
``python scripts/archive/sir_reference_check.py POSTERIOR DRAWS SEED >> OUT`` (one JSON line)."""

import json
import sys
import time

import torch

import dpsbi
from dpsbi.baselines import corrected
from dpsbi.experiment.reference import reference_posterior

path, draws, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
posterior = dpsbi.load_posterior(path)
task = posterior.task
cpu = time.process_time()
result = corrected(posterior, draws, adapt=0.0, seed=seed, progress=False)
weights, theta = result.weights.double(), result.samples.double()
mean = weights @ theta
sd = (weights @ (theta - mean) ** 2).sqrt()
spec = {"name": "sir", "epsilon": task.spec["kwargs"]["epsilon"]}
reference = reference_posterior(task, spec, "stored", 10_000).samples.double()
row = {
    "posterior": path,
    "draws": draws,
    "seed": seed,
    "ess": round(result.ess, 1),
    "weighted_mean": mean.tolist(),
    "weighted_sd": sd.tolist(),
    "flow_sd": posterior.sample((20_000,), seed=seed).double().std(0).tolist(),
    "reference_mean": reference.mean(0).tolist(),
    "reference_sd": reference.std(0).tolist(),
    "sd_over_reference": (sd / reference.std(0)).tolist(),
    "cpu_s": round(time.process_time() - cpu, 1),
}
print(json.dumps(row), flush=True)
