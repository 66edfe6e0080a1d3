"""Does a fit that sees nothing else do better at naive Bayes' hardest amortized release? A sequential
``SPPE(task)`` fit at the defaults, at release 8 of ``scripts/amortized_check.py``'s 20 prior-predictive releases at
epsilon 1.5 (seed 100; one noise draw 8.4 scales out), scored after every round against 2000 exact draws: C2ST, the
sd ratio and the mean shift per parameter. One JSON line a round to the file given. docs/RESULTS.md, "Three seeds
at a million simulations, and rare releases weighted up".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/release8_sequential.py results/amortized_frontier/naive_bayes_release8_sequential.jsonl
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check

import torch  # noqa: E402
from amortized_check import exact_draws, load, prior_predictive  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.metrics import c2st, mean_shift, spread_ratios  # noqa: E402

EPSILON, RELEASE, DRAWS = 1.5, 8, 2000


def main(out: Path) -> None:
    torch.set_num_threads(1)
    _, y = prior_predictive(load({"name": "naive_bayes"}, EPSILON), 20, seed=100)
    task = load({"name": "naive_bayes", "y_obs": y[RELEASE]}, EPSILON)
    exact = exact_draws(task, {"name": "naive_bayes"}, y[RELEASE], DRAWS, RELEASE, {})
    start = time.process_time()

    def on_round_end(round_number: int, posterior, simulations: int) -> None:
        draws = posterior.sample((DRAWS,))
        row = {
            "round": round_number,
            "sims": simulations,
            "cpu_s": round(time.process_time() - start, 1),
            "c2st": round(c2st(draws, exact), 4),
            "sd_ratio": [round(v, 3) for v in spread_ratios(draws, exact)["sd_ratio"]],
            "shift": [round(v, 3) for v in mean_shift(draws, exact)],
        }
        with out.open("a") as file:
            print(json.dumps(row), file=file)

    dpsbi.SPPE(task, seed=0, progress=False, on_round_end=on_round_end).run()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
