"""Eager against compiled training steps on one CPU core, at the sizes dpsbi's default fits take, in CPU seconds:
``OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 python scripts/archive/cpu_compile_steps.py OUT.jsonl``. Ran on
``d502b9c``'s training loop (the working copy's compiled step then also held inductor's compiling to one thread, as
the command's variable does, and quieted its deprecation notices); since then a fit refuses ``compile=True`` on the
CPU (its gradients are wrong: RESULTS, "Compiled on the CPU: faster, and wrong"), so this runs only at that commit.

Each case builds its estimator with one tiny round (its defaults otherwise: the amortized ones on 20 000
simulations, so batches of 1000), then runs the step as a fit does (``_Round.step``: draws, loss, backward,
clipping, Adam) eagerly and compiled (``torch.compile``, inductor's default mode) on copies of the same flow: the
first compiled step (compiling; its CPU seconds leave out the C++ compiler, a child process, so its wall seconds are
given too), then 30 steps of each, interleaved, their mean CPU milliseconds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import time

import torch

import dpsbi
from dpsbi.inference.training import _Round

REPEATS = 30


def cases():
    """``(name, estimator, round indices)``: the sequential defaults, then the amortized ones on naive Bayes."""
    reg, nb = dpsbi.tasks.load("regression"), dpsbi.tasks.load("naive_bayes")
    tiny = dict(training=dict(max_steps=3), progress=False)
    amortized = dict(amortized=True, epsilon_range=(1.0, 10.0), rounds=1, sims_per_round=20_000, **tiny)
    yield "sppe regression sequential", dpsbi.SPPE(reg, rounds=2, sims_per_round=300, **tiny), (0, 1)
    yield "sple naive_bayes sequential", dpsbi.SPLE(nb, rounds=1, sims_per_round=300, **tiny), (0,)
    yield "sppe naive_bayes amortized", dpsbi.SPPE(nb, **amortized), (0,)
    yield "sple naive_bayes amortized", dpsbi.SPLE(nb, widening=dict(classifier_steps=50), **amortized), (0,)


def main(out: str) -> None:
    torch.set_num_threads(1)
    for name, estimator, rounds in cases():
        estimator.run()
        data = estimator._dataset(False)
        for index in rounds:
            loss, rows = estimator.loss(index), torch.arange(estimator.training.batch_size)
            states, first, spent = {}, {}, {False: 0.0, True: 0.0}
            for compiled in (False, True):
                settings = dataclasses.replace(estimator.training, compile=compiled)
                states[compiled] = _Round(copy.deepcopy(estimator.flow), loss, settings, 0, 10_000)
                cpu, wall = time.process_time(), time.perf_counter()
                states[compiled].step(data, rows)
                first[compiled] = (time.process_time() - cpu, time.perf_counter() - wall)
            for repeat in range(REPEATS):
                for compiled in (False, True) if repeat % 2 else (True, False):
                    cpu = time.process_time()
                    states[compiled].step(data, rows)
                    spent[compiled] += time.process_time() - cpu
            row = {
                "case": name,
                "round": index + 1,
                "flow_evaluations": estimator.step_work(index),
                "batch": len(rows),
                "eager_cpu_ms": round(spent[False] / REPEATS * 1e3, 1),
                "compiled_cpu_ms": round(spent[True] / REPEATS * 1e3, 1),
                "first_compiled_step_cpu_s": round(first[True][0], 1),
                "first_compiled_step_wall_s": round(first[True][1], 1),
                "torch": torch.__version__,
            }
            print(json.dumps(row), flush=True)
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
