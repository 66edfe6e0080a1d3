"""Importance sampling from a saved amortized regression fit at single epsilon-10 releases, with one or more
simulations a draw: C2ST of the corrected and of the flow's own draws against the cached references, the ESS,
the CPU seconds and each parameter's mean error in reference sds. Releases are numbers of
``scripts/amortized_check.py``'s epsilon-10 set (its ``prior_predictive``, seed 102). docs/RESULTS.md,
"Correcting the flow at a release".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/importance_repeats.py DIR/regression.pt 100000 11,2 4
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check

import torch  # noqa: E402
from amortized_check import TASKS, exact_draws, load, prior_predictive  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.baselines import corrected  # noqa: E402
from dpsbi.metrics import c2st, mean_shift  # noqa: E402

torch.set_num_threads(1)
arguments, (low, high), _ = TASKS["regression"]
posterior = dpsbi.load_posterior(sys.argv[1], task=load(arguments, (low * high) ** 0.5))
at = load(arguments, 10.0)
_, y = prior_predictive(at, 20, seed=102)
proposals, repeats = int(sys.argv[2]), int(sys.argv[4])
for i in [int(a) for a in sys.argv[3].split(",")]:
    exact = exact_draws(at, arguments, y[i], 2000, i, {})
    began = time.process_time()
    result = corrected(
        posterior, proposals, y=y[i], epsilon=10.0, simulations_per_draw=repeats, seed=i, progress=False
    )
    corrected = result.resample(2000, torch.Generator().manual_seed(i))
    seconds = time.process_time() - began
    flow = posterior.sample((2000,), y=y[i], epsilon=10.0, seed=i)
    row = {
        "release": i,
        "proposals": proposals,
        "simulations_per_draw": repeats,
        "c2st_flow": round(c2st(flow, exact), 3),
        "c2st_corrected": round(c2st(corrected, exact), 3),
        "ess": round(result.ess),
        "cpu_s": round(seconds, 2),
        "mean_shift_flow": [round(v, 2) for v in mean_shift(flow, exact)],
        "mean_shift_corrected": [round(v, 2) for v in mean_shift(corrected, exact)],
    }
    print(json.dumps(row), flush=True)
