"""Peak resident memory of one amortized census-table round of N simulations (rho 0.15-0.7, one training step),
printed after simulating, after each release check and at the end (docs/RESULTS.md, "SIR's amortized default": a
round of a million census tables): ``python scripts/archive/census_round_memory.py N``."""

import resource
import sys
import time

import torch

import dpsbi


def peak_gb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)


torch.set_num_threads(1)
fit = dpsbi.SPPE(
    dpsbi.tasks.load("census_table"),
    amortized=True,
    epsilon_range=(2.8818, 10.0343),
    rounds=1,
    sims_per_round=int(sys.argv[1]),
    training=dict(max_steps=1),
    progress=False,
)
for name in ("_draw_and_simulate", "training_releases"):
    stage = getattr(fit, name)

    def traced(*args, _stage=stage, _name=name, **kwargs):
        out = _stage(*args, **kwargs)
        print(_name, "peak GB", peak_gb(), flush=True)
        return out

    setattr(fit, name, traced)
began = time.process_time()
fit.run()
print("done: peak GB", peak_gb(), "CPU s", round(time.process_time() - began, 1))
