"""Why an epsilon-amortized posterior falls short at the narrow end: one variant of the fit per line, scored at
the task's stored releases against its reference posterior.

Each variant (``--variants``, names in :data:`VARIANTS`) is ``SPPE(task, amortized=True, epsilon_range=RANGE,
**settings)`` with ``--overrides`` (JSON) over its settings; ``"epsilon_range": None`` trains at one epsilon only,
the first of ``--epsilons`` (the control without a range). Each is fitted with one torch thread at each of
``--seeds``, then scored at each of ``--epsilons`` (the task's stored releases) by C2ST between 2000 posterior
draws and as many reference draws (scripts/frontier.py's references, ``--reference`` over its settings) and by
each parameter's sd and 95 % width ratio (``dpsbi.metrics.spread_ratios``). One JSON line per (variant, seed)
is appended to ``--out``; one already there is skipped (a killed run resumes at its variant).

``report FILE``: a table of the rows, one per (variant, seed), and the mean over seeds per variant.

    .venv/bin/python scripts/amortized_diagnosis.py run --task regression --variants global per_epsilon fixed_10 \\
        --seeds 0 1 2 --out results/amortized_diagnosis.jsonl
    .venv/bin/python scripts/amortized_diagnosis.py report results/amortized_diagnosis.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from frontier import reference_for

import dpsbi
from dpsbi.experiment.config import build_task
from dpsbi.metrics import c2st, spread_ratios

RANGE = (0.1, 10.0)
#: The fits compared: SPPE keywords of each (over ``amortized=True, epsilon_range=RANGE``).
VARIANTS = {
    "global": {
        "sims_per_round": 1000,
        "flow": {"release_scaling": "global"},
    },  # one z-scoring (before issue 31)
    "per_epsilon": {"sims_per_round": 1000, "flow": {"release_scaling": "per_epsilon"}},  # at its own epsilon
    "both": {"sims_per_round": 1000, "flow": {"release_scaling": "both"}},  # the two side by side
    "fixed_10": {"sims_per_round": 1000, "epsilon_range": None},  # the control: releases at one epsilon only
    "global_sims10k": {"sims_per_round": 10_000, "flow": {"release_scaling": "global"}},
    "per_epsilon_sims10k": {"sims_per_round": 10_000, "flow": {"release_scaling": "per_epsilon"}},
    "both_sims10k": {"sims_per_round": 10_000, "flow": {"release_scaling": "both"}},
    # the new defaults, each with one more change: capacity, gradient steps
    "hidden100_sims10k": {
        "sims_per_round": 10_000,
        "flow": {"release_scaling": "per_epsilon", "hidden": 100},
    },
    "steps2000_sims10k": {
        "sims_per_round": 10_000,
        "flow": {"release_scaling": "per_epsilon"},
        "training": {"max_steps": 2000},
    },
    # the range's end: epsilon 10 inside a range to 20 instead of at its end
    "range20_sims10k": {
        "sims_per_round": 10_000,
        "epsilon_range": (0.1, 20.0),
        "flow": {"release_scaling": "per_epsilon"},
    },
}


def fit(task_name: str, settings: dict, seed: int, epsilons: list[float]):
    """The variant's posterior, its number of simulations, and its fit's CPU and wall seconds."""
    settings = {"epsilon_range": RANGE, **settings}
    epsilon = epsilons[0] if settings["epsilon_range"] is None else 1.0
    task = build_task({"name": task_name, "epsilon": epsilon})
    wall, cpu = time.perf_counter(), time.process_time()
    estimator = dpsbi.SPPE(task, amortized=True, progress=False, seed=seed, **settings)
    posterior = estimator.run()
    seconds = round(time.process_time() - cpu, 1), round(time.perf_counter() - wall, 1)
    return posterior, estimator.num_simulations, *seconds


def score(
    task_name: str, posterior, epsilons: list[float], ranged: bool, n: int, reference: dict
) -> list[dict]:
    """C2ST and sd ratios at each stored release."""
    rows = []
    for epsilon in epsilons:
        config = {"name": task_name, "epsilon": epsilon}
        task = build_task(config)
        exact = reference_for(task, config, reference).samples[:n]
        keywords = {"epsilon": epsilon} if ranged else {}
        draws = posterior.sample((n,), y=task.y_obs, seed=0, **keywords).cpu()
        ratios = spread_ratios(draws, exact)
        rows.append(
            {
                "epsilon": epsilon,
                "c2st": round(c2st(draws, exact, seed=0), 4),
                "sd_ratio": [round(v, 3) for v in ratios["sd_ratio"]],
                "width95_ratio": [round(v, 3) for v in ratios["width95_ratio"]],
            }
        )
    return rows


def report(path: Path) -> None:
    """Print the rows of ``path`` as a table: C2ST and mean sd ratio at each epsilon, per (variant, seed), then
    the mean over seeds of each variant's C2ST."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    epsilons = sorted({s["epsilon"] for r in rows for s in r["scores"]}, reverse=True)
    head = " | ".join(f"epsilon {e:g}: C2ST (sd ratios)" for e in epsilons)
    print(f"| task | variant | seed | fit CPU s | {head} |")
    print("|---|---|---|---|" + "---|" * len(epsilons))
    by_variant: dict[tuple, dict[float, list[float]]] = {}
    for r in rows:
        at = {s["epsilon"]: s for s in r["scores"]}
        cells = []
        for e in epsilons:
            if e not in at:
                cells.append("-")
                continue
            ratios = ", ".join(f"{v:.2f}" for v in at[e]["sd_ratio"])
            cells.append(f"{at[e]['c2st']:.3f} ({ratios})")
            by_variant.setdefault((r["task"], r["variant"]), {}).setdefault(e, []).append(at[e]["c2st"])
        print(
            f"| {r['task']} | {r['variant']} | {r['seed']} | {r['fit_cpu_s']:.0f} | "
            + " | ".join(cells)
            + " |"
        )
    print()
    print("| task | variant | " + " | ".join(f"mean C2ST at {e:g} (seeds)" for e in epsilons) + " |")
    print("|---|---|" + "---|" * len(epsilons))
    for (task, variant), scores in by_variant.items():
        cells = [
            f"{statistics.mean(scores[e]):.3f} ({len(scores[e])})" if e in scores else "-" for e in epsilons
        ]
        print(f"| {task} | {variant} | " + " | ".join(cells) + " |")


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    done = set()
    if args.out.exists():
        done = {
            (r["task"], r["variant"], r["seed"]) for r in map(json.loads, args.out.read_text().splitlines())
        }
    for seed in args.seeds:
        for label in args.variants:
            if (args.task, label, seed) in done:
                continue
            settings = {**VARIANTS[label], **args.overrides}
            posterior, simulations, cpu, wall = fit(args.task, settings, seed, args.epsilons)
            ranged = settings.get("epsilon_range", RANGE) is not None
            epsilons = args.epsilons if ranged else args.epsilons[:1]
            row = {
                "task": args.task,
                "variant": label,
                "settings": settings,
                "seed": seed,
                "simulations": simulations,
                "fit_cpu_s": cpu,
                "fit_wall_s": wall,
                "scores": score(args.task, posterior, epsilons, ranged, args.draws, args.reference),
            }
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run")
    r.add_argument("--task", default="regression")
    r.add_argument("--epsilons", type=float, nargs="+", default=[10.0, 1.0, 0.1])
    r.add_argument("--variants", nargs="+", required=True, choices=list(VARIANTS))
    r.add_argument(
        "--overrides", type=json.loads, default={}, help="SPPE keywords over every variant's, as JSON"
    )
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument("--draws", type=int, default=2000)
    r.add_argument(
        "--reference",
        type=json.loads,
        default={},
        help="reference settings over scripts/frontier.py's, as JSON",
    )
    r.add_argument("--out", type=Path, required=True)
    commands.add_parser("report").add_argument("results", type=Path)
    args = parser.parse_args()
    if args.command == "report":
        return report(args.results)
    run(args)


if __name__ == "__main__":
    main()
