"""Three default SPPE rounds (the first plain, two atomic) on regression at epsilon 1, one CPU thread, with the
flow of ``sys.argv[1]`` (``dpsbi`` or ``nflows``), as a whole process: the CPU pairing of the two flows in
docs/RESULTS.md, "The sync-free training step" (timed from outside, alternating, on one pinned core).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/fit_backend.py dpsbi
"""

import sys
import time

import torch

import dpsbi

torch.set_num_threads(1)
task = dpsbi.tasks.load("regression", epsilon=1.0)
estimator = dpsbi.SPPE(
    task, rounds=3, progress=False, flow={"backend": sys.argv[1]}, training={"accelerator": "cpu"}
)
began = time.process_time()
estimator.run()
print(
    f"{sys.argv[1]}: {sum(h['steps'] for h in estimator.history)} steps, {time.process_time() - began:.1f} CPU s"
)
