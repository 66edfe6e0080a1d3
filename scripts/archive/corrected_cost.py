"""CPU seconds of ``dpsbi.baselines.corrected`` at one release, as a user runs it on an amortized regression flow
over epsilon 0.1-10 (RESULTS, "Cost per release"): a short amortized fit (its weights barely trained: the cost of a
flow pass is its architecture's, and the route through the two stages is timed as is), then ``--repeats`` calls of
``corrected`` at ``y_obs`` and epsilon 1 with ``--draws`` proposals (4 simulations each, the default), each timed
in CPU seconds with its first stage's flow calls counted apart. One torch thread; a JSON row a call on stdout:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/corrected_cost.py --draws 100000 --repeats 3
"""

import argparse
import json
import time

import torch

import dpsbi
from dpsbi.baselines import corrected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = dpsbi.tasks.load("regression", epsilon=1.0)
    posterior = dpsbi.SPPE(
        task,
        amortized=True,
        epsilon_range=(0.1, 10.0),
        rounds=1,
        sims_per_round=2000,
        training=dict(max_epochs=2, compile=False),
        progress=False,
    ).run()
    flow_seconds = 0.0
    for name in ("sample_and_log_prob", "log_prob"):  # the flow's passes: drawing, and densities
        method = getattr(posterior.flow, name)

        def timed(*a, _method=method, **k):
            nonlocal flow_seconds
            began = time.process_time()
            try:
                return _method(*a, **k)
            finally:
                flow_seconds += time.process_time() - began

        setattr(posterior.flow, name, timed)
    for repeat in range(args.repeats):
        flow_seconds, began = 0.0, time.process_time()
        result = corrected(posterior, args.draws, epsilon=1.0, seed=repeat, progress=False)
        row = {
            "draws": args.draws,
            "seed": repeat,
            "cpu_s": round(time.process_time() - began, 3),
            "flow_s": round(flow_seconds, 3),
            "ess": round(result.ess, 1),
            "adapted": result.info["adapted"],
            "dpsbi": dpsbi.__file__,
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
