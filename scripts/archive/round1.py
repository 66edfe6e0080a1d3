"""One default SPPE round on regression at epsilon 1 on one CPU thread, as a whole process: the CPU before/after
figures of docs/RESULTS.md, "The sync-free training step" and "The default step against the code issue 30 was filed
on" (timed from outside, run with the PYTHONPATH, and for code of another pyproject.toml the environment, of each
checkout). ``--full`` trains the round to its ``max_steps`` (1000, rounded up to whole epochs: 1008) with no early
stop, so that two versions whose rounding differs time the same steps ("Adam's fused kernel on the CPU").
"""

import sys
import time

import torch

import dpsbi

torch.set_num_threads(1)
task = dpsbi.tasks.load("regression", epsilon=1.0)
training = dict(accelerator="cpu", patience=10**9) if "--full" in sys.argv[1:] else dict(accelerator="cpu")
est = dpsbi.SPPE(task, rounds=1, progress=False, training=training)
t = time.process_time()
est.run()
cpu = time.process_time() - t
print(
    f"{dpsbi.__file__} steps {est.history[0]['steps']} cpu {cpu:.1f} s train {est.history[0]['seconds']:.1f} s"
)
