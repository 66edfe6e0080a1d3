"""A scalar discrete Gaussian's per-row calibration (``discrete_gaussian_sigmas``: a table's bracket and six Newton
steps, at ``delta (1 - 1e-9)``) against the 64-halving bisection it replaced (``_bisected_sigmas``, at the same
delta): accuracy over 100 000 epsilons from 1e-5 to just below ``one_to_one_epsilon`` at four deltas and
sensitivities, and privacy at ``delta``; the table's build time; operators on torch's meta device (a GPU's kernels)
and CPU ms for 1000 rows; with ``--compile``, each compiled by inductor (a fresh cache: cold) alone, its compile
seconds, compiled ms and the compiled sigmas' delta (eager) over its target, or the compiler's error:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/scalar_dg_calibration.py OUT.jsonl [--compile]
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_step import OperatorCount  # noqa: E402

from dpsbi.mechanisms.discrete import (  # noqa: E402
    _DELTA_MARGIN,
    _bisected_sigmas,
    _deltas,
    discrete_gaussian_sigmas,
    one_to_one_epsilon,
)

CASES = [(1e-6, 1), (1e-5, 1), (1e-10, 3), (1e-9, 2)]


def bisection(epsilon, delta, sensitivity):
    return torch.exp(_bisected_sigmas(epsilon, delta, sensitivity)[..., 1])


def _epsilons(n: int, delta: float, sensitivity: int, seed: int = 0):
    """``n`` epsilons log-uniform from 1e-5 to 0.999 of the one-to-one limit."""
    u = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    top = math.log(0.999 * one_to_one_epsilon(delta, sensitivity))
    return torch.exp(math.log(1e-5) + u * (top - math.log(1e-5)))


def accuracy(delta: float, sensitivity: int) -> dict:
    epsilon = _epsilons(100_000, delta, sensitivity)
    began = time.process_time()
    sigma = discrete_gaussian_sigmas(epsilon[:1], delta, sensitivity)  # builds the table
    table_s = time.process_time() - began
    sigma = discrete_gaussian_sigmas(epsilon, delta, sensitivity)
    relative = sigma / bisection(epsilon, delta * (1 - _DELTA_MARGIN), sensitivity) - 1
    excess = _deltas(epsilon, sigma, sensitivity) / delta - 1
    return {
        "part": "accuracy",
        "delta": delta,
        "sensitivity": sensitivity,
        "epsilons": epsilon.numel(),
        "max_abs_relative": float(relative.abs().max()),
        "q999_abs_relative": float(relative.abs().quantile(0.999)),
        "max_delta_excess": float(excess.max()),
        "table_cpu_s": round(table_s, 2),
    }


def cost(name: str, calibrate, delta: float, sensitivity: int, repeats: int = 20) -> dict:
    epsilon = _epsilons(1000, delta, sensitivity, seed=1)
    calibrate(epsilon, delta, sensitivity)
    with OperatorCount() as count:
        calibrate(epsilon.to("meta"), delta, sensitivity)
    began = time.process_time()
    for _ in range(repeats):
        calibrate(epsilon, delta, sensitivity)
    row = {"part": "cost", "calibration": name, "delta": delta, "sensitivity": sensitivity, "rows": 1000}
    return row | {"operators": count.calls, "cpu_ms": round((time.process_time() - began) / repeats * 1e3, 2)}


def compiled(name: str, calibrate, delta: float, sensitivity: int, repeats: int = 20) -> dict:
    epsilon = _epsilons(1000, delta, sensitivity, seed=1)
    calibrate(epsilon, delta, sensitivity)  # its table, outside the graph
    step = torch.compile(lambda e: calibrate(e, delta, sensitivity), fullgraph=True, dynamic=False)
    row = {"part": "compiled", "calibration": name, "delta": delta, "sensitivity": sensitivity, "rows": 1000}
    began = time.time()
    try:
        value = step(epsilon)
    except Exception as error:  # the compiler's own failure is the measurement
        lines = [line for line in str(error).splitlines() if "internal compiler error" in line]
        return row | {"error": type(error).__name__, "detail": lines[0][-120:] if lines else str(error)[:120]}
    row["compile_wall_s"] = round(time.time() - began, 1)
    row["max_abs_relative_to_eager"] = float((value / calibrate(epsilon, delta, sensitivity) - 1).abs().max())
    row["max_delta_excess"] = float((_deltas(epsilon, value, sensitivity) / delta - 1).max())
    began = time.process_time()
    for _ in range(repeats):
        step(epsilon)
    return row | {"cpu_ms": round((time.process_time() - began) / repeats * 1e3, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-"))

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    for case in CASES:
        emit(accuracy(*case))
    for name, calibrate in (("table and Newton", discrete_gaussian_sigmas), ("bisection", bisection)):
        emit(cost(name, calibrate, 1e-6, 1))
        if args.compile:
            emit(compiled(name, calibrate, 1e-6, 1))


if __name__ == "__main__":
    main()
