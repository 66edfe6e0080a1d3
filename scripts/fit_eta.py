"""How right a fit's progress bar is about when the fit ends: the remaining time it shows at the end of every round
(:class:`dpsbi.inference.progress.FitProgress`) against the time the fit actually took from there, and what a bar
over rounds would have extrapolated (the rounds' average time so far), for a default fit on regression at
epsilon 1 on one torch thread. Writes one JSON line to ``--out``:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/fit_eta.py --method SPPE --out results/fit_eta.jsonl

``--rounds`` and ``--steps`` (a cap on each round's training steps) cut the fit for a quick look.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

import dpsbi
from dpsbi.inference import progress


def measure(method: str, rounds: int | None, steps: int | None) -> dict:
    """Fit ``method`` with its bar on; per finished round, the bar's estimate and the actual remaining seconds."""
    shown = []
    end_round = progress.FitProgress.end_round

    def spy(self, entry):
        end_round(self, entry)
        shown.append((entry["round"], time.perf_counter(), self.remaining()))

    progress.FitProgress.end_round = spy
    options = {} if rounds is None else dict(rounds=rounds)
    if steps is not None:
        options["training"] = dict(max_steps=steps)
    began = time.perf_counter()
    try:
        estimator = getattr(dpsbi, method)(dpsbi.tasks.load("regression", epsilon=1.0), **options)
        estimator.run()
    finally:
        progress.FitProgress.end_round = end_round
    end = time.perf_counter()
    rows = []
    for number, at, estimate in shown[:-1]:  # after the last round nothing is left to estimate
        actual = end - at
        by_rounds = (at - began) / number * (estimator.rounds - number)
        rows.append(
            dict(
                round=number,
                at=round(at - began, 1),
                estimate=round(estimate, 1),
                actual=round(actual, 1),
                error=round((estimate - actual) / actual, 3),
                rounds_bar_error=round((by_rounds - actual) / actual, 3),
            )
        )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return dict(
        method=method,
        rounds=estimator.rounds,
        steps=steps,
        seconds=round(end - began, 1),
        cpu_seconds=round(usage.ru_utime + usage.ru_stime, 1),
        by_round=rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--method", choices=["SPPE", "SPLE"], default="SPPE")
    parser.add_argument("--rounds", type=int, help="rounds of the fit (default: the method's)")
    parser.add_argument("--steps", type=int, help="cap on each round's training steps (default: none)")
    parser.add_argument("--out", type=Path, default=Path("results/fit_eta.jsonl"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    row = measure(args.method, args.rounds, args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as file:
        file.write(json.dumps(row) + "\n")
    for r in row["by_round"]:
        print(
            f"{row['method']} after round {r['round']} ({r['at']} s): bar {r['estimate']} s left, actual {r['actual']} s "
            f"({r['error']:+.0%}; a bar over rounds {r['rounds_bar_error']:+.0%})"
        )


if __name__ == "__main__":
    main()
