"""What one more release costs with SIR's amortized flow (docs/RESULTS.md, "Cost per release"): CPU time of 2000
draws at the stored release of each of epsilon 0.1 / 1 / 10 (median of 20 calls after a warm-up) and of 2000 draws
at each of 20 releases in one ``sample_batched`` call, one torch thread, per saved posterior of the tau-leaping task
at epsilon 1 (``scripts/privacy_utility.py run --posteriors DIR``'s ``DIR/sir.pt``):
``python scripts/archive/sir_per_release_cost.py OUT DIR/sir.pt [...]``."""

import json
import statistics
import sys
import time

import torch

import dpsbi
from dpsbi.tasks import load

torch.set_num_threads(1)
out, paths = sys.argv[1], sys.argv[2:]
for k, path in enumerate(paths):
    posterior = dpsbi.load_posterior(path, task=load("sir", epsilon=1.0))
    row = {"fit": k}
    for epsilon in (0.1, 1.0, 10.0):
        y = load("sir", epsilon=epsilon).y_obs
        posterior.sample((2000,), y=y, epsilon=epsilon, seed=0)
        one = []
        for i in range(20):
            began = time.process_time()
            posterior.sample((2000,), y=y, epsilon=epsilon, seed=i)
            one.append(time.process_time() - began)
        began = time.process_time()
        posterior.sample_batched((2000,), y=y.expand(20, -1).clone(), epsilon=epsilon, seed=0)
        row[str(epsilon)] = {
            "one_release_cpu_ms": round(1000 * statistics.median(one), 1),
            "twenty_releases_cpu_s": round(time.process_time() - began, 2),
        }
    print(json.dumps(row), flush=True)
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
