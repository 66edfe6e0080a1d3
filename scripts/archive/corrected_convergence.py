"""Is the corrected SIR posterior converged at single epsilon-0.1 pairs? Each pair of amortized_check's 100
prior-predictive pairs (seed 200) named is corrected three ways: 1000 proposals with 4 simulations each (the
calibration's setting), 1000 with 32, and 4000 with 4. One JSON line each: the weighted mean and sd, the weighted
CDF at the true parameter, Kish's ESS and the weights' Pareto k (ArviZ's ``psislw``: above 0.7 the estimate is not
to be trusted). docs/RESULTS.md, "SIR at epsilon 0.1: the pairs lean, not the correction".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/corrected_convergence.py POSTERIOR.pt 2,10,19 OUT.jsonl
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from arviz import psislw

import dpsbi
from dpsbi.baselines import corrected

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check
import amortized_check as a  # noqa: E402

torch.set_num_threads(1)
arguments, _, _ = a.TASKS["sir"]
task = a.load(arguments, 0.1)
theta, y = a.prior_predictive(task, 100, 200)
posterior = dpsbi.load_posterior(sys.argv[1])
with open(sys.argv[3], "a") as out:
    for i in [int(p) for p in sys.argv[2].split(",")]:
        for proposals, repeats in ((1000, 4), (1000, 32), (4000, 4)):
            began = time.process_time()
            result = corrected(
                posterior,
                proposals,
                y=y[i],
                epsilon=0.1,
                simulations_per_draw=repeats,
                seed=i,
                progress=False,
            )
            w, draws = result.weights.double(), result.samples.double()
            mean = (w[:, None] * draws).sum(0)
            sd = (w[:, None] * (draws - mean) ** 2).sum(0).sqrt()
            log_w = np.log(w[w > 0].numpy())
            row = {
                "pair": i,
                "proposals": proposals,
                "simulations_per_draw": repeats,
                "truth": theta[i].tolist(),
                "mean": mean.tolist(),
                "sd": sd.tolist(),
                "cdf_truth": (w[:, None] * (draws < theta[i].double())).sum(0).tolist(),
                "ess": result.ess,
                "pareto_k": float(psislw(log_w)[1]),
                "cpu_s": time.process_time() - began,
            }
            out.write(json.dumps(row) + "\n")
            out.flush()
