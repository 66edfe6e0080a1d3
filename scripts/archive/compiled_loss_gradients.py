"""Each timed training step's loss (``scripts/bench_step.py``'s STEPS: SPPE's atomic loss on regression, the
amortized SIR and census SPPE losses, SPLE's widened amortized loss on naive Bayes) compiled by inductor on the CPU
against eager, on one batch of a fit's data under two draws of the mechanism's noise and atoms (generator seeds 0
and 1): the loss value and the gradient of every flow parameter (relative error of the whole gradient vector).
``python scripts/archive/compiled_loss_gradients.py [--json out.jsonl]``; RESULTS, "Compiled on the CPU, mended"."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_step import STEPS, _estimator  # noqa: E402

from dpsbi.inference.training import batches  # noqa: E402

BATCH = {"regression": 100}


def gradients(compute, flow, batch, draws) -> tuple[float, torch.Tensor]:
    flow.zero_grad(set_to_none=True)
    value = compute(flow, batch, draws)
    value.backward()
    return float(value), torch.cat([p.grad.flatten() for p in flow.parameters() if p.grad is not None])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for step in STEPS:
        size = BATCH.get(step, 1000)
        estimator = _estimator("dpsbi", size, step)
        flow, data, loss = estimator.flow, estimator._dataset(False), estimator.loss(1)
        rows = next(batches(torch.arange(data[0].shape[0]), size))
        batch = tuple(t.index_select(0, rows) for t in data)
        torch._dynamo.reset()
        compiled = torch.compile(loss.compute, fullgraph=True, dynamic=False)
        for seed in (0, 1):
            draws = loss.draw(rows.shape[0], torch.Generator().manual_seed(seed))
            eager_value, eager = gradients(loss.compute, flow, batch, draws)
            start = time.perf_counter()
            value, grads = gradients(compiled, flow, batch, draws)
            row = {
                "step": step,
                "batch": rows.shape[0],
                "draws_seed": seed,
                "loss_eager": eager_value,
                "loss_compiled": value,
                "gradient_relative_error": float((grads - eager).norm() / eager.norm()),
                "compiled_step_s": time.perf_counter() - start,
                "torch": torch.__version__,
            }
            print(json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
