"""SIR's default amortized fit at one epsilon (no ``epsilon_range``: the recipe's one round of a million
tau-leaping simulations, lr 3e-3, 13 000 steps, at the task's epsilon alone; docs/RESULTS.md, "SIR's amortized
default"), scored at the stored release at that epsilon against the stored exact reference (C2ST, sd ratio, mean
shift in reference sds, 2000 draws a side) and by sbi's SBC and TARP over 300 prior-predictive pairs of the
**exact** model: ``python scripts/archive/sir_amortized_one_epsilon.py SEED EPSILON OUT``."""

import json
import sys
import time
from pathlib import Path

import torch

import dpsbi
from dpsbi.experiment.reference import reference_posterior

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from amortized_check import calibration  # noqa: E402

seed, epsilon, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
task = dpsbi.tasks.load("sir", epsilon=epsilon)
cpu = time.process_time()
fit = dpsbi.SPPE(task, amortized=True, progress=False, seed=seed)
posterior = fit.run()
cpu = time.process_time() - cpu
reference = reference_posterior(task, {"name": "sir", "epsilon": epsilon}, "stored", 2000).samples
draws = posterior.sample((2000,), y=task.y_obs, seed=0).cpu()
row = {
    "seed": seed,
    "epsilon": epsilon,
    "rounds": fit.rounds,
    "sims_per_round": fit.sims_per_round,
    "task_options": fit.task_options,
    "c2st": round(float(dpsbi.metrics.c2st(draws, reference, seed=0)), 4),
    "sd_ratio": [round(v, 3) for v in (draws.std(0) / reference.std(0)).tolist()],
    "shift_in_ref_sds": [
        round(v, 3) for v in ((draws.mean(0) - reference.mean(0)) / reference.std(0)).tolist()
    ],
    "fit_cpu_s": round(cpu, 1),
    **calibration(task, posterior, 300, seed=200),
}
print(json.dumps(row), flush=True)
with open(out, "a") as f:
    f.write(json.dumps(row) + "\n")
