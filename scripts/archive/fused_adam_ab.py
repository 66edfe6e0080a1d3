"""Adam's fused kernel against its per-tensor loop (torch's CPU default, dpsbi's until the fortieth session) on one
CPU core: ``python scripts/archive/fused_adam_ab.py OUT.jsonl`` (one torch thread, eager steps).

First ``optimizer.step()`` alone on the default regression flow's parameters (loop, ``foreach`` and fused, interleaved,
``OPTIMIZER_REPEATS`` each), then the whole training step of each kind a default CPU fit runs: each case of
``scripts/cpu_compile_kinds.py`` built with tiny rounds, its step (``_Round.step``: draws, loss, backward, clipping,
Adam) run on two copies of the same flow, one with each optimizer, ``REPEATS`` steps each, interleaved. A row gives
the mean CPU milliseconds of each and the ratio fused / loop.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for cpu_compile_kinds

import torch  # noqa: E402
from cpu_compile_kinds import CASES, built  # noqa: E402

from dpsbi.inference.training import _Round  # noqa: E402

REPEATS, OPTIMIZER_REPEATS = 60, 200
ADAM = dict(loop={}, foreach=dict(foreach=True), fused=dict(fused=True))


def _interleaved(calls: dict, repeats: int) -> dict:
    """Mean CPU ms of each of ``calls`` (``{name: callable}``), called ``repeats`` times each in turn, the order
    reversed every other round."""
    spent = dict.fromkeys(calls, 0.0)
    for repeat in range(repeats):
        for name in list(calls)[:: 1 if repeat % 2 else -1]:
            cpu = time.process_time()
            calls[name]()
            spent[name] += time.process_time() - cpu
    return {name: round(total / repeats * 1e3, 2) for name, total in spent.items()}


def optimizer_row() -> dict:
    """``optimizer.step()`` alone, each variant on its own copy of the regression flow's parameters and gradients."""
    estimator = built("sppe regression round 1")[0]
    steps = {}
    for kind, options in ADAM.items():
        parameters = [p.detach().clone().requires_grad_() for p in estimator.flow.parameters()]
        for p in parameters:
            p.grad = torch.randn_like(p) * 1e-3
        optimizer = torch.optim.Adam(parameters, lr=1e-3, weight_decay=1e-4, **options)
        optimizer.step()  # Adam's state built outside the timing
        steps[kind] = optimizer.step
    ms = _interleaved(steps, OPTIMIZER_REPEATS)
    return {"case": "optimizer.step only, regression flow", "parameter_tensors": len(parameters)} | {
        f"{kind}_cpu_ms": value for kind, value in ms.items()
    }


def step_row(name: str) -> dict:
    """One case's training step with the per-tensor and with the fused Adam."""
    estimator, index, data, loss, rows = built(name)
    training = dataclasses.replace(estimator.training, compile=False)
    states = {
        kind: _Round(copy.deepcopy(estimator.flow), loss, training, 0, 10_000) for kind in ("loop", "fused")
    }
    flow = states["loop"].flow
    states["loop"].optimizer = torch.optim.Adam(
        flow.parameters(), lr=training.lr, weight_decay=training.weight_decay
    )
    for state in states.values():  # Adam's state built outside the timing
        state.step(data, rows)
    ms = _interleaved({kind: lambda s=state: s.step(data, rows) for kind, state in states.items()}, REPEATS)
    return {
        "case": name,
        "flow_evaluations": estimator.step_work(index),
        "batch": len(rows),
        "parameter_tensors": len(list(flow.parameters())),
        "loop_cpu_ms": ms["loop"],
        "fused_cpu_ms": ms["fused"],
        "ratio": round(ms["fused"] / ms["loop"], 3),
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/archive/fused_adam_ab.py OUT.jsonl")
    torch.set_num_threads(1)
    for row in (optimizer_row, *(functools.partial(step_row, case) for case in CASES)):
        line = json.dumps(row() | {"torch": torch.__version__})
        print(line, flush=True)
        with open(sys.argv[1], "a") as f:
            f.write(line + "\n")
