"""What compiling a default fit's training step costs and saves on one CPU core, per kind of step:
``python scripts/cpu_compile_kinds.py OUT.jsonl`` (one torch thread; each case in two fresh processes).

A kind is a step of one shape: its batch and flow evaluations (:meth:`SequentialEstimator.step_work`). Each case
builds its estimator at its defaults but with tiny rounds, then runs the step as a fit does (``_Round.step``:
draws, loss, backward, clipping, Adam) eagerly and compiled (``torch.compile``, inductor's default mode) on copies
of the same flow. It runs twice, in a new process each time, against one new inductor cache directory: first cold
(an empty cache, as a user's first fit), then warm (the cache the first run left, as every later fit of that kind).
A row gives the first compiled step's wall seconds (compiling; the C++ compiler is a child process, so wall, not
CPU) beside an eager step's, and the mean CPU milliseconds of ``REPEATS`` eager and compiled steps, interleaved.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

import dpsbi
from dpsbi.inference.training import _Round, first_batch

REPEATS = 30
TINY = dict(training=dict(max_steps=3), progress=False)


SEQUENTIAL = dict(rounds=2, sims_per_round=300, **TINY)
#: ``{name: (estimator, task, task options, estimator options, round index)}``: the kinds of step the CPU's default
#: fits run.
CASES = {
    "sppe regression round 1": ("SPPE", "regression", {}, dict(SEQUENTIAL, rounds=1), 0),
    "sppe regression atomic": ("SPPE", "regression", {}, SEQUENTIAL, 1),
    "sppe naive_bayes truncated": ("SPPE", "naive_bayes", {}, SEQUENTIAL, 1),
    "sppe sir truncated": ("SPPE", "sir", dict(epsilon=1.0), SEQUENTIAL, 1),
    "sple regression": ("SPLE", "regression", {}, SEQUENTIAL, 1),
    "sppe regression amortized": (
        "SPPE",
        "regression",
        {},
        dict(amortized=True, epsilon_range=(0.1, 10.0), rounds=1, sims_per_round=20_000, **TINY),
        0,
    ),
}


def built(name: str) -> tuple:
    """The case's estimator fitted at its tiny rounds, the index of the round whose step is timed, that round's
    training data, its loss and a batch's rows, of the shape a compiled round compiles: ``(estimator, index, data,
    loss, rows)``."""
    method, task, options, settings, index = CASES[name]
    estimator = getattr(dpsbi, method)(dpsbi.tasks.load(task, **options), **settings)
    estimator.run()
    data = estimator._dataset(False)
    rows = torch.arange(first_batch(data[0].shape[0], estimator.training.batch_size))
    return estimator, index, data, estimator.loss(index), rows


def measure(name: str, cache: str) -> dict:
    """One case in this process: the first compiled step and the interleaved means."""
    torch.set_num_threads(1)
    estimator, index, data, loss, rows = built(name)
    states, first, spent = {}, {}, {False: 0.0, True: 0.0}
    for compiled in (False, True):
        settings = dataclasses.replace(estimator.training, compile=compiled)
        states[compiled] = _Round(copy.deepcopy(estimator.flow), loss, settings, 0, 10_000)
        wall = time.perf_counter()
        states[compiled].step(data, rows)
        first[compiled] = time.perf_counter() - wall
    for repeat in range(REPEATS):
        for compiled in (False, True) if repeat % 2 else (True, False):
            cpu = time.process_time()
            states[compiled].step(data, rows)
            spent[compiled] += time.process_time() - cpu
    return {
        "case": name,
        "cache": cache,
        "flow_evaluations": estimator.step_work(index),
        "batch": len(rows),
        "first_eager_step_wall_s": round(first[False], 2),
        "first_compiled_step_wall_s": round(first[True], 1),
        "eager_cpu_ms": round(spent[False] / REPEATS * 1e3, 1),
        "compiled_cpu_ms": round(spent[True] / REPEATS * 1e3, 1),
        "torch": torch.__version__,
    }


def main(out: str) -> None:
    for name in CASES:
        directory = tempfile.mkdtemp(prefix="inductor-")
        for cache in ("cold", "warm"):
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=directory, OMP_NUM_THREADS="1")
            env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
            result = subprocess.run(
                [sys.executable, __file__, "--case", name, cache], env=env, capture_output=True, text=True
            )
            if result.returncode:
                raise SystemExit(f"{name} ({cache}) failed:\n{result.stderr[-2000:]}")
            row = result.stdout.strip().splitlines()[-1]
            print(row, flush=True)
            with open(out, "a") as f:
                f.write(row + "\n")
        shutil.rmtree(directory)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python scripts/cpu_compile_kinds.py OUT.jsonl")
    if sys.argv[1] == "--case":
        print(json.dumps(measure(sys.argv[2], sys.argv[3])))
    else:
        main(sys.argv[1])
