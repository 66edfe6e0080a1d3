"""Why an epsilon-amortized posterior falls short at the narrow end: one variant of the fit per line, scored at
the task's stored releases against its reference posterior.

Each ``--variant LABEL=JSON`` is ``SPPE(task, amortized=True, epsilon_range=RANGE, **JSON)`` (``"epsilon_range":
null`` trains at one epsilon only, the first of ``--epsilons``: the control without a range), fitted with one
torch thread at ``--seed``, then scored at each of ``--epsilons`` (the task's stored releases) by C2ST between
2000 posterior draws and as many reference draws (scripts/frontier.py's references) and by each parameter's sd
ratio (``dpsbi.metrics.spread_ratios``). One JSON line per (variant, seed) is appended to ``--out``; one already
there is skipped (a killed run resumes at its variant).

    .venv/bin/python scripts/amortized_diagnosis.py --task regression --out results/amortized_diagnosis.jsonl \\
        --variant 'global={"flow": {"release_scaling": "global"}}' --variant 'per_epsilon={}'
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from frontier import reference_for

import dpsbi
from dpsbi.experiment.config import build_task
from dpsbi.metrics import c2st, spread_ratios

RANGE = (0.1, 10.0)


def fit(task_name: str, settings: dict, seed: int, epsilons: list[float]):
    """The variant's posterior, and its fit's CPU and wall seconds."""
    settings = {"epsilon_range": RANGE, **settings}
    epsilon = epsilons[0] if settings["epsilon_range"] is None else 1.0
    task = build_task({"name": task_name, "epsilon": epsilon})
    wall, cpu = time.perf_counter(), time.process_time()
    posterior = dpsbi.SPPE(task, amortized=True, progress=False, seed=seed, **settings).run()
    return posterior, round(time.process_time() - cpu, 1), round(time.perf_counter() - wall, 1)


def score(task_name: str, posterior, epsilons: list[float], ranged: bool, n: int) -> list[dict]:
    """C2ST and sd ratios at each stored release."""
    rows = []
    for epsilon in epsilons:
        config = {"name": task_name, "epsilon": epsilon}
        task = build_task(config)
        reference = reference_for(task, config).samples[:n]
        keywords = {"epsilon": epsilon} if ranged else {}
        draws = posterior.sample((n,), y=task.y_obs, seed=0, **keywords).cpu()
        ratios = spread_ratios(draws, reference)
        rows.append(
            {
                "epsilon": epsilon,
                "c2st": round(c2st(draws, reference, seed=0), 4),
                "sd_ratio": [round(v, 3) for v in ratios["sd_ratio"]],
                "width95_ratio": [round(v, 3) for v in ratios["width95_ratio"]],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="regression")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[10.0, 1.0, 0.1])
    parser.add_argument("--variant", action="append", required=True, help="LABEL=JSON of SPPE keywords")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    done = set()
    if args.out.exists():
        done = {(r["task"], r["variant"], r["seed"]) for r in map(json.loads, args.out.read_text().splitlines())}
    for seed in args.seeds:
        for variant in args.variant:
            label, _, settings = variant.partition("=")
            if (args.task, label, seed) in done:
                continue
            settings = json.loads(settings or "{}")
            posterior, cpu, wall = fit(args.task, settings, seed, args.epsilons)
            ranged = settings.get("epsilon_range", RANGE) is not None
            epsilons = args.epsilons if ranged else args.epsilons[:1]
            row = {
                "task": args.task,
                "variant": label,
                "settings": settings,
                "seed": seed,
                "fit_cpu_s": cpu,
                "fit_wall_s": wall,
                "scores": score(args.task, posterior, epsilons, ranged, args.draws),
            }
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
