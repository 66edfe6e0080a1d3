"""Adam's fused kernel against its per-tensor loop (torch's CPU default, dpsbi's before the forty-first session)
in the training step of each kind a default CPU fit runs: ``python scripts/archive/fused_adam_ab.py OUT.jsonl``
(one torch thread, eager steps). Each case of ``scripts/cpu_compile_kinds.py`` is built with tiny rounds, then its
step (``_Round.step``: draws, loss, backward, clipping, Adam) runs on two copies of the same flow, one with each
optimizer, ``REPEATS`` steps each, interleaved; a row gives the mean CPU milliseconds of each and their ratio.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for cpu_compile_kinds

import torch  # noqa: E402
from cpu_compile_kinds import CASES  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.inference.training import _Round  # noqa: E402

REPEATS = 60


def measure(name: str) -> dict:
    """One case: the mean CPU ms of a step with the per-tensor and with the fused Adam, interleaved."""
    method, task, options, settings, index = CASES[name]
    estimator = getattr(dpsbi, method)(dpsbi.tasks.load(task, **options), **settings)
    estimator.run()
    data = estimator._dataset(False)
    loss, rows = estimator.loss(index), torch.arange(estimator.training.batch_size)
    training = dataclasses.replace(estimator.training, compile=False)
    states = {
        kind: _Round(copy.deepcopy(estimator.flow), loss, training, 0, 10_000) for kind in ("loop", "fused")
    }
    loop = states["loop"]
    loop.optimizer = torch.optim.Adam(
        loop.flow.parameters(), lr=training.lr, weight_decay=training.weight_decay
    )
    spent = dict.fromkeys(states, 0.0)
    for kind in states:  # Adam's state built outside the timing
        states[kind].step(data, rows)
    for repeat in range(REPEATS):
        for kind in ("loop", "fused") if repeat % 2 else ("fused", "loop"):
            cpu = time.process_time()
            states[kind].step(data, rows)
            spent[kind] += time.process_time() - cpu
    loop_ms, fused_ms = (spent[k] / REPEATS * 1e3 for k in ("loop", "fused"))
    return {
        "case": name,
        "flow_evaluations": estimator.step_work(index),
        "batch": len(rows),
        "parameter_tensors": len(list(estimator.flow.parameters())),
        "loop_cpu_ms": round(loop_ms, 1),
        "fused_cpu_ms": round(fused_ms, 1),
        "ratio": round(fused_ms / loop_ms, 3),
        "torch": torch.__version__,
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/archive/fused_adam_ab.py OUT.jsonl")
    torch.set_num_threads(1)
    for case in CASES:
        row = json.dumps(measure(case))
        print(row, flush=True)
        with open(sys.argv[1], "a") as f:
            f.write(row + "\n")
