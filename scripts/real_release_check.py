"""The held-out scenario, measured: a release made by OpenDP itself and clamped at 0 (docs/REAL_RELEASES.md),
fitted by ``SPPE(task)`` and ``SPLE(task)`` with their full defaults on one torch thread, scored per round by
C2ST against the exact posterior (quadrature, as on the page).

The task, the curator's OpenDP pipeline and the exact posterior are the page's own code: its ``# file:``
blocks are written to a temporary directory and imported, so the script measures what the page shows.
Every round appends a JSON line to ``--out``: method, release, round (from 1; lines written while the library
counted rounds from 0 start at 0), simulations, ``fit_seconds`` (the
estimator's own round times, summed: simulation, proposals, training), ``sample_seconds`` (drawing the
``--draws`` posterior draws scored; SPLE's are MCMC), ``seconds`` (their sum: the time to have those draws had
the fit stopped there), ``cpu_seconds`` (the same in the process's CPU time), ``c2st`` and ``sd_ratio`` (posterior
sd over the exact one's, per parameter; rows written before these two were added lack them); a last line per
fit gives the whole fit's wall time (scoring excluded).
The one-minute load average is recorded too: on a shared machine the timings are upper bounds.

    .venv/bin/python scripts/real_release_check.py                     # the page's release, SPLE then SPPE
    .venv/bin/python scripts/real_release_check.py --fresh 2 --methods SPPE   # + 2 new OpenDP releases
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "REAL_RELEASES.md"
FILE_BLOCK = re.compile(r"```python\n# file: (\S+)\n(.*?)```", re.S)


def page_modules(directory: Path):
    """Write the page's ``# file:`` blocks to ``directory`` and import them: ``(outbreak, exact)``."""
    for name, code in FILE_BLOCK.findall(PAGE.read_text()):
        (directory / name).write_text(f"# file: {name}\n{code}")
    sys.path.insert(0, str(directory))
    return importlib.import_module("outbreak"), importlib.import_module("exact")


def fresh_releases(outbreak, n: int) -> list[list[int]]:
    """``n`` new releases of the page's confidential records, each made by OpenDP (unseedable noise)."""
    import numpy as np

    counts = np.random.default_rng(7).poisson(10 * np.exp(-0.35 * np.arange(outbreak.WEEKS)))
    records = [week for week in range(outbreak.WEEKS) for _ in range(counts[week])]
    return [outbreak.publish(records) for _ in range(n)]


def fit(
    method, task, exact: torch.Tensor, release: list, out: Path, draws: int, common: dict, overrides: dict
) -> dict:
    """Fit ``method(task, **overrides)`` (no overrides: its defaults), scoring each round; returns the summary."""
    import dpsbi

    rows: list[dict] = []
    scoring = [0.0]
    cpu_scoring = [0.0]

    def score(round_number: int, posterior, num_simulations: int) -> None:
        began, cpu_began = time.perf_counter(), time.process_time()
        theta = posterior.sample((draws,), seed=1)
        sampled = time.perf_counter() - began
        cpu_fit = time.process_time() - cpu_start - cpu_scoring[0]  # this round's draws included
        row = {
            **common,
            "method": method.method,
            "release": release,
            "round": round_number,
            "num_simulations": num_simulations,
            "fit_seconds": round(sum(entry["seconds"] for entry in estimator.history), 1),
            "sample_seconds": round(sampled, 1),
            "c2st": round(dpsbi.metrics.c2st(theta, exact), 4),
            "sd_ratio": [round(r, 3) for r in dpsbi.metrics.spread_ratios(theta, exact)["sd_ratio"]],
            "cpu_seconds": round(cpu_fit, 1),
            "load_1min": round(os.getloadavg()[0], 2),
        }
        row["seconds"] = round(row["fit_seconds"] + row["sample_seconds"], 1)
        rows.append(row)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"{method.method} round {round_number}: {num_simulations} simulations, {row['seconds']} s "
            f"({row['cpu_seconds']} CPU s), C2ST {row['c2st']}, sd ratio {row['sd_ratio']}",
            flush=True,
        )
        scoring[0] += time.perf_counter() - began  # not part of the fit
        cpu_scoring[0] += time.process_time() - cpu_began

    estimator = method(task, progress=False, on_round_end=score, **overrides)
    began, cpu_start = time.perf_counter(), time.process_time()
    estimator.run()
    wall = time.perf_counter() - began - scoring[0]
    last = {
        **common,
        "method": method.method,
        "release": release,
        "summary": True,
        "rounds": len(estimator.history),
        "num_simulations": estimator.num_simulations,
        "fit_wall_seconds": round(wall, 1),
        "final_seconds": rows[-1]["seconds"],
        "final_c2st": rows[-1]["c2st"],
        "final_sd_ratio": rows[-1]["sd_ratio"],
        "final_cpu_seconds": rows[-1]["cpu_seconds"],
        "best_c2st": min(row["c2st"] for row in rows),
        "first_round_at_or_below_0.55": next((row["round"] for row in rows if row["c2st"] <= 0.55), None),
        "cpu_seconds_at_or_below_0.55": next(
            (row["cpu_seconds"] for row in rows if row["c2st"] <= 0.55), None
        ),
        "load_1min": round(os.getloadavg()[0], 2),
    }
    with out.open("a") as f:
        f.write(json.dumps(last) + "\n")
    return last


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["SPLE", "SPPE"], choices=["SPLE", "SPPE"])
    parser.add_argument("--fresh", type=int, default=0, help="also fit this many new OpenDP releases")
    parser.add_argument("--page-release", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--draws", type=int, default=2000, help="posterior draws scored per round")
    parser.add_argument(
        "--overrides",
        type=json.loads,
        default={},
        help="estimator arguments as JSON (a smoke test: '{\"rounds\": 1}')",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "real_release_check.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import dpsbi

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        outbreak, exact_module = page_modules(Path(directory))
        releases = ([outbreak.RELEASE] if args.page_release else []) + fresh_releases(outbreak, args.fresh)
        common = {
            "torch_threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "overrides": args.overrides,
        }
        for release in releases:
            task = outbreak.make_task(release)
            began = time.perf_counter()
            exact, log_evidence = exact_module.exact_posterior(task, args.draws)
            print(f"release {release}: exact posterior in {time.perf_counter() - began:.1f} s", flush=True)
            for name in args.methods:
                last = fit(
                    getattr(dpsbi, name), task, exact, release, args.out, args.draws, common, args.overrides
                )
                print(json.dumps(last), flush=True)


if __name__ == "__main__":
    main()
