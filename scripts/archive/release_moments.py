"""The amortized regression posterior against its references at single epsilon-10 releases: per parameter the
error of the mean in reference sds, the sd ratio and both skewnesses, and the correlation matrices' off-diagonal
terms. Takes a posterior saved by ``scripts/amortized_check.py --posteriors DIR`` (``DIR/regression.pt``) and
release numbers of that script's epsilon-10 set (its ``prior_predictive``, seed 102); the references come from its
cache. docs/RESULTS.md, "Epsilon 10's errors are in the posterior's place".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/amortized_check.py --tasks regression --epsilons 10 --posteriors DIR --out /tmp/r.jsonl
    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/release_moments.py DIR/regression.pt 11,8,16,7,2,5
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check

import torch  # noqa: E402
from amortized_check import TASKS, exact_draws, load, prior_predictive  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.metrics import c2st, mean_shift  # noqa: E402


def skewness(x: torch.Tensor) -> list[float]:
    z = (x - x.mean(0)) / x.std(0)
    return [round(v, 2) for v in (z**3).mean(0).tolist()]


def correlations(x: torch.Tensor) -> list[float]:
    c = torch.corrcoef(x.T)
    return [round(float(c[i, j]), 2) for i, j in ((0, 1), (0, 2), (1, 2))]


torch.set_num_threads(1)
arguments, (low, high), _ = TASKS["regression"]
posterior = dpsbi.load_posterior(sys.argv[1], task=load(arguments, (low * high) ** 0.5))
at = load(arguments, 10.0)
theta, y = prior_predictive(at, 20, seed=102)
for i in [int(a) for a in sys.argv[2].split(",")]:
    draws = posterior.sample((2000,), y=y[i], epsilon=10.0, seed=i)
    exact = exact_draws(at, arguments, y[i], 2000, i, {})
    row = {
        "release": i,
        "theta": [round(v, 2) for v in theta[i].tolist()],
        "c2st": round(c2st(draws, exact), 3),
        "mean_shift": [round(v, 2) for v in mean_shift(draws, exact)],
        "sd_ratio": [round(v, 2) for v in (draws.std(0) / exact.std(0)).tolist()],
        "skewness": {"flow": skewness(draws), "reference": skewness(exact)},
        "correlations": {"flow": correlations(draws), "reference": correlations(exact)},
    }
    print(json.dumps(row), flush=True)
