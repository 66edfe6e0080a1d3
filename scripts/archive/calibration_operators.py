"""The operators (a GPU's kernels) and CPU milliseconds of each registered task's per-row re-calibration (an
amortized training step's ``at_epsilons`` at 1000 rows of epsilons in 0.5-8.5), counted on torch's meta device
after one call on the CPU has built the tables; and a scalar discrete Gaussian's at sensitivity 1 for comparison:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/calibration_operators.py

The thirty-seventh session's figures (docs/RESULTS.md, "On a GPU"): the census table 1292 operators and 9.5 ms
before its zCDP conversion was tabled, 41 and 0.6 ms after; the conjugate Gaussian 1518 operators a call on a device
before the analytic calibration was one tabled path, 101 after.
"""

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_step import OperatorCount  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.mechanisms import DiscreteGaussian  # noqa: E402
from dpsbi.mechanisms.epsilon import at_epsilons, epsilon_range_problem  # noqa: E402


def measure(name: str, mechanism, repeats: int = 20) -> dict:
    """Operators on the meta device and CPU ms of one calibration of 1000 rows."""
    epsilon = torch.linspace(0.5, 8.5, 1000, dtype=torch.float64)[:, None]
    at_epsilons(mechanism, epsilon)  # the tables, built once
    with OperatorCount() as count:
        at_epsilons(mechanism, epsilon.to("meta"))
    began = time.process_time()
    for _ in range(repeats):
        at_epsilons(mechanism, epsilon)
    cpu_ms = (time.process_time() - began) / repeats * 1e3
    return {
        "task": name,
        "mechanism": type(mechanism).__name__,
        "operators": count.calls,
        "cpu_ms": round(cpu_ms, 2),
    }


def main() -> None:
    torch.set_num_threads(1)
    for name in dpsbi.tasks.names():
        try:
            mechanism = dpsbi.tasks.load(name).mechanism
        except (TypeError, ValueError):  # a task that needs arguments (custom)
            continue
        if epsilon_range_problem(mechanism) is None:
            print(json.dumps(measure(name, mechanism)), flush=True)
    print(
        json.dumps(measure("(scalar discrete Gaussian, sensitivity 1)", DiscreteGaussian(1.0, 1e-6))),
        flush=True,
    )


if __name__ == "__main__":
    main()
