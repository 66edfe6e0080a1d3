"""SIR's amortized flow trained on ``asin(sqrt(release))`` (the binomial's variance-stabilizing map, applied as a
``PostProcessed`` step) instead of the release itself: tau-leaping, lr 3e-3, epsilon 0.05-20, scored at the stored
releases (mapped the same way) against the stored exact references (docs/RESULTS.md, "SIR's flow alone with the
step fixed"): ``python scripts/archive/sir_stabilized_release.py SEED OUT [SIMS ROUNDS STEPS]`` (default 100 000 x
10 rounds of 1000 steps; the RESULTS row: ``0 OUT 1000000 1 13000``)."""

import dataclasses
import json
import sys
import time

import torch

import dpsbi
from dpsbi.experiment.reference import reference_posterior
from dpsbi.mechanisms import PostProcessed
from dpsbi.mechanisms.stabilizing import arcsine as stabilize

seed, out = int(sys.argv[1]), sys.argv[2]
sims, rounds, steps = (int(v) for v in (sys.argv[3:6] if len(sys.argv) > 3 else (100_000, 10, 1000)))
torch.set_num_threads(1)
base = dpsbi.tasks.load("sir", epsilon=1.0, simulator="tau_leap")
task = dataclasses.replace(
    base,
    mechanism=PostProcessed(base.mechanism, stabilize),
    y_obs=stabilize(base.y_obs),
    statistic_bounds=None,
)
cpu = time.process_time()
est = dpsbi.SPPE(
    task,
    amortized=True,
    epsilon_range=(0.05, 20.0),
    progress=False,
    seed=seed,
    rounds=rounds,
    sims_per_round=sims,
    training={"lr": 0.003, **({"max_steps": steps} if steps != 1000 else {})},
)
posterior = est.run()
cpu = time.process_time() - cpu
rows = []
for eps in (0.1, 1.0, 10.0):
    t = dpsbi.tasks.load("sir", epsilon=eps)
    ref = reference_posterior(t, {"name": "sir", "epsilon": eps}, "stored", 2000).samples
    draws = posterior.sample((2000,), y=stabilize(t.y_obs), epsilon=eps, seed=0).cpu()
    row = {
        "seed": seed,
        "epsilon": eps,
        "c2st": round(float(dpsbi.metrics.c2st(draws, ref, seed=0)), 4),
        "sd_ratio": [round(v, 3) for v in (draws.std(0) / ref.std(0)).tolist()],
        "shift_in_ref_sds": [round(v, 3) for v in ((draws.mean(0) - ref.mean(0)) / ref.std(0)).tolist()],
        "fit_cpu_s": round(cpu, 1),
    }
    print(json.dumps(row), flush=True)
    rows.append(row)
with open(out, "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
