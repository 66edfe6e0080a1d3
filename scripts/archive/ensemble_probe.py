"""Does an equal mixture of amortized regression fits (an ensemble) move epsilon 10's posteriors to their place?
Each member saved by ``scripts/amortized_check.py --posteriors DIR``; scored at that script's 20 epsilon-10
prior-predictive releases (its ``prior_predictive``, seed 102) against its cached references: each member
alone, then the mixture of all (``draws // K`` draws of each member, each member under its own seed). One JSON line per fit or mixture: mean
and worst C2ST, mean sd ratio, mean |mean shift| in reference sds. docs/RESULTS.md, "Ensembles".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/ensemble_probe.py A/regression.pt B/regression.pt C/regression.pt
"""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check

import torch  # noqa: E402
from amortized_check import TASKS, exact_draws, load, prior_predictive  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.metrics import c2st, mean_shift, spread_ratios  # noqa: E402

DRAWS, RELEASES, EPSILON = 2000, 20, 10.0


def score(name: str, draws: torch.Tensor, exact: list[torch.Tensor]) -> dict:
    """``draws (DRAWS, RELEASES, dim)`` against the references."""
    scores = [c2st(draws[:, i], exact[i]) for i in range(RELEASES)]
    sd = [statistics.mean(spread_ratios(draws[:, i], exact[i])["sd_ratio"]) for i in range(RELEASES)]
    shift = torch.tensor([mean_shift(draws[:, i], exact[i]) for i in range(RELEASES)]).abs()
    return {
        "fit": name,
        "c2st_mean": round(statistics.mean(scores), 4),
        "c2st_worst": round(max(scores), 4),
        "sd_ratio_mean": round(statistics.mean(sd), 4),
        "mean_shift_abs_mean": round(float(shift.mean()), 4),
        "mean_shift_abs_worst": round(float(shift.max()), 4),
        "c2st": [round(s, 3) for s in scores],
    }


torch.set_num_threads(1)
arguments, (low, high), _ = TASKS["regression"]
task = load(arguments, (low * high) ** 0.5)
at = load(arguments, EPSILON)
_, y = prior_predictive(at, RELEASES, seed=102)
exact = [exact_draws(at, arguments, y[i], DRAWS, i, {}) for i in range(RELEASES)]
members = []
for k, path in enumerate(sys.argv[1:]):
    posterior = dpsbi.load_posterior(path, task=task)
    # a seed per member: one seed would map the same base noise through every flow, and the mixture would
    # hold near-copies of each draw, which C2ST tells apart from independent draws
    members.append(posterior.sample_batched((DRAWS,), y=y, epsilon=EPSILON, seed=k))
    print(json.dumps(score(path, members[-1], exact)), flush=True)
k = len(members)
mixture = torch.cat([m[: DRAWS // k] for m in members], 0)
print(json.dumps(score(f"mixture of {k}", mixture, exact)), flush=True)
