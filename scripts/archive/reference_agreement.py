"""Do regression's references at epsilon-10 prior-predictive releases agree with themselves? The validated
sampler of scripts/frontier.py (importance sampling with the mechanism as kernel) run twice, under seeds ``i``
and ``i + 1000``, at releases ``i`` of scripts/amortized_check.py's epsilon-10 set (its ``prior_predictive``,
seed 102): C2ST between the two, and the difference of their means in the first's sds. docs/RESULTS.md,
"Epsilon 10's errors are in the posterior's place".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/reference_agreement.py 11,8,2
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check and frontier

import torch  # noqa: E402
from amortized_check import TASKS, load, prior_predictive  # noqa: E402
from frontier import REFERENCE  # noqa: E402

from dpsbi.experiment.reference import reference_posterior  # noqa: E402
from dpsbi.metrics import c2st  # noqa: E402

torch.set_num_threads(1)
arguments, _, _ = TASKS["regression"]
at = load(arguments, 10.0)
_, y = prior_predictive(at, 20, seed=102)
for i in [int(a) for a in sys.argv[1].split(",")]:
    config = {**arguments, "epsilon": 10.0, "y_obs": y[i].tolist()}
    task = load({**arguments, "y_obs": y[i]}, 10.0)
    refs = [
        reference_posterior(task, config, seed=s, progress=False, **{**REFERENCE, "num_samples": 2000})
        for s in (i, i + 1000)
    ]
    a, b = refs[0].samples, refs[1].samples
    row = {
        "release": i,
        "c2st": round(c2st(a, b), 3),
        "mean_difference_in_sds": [round(v, 3) for v in ((a.mean(0) - b.mean(0)) / a.std(0)).tolist()],
        "notes": [r.note.split("; ")[-2] if "ESS" in r.note else r.note for r in refs],
    }
    print(json.dumps(row), flush=True)
