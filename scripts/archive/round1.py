"""One default SPPE round (1000 steps) on regression at epsilon 1 on one CPU thread, as a whole process: the
CPU before/after figure of docs/RESULTS.md, "The sync-free training step" (timed from outside, run with the
PYTHONPATH of each checkout).
"""

import time

import torch

import dpsbi

torch.set_num_threads(1)
task = dpsbi.tasks.load("regression", epsilon=1.0)
est = dpsbi.SPPE(task, rounds=1, progress=False, training=dict(accelerator="cpu"))
t = time.process_time()
est.run()
cpu = time.process_time() - t
print(
    f"{dpsbi.__file__} steps {est.history[0]['steps']} cpu {cpu:.1f} s train {est.history[0]['seconds']:.1f} s"
)
