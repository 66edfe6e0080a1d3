"""SBC ranks, kept per pair, of the true SIR parameters among an amortized SIR posterior's draws and its corrected
draws (two stages, 1000 proposals, as ``scripts/amortized_check.py --importance-calibration 1000``) at epsilon 0.1,
over 100 prior-predictive pairs drawn as amortized_check's (its seed 200 unless SEED is given); this process
takes the pairs of parity PART, the first N of them. One JSON line a pair (ranks out of 500 draws, the corrected
ESS), appended as it goes.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/corrected_ranks.py POSTERIOR.pt PART N OUT.jsonl [SEED]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

import dpsbi

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check
import amortized_check as a  # noqa: E402

path, part, n, out_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 200
torch.set_num_threads(1)
arguments, _, _ = a.TASKS["sir"]
task = a.load(arguments, 0.1)
theta, y = a.prior_predictive(task, 100, seed)
posterior = dpsbi.load_posterior(path)
args = argparse.Namespace(simulations_per_draw=a.SIMULATIONS_PER_DRAW, adapt=a.ADAPT, draws=500)
with open(out_path, "a") as out:
    for i in range(part, min(100, 2 * n), 2):
        result, draws = a.correct(posterior, y[i], 0.1, 1000, args, i)
        flow = posterior.sample((500,), y=y[i], epsilon=0.1, seed=i)
        row = {
            "pair": i,
            "seed": seed,
            "rank": (draws < theta[i]).sum(0).tolist(),
            "flow_rank": (flow < theta[i]).sum(0).tolist(),
            "ess": float(result.ess),
        }
        out.write(json.dumps(row) + "\n")
        out.flush()
