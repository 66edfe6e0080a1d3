"""Fault-injection report: damaged posterior, checkpoint and reference-cache files; dpsbi-run killed with
SIGKILL at random points and rerun into its directory; concurrent runs and sweeps in one directory.

    python scripts/fault_injection.py [--quick] [--out fault_injection.json] [--work DIR]

Prints a table of trials and outcomes (the goal: nothing loaded differently, nothing lost or mixed) and
writes it as JSON. ``tests/test_fault_injection.py`` runs the same trials at small counts.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
from faults import (
    DIFFERENT,
    IDENTICAL,
    corruption_trials,
    damaged_copies,
    finish,
    kill_after,
    run_outputs,
    start,
)
from omegaconf import OmegaConf

import dpsbi
from dpsbi.experiment.reference import reference_posterior
from dpsbi.inference import checkpoint

#: A tiny experiment: the conjugate toy has a closed-form reference, so a run is mostly process start-up.
RUN = [
    "task=conjugate_gaussian",
    "task.epsilon=10",
    "method.rounds=3",
    "method.sims_per_round=100",
    "method.training.max_epochs=3",
    "companions=[]",
    "plots=false",
    "progress=false",
]
SWEEP = ["-m", *RUN, "method=sppe,sple"]
ESTIMATOR = dict(
    rounds=2,
    sims_per_round=60,
    inner_samples=2,
    atoms=3,
    flow=dict(transforms=1, hidden=8),
    training=dict(max_epochs=1),
    progress=False,
)
RECOMPUTED = "recomputed"


def _task():
    return dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0)


def checkpoint_trials(work: Path, rng: random.Random, flips: int, truncations: int) -> Counter:
    """Damaged SPPE checkpoints, each resumed: refused, or the intact checkpoint's posterior."""
    dpsbi.SPPE(_task(), checkpoint_dir=work / "intact", **ESTIMATOR).run()

    def resume(path: Path) -> list:
        return (
            dpsbi.SPPE(_task(), checkpoint_dir=path.parent, **ESTIMATOR).run().sample((20,), seed=0).tolist()
        )

    return corruption_trials(
        checkpoint.path(work / "intact"), work / "damaged", resume, rng, flips, truncations
    )


def posterior_trials(work: Path, rng: random.Random, flips: int, truncations: int) -> Counter:
    """Damaged posterior files, each loaded and sampled: refused, or the intact file's draws."""
    work.mkdir(parents=True, exist_ok=True)
    dpsbi.SPPE(_task(), **{**ESTIMATOR, "rounds": 1}).run().save(work / "posterior.pt")

    def load(path: Path) -> list:
        return dpsbi.load_posterior(path).sample((20,), seed=0).tolist()

    return corruption_trials(work / "posterior.pt", work / "damaged", load, rng, flips, truncations)


def cache_trials(work: Path, rng: random.Random, flips: int, truncations: int) -> Counter:
    """Damaged reference-cache entries: each recomputed (with a warning naming the file) or, where the damage
    is invisible to the reader, loaded; either way the reference equals the intact one."""
    task, cache = _task(), work / "cache"
    settings = dict(
        method="rejection",
        num_samples=200,
        seed=0,
        progress=False,
        pilot_simulations=1000,
        max_simulations=10**6,
        importance_particles=100,
        importance_draws=1000,
    )

    def reference() -> list:
        return reference_posterior(
            task, {"name": "conjugate_gaussian", "epsilon": 10.0}, cache_dir=cache, **settings
        ).samples.tolist()

    intact = reference()
    entry = next(cache.rglob("*.pt"))
    saved = work / "intact.pt"
    shutil.copyfile(entry, saved)
    counts = Counter()
    for _, damaged in damaged_copies(saved, work / "damaged", rng, flips, truncations):
        shutil.copyfile(damaged, entry)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            same = reference() == intact
        recomputed = any("recomputing" in str(w.message) for w in caught)
        counts[DIFFERENT if not same else RECOMPUTED if recomputed else IDENTICAL] += 1
    return counts


def kill_trials(work: Path, rng: random.Random, kills: int, sweep: bool) -> Counter:
    """``dpsbi-run`` (or a two-point sweep) killed at a uniform random time within an uninterrupted run's
    duration, then rerun into its directory: its outputs must equal the uninterrupted run's."""
    args, flag = (SWEEP, "hydra.sweep.dir") if sweep else (RUN, "hydra.run.dir")
    work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    done = finish([*args, f"{flag}={work / 'reference'}"], work)
    duration = time.perf_counter() - began
    assert done.returncode == 0, done.stdout[-2000:]
    expected = _outputs(work / "reference", sweep)
    counts = Counter()
    for k in range(kills):
        target = work / f"killed_{k}"
        killed = kill_after(start([*args, f"{flag}={target}"], work), rng.uniform(0.5, duration))
        rerun = finish([*args, f"{flag}={target}"], work)
        same = rerun.returncode == 0 and _outputs(target, sweep) == expected
        counts[
            ("resumed identical" if same else "LOST OR MIXED")
            + ("" if killed else " (ended before the kill)")
        ] += 1
    return counts


def concurrent_trials(work: Path, pairs: int, sweep: bool) -> Counter:
    """Two ``dpsbi-run`` (or two sweeps) started together into one directory, with seeds 0 and 1: the directory
    must end holding exactly one complete run per point, equal to that seed's uninterrupted run, and a run
    that was refused must say so; for plain runs, also two runs with default directories (never shared)."""
    args, flag = (SWEEP, "hydra.sweep.dir") if sweep else (RUN, "hydra.run.dir")
    work.mkdir(parents=True, exist_ok=True)
    expected = {}
    for seed in (0, 1):
        assert finish([*args, f"seed={seed}", f"{flag}={work / f'reference_{seed}'}"], work).returncode == 0
        expected[str(seed)] = _outputs(work / f"reference_{seed}", sweep)
    counts = Counter()
    for k in range(pairs):
        target = work / f"shared_{k}"
        processes = [start([*args, f"seed={seed}", f"{flag}={target}"], work) for seed in (0, 1)]
        texts = [p.communicate()[0] for p in processes]
        outputs = _outputs(target, sweep)
        seeds = {point["seed"] for point in outputs.values()} if sweep else {outputs.get("seed")}
        clean = len(seeds) == 1 and outputs == expected.get(next(iter(seeds)))
        refusals = sum("another dpsbi-run" in text or "in use by another process" in text for text in texts)
        counts["one run, complete and unmixed" if clean else "LOST OR MIXED"] += 1
        counts[f"{refusals} of 2 refused as busy"] += 1
    if not sweep:
        processes = [start(RUN, work) for _ in range(2)]
        codes = [p.wait() for p in processes]
        runs = [p for p in (work / "outputs").rglob("summary.json")]
        counts[
            "default dirs: distinct and complete"
            if codes == [0, 0] and len(runs) == 2
            else "default dirs: LOST OR MIXED"
        ] += 1
    return counts


def race_trial(work: Path) -> Counter:
    """Two ``dpsbi-run`` started together into one directory, differing only in how many draws they keep
    (200 and 300): the directory must end holding one complete run whose every ``samples*.csv`` has the
    number of draws its ``config.yaml`` asks for (nothing of the other run), and the other run must be
    refused as busy. Cheaper than :func:`concurrent_trials` (no reference runs)."""
    target = work / "shared"
    work.mkdir(parents=True, exist_ok=True)
    processes = [
        start([*RUN, f"evaluation.num_samples={n}", f"hydra.run.dir={target}"], work) for n in (200, 300)
    ]
    texts = [p.communicate()[0] for p in processes]
    wanted = OmegaConf.load(target / "config.yaml").evaluation.num_samples
    rows = {len(p.read_text().splitlines()) - 1 for p in target.glob("*/samples*.csv")}
    clean = (target / "summary.json").is_file() and rows == {int(wanted)}
    busy = sum("another dpsbi-run" in text for text in texts)
    return Counter(
        {"one run, complete and unmixed" if clean else "LOST OR MIXED": 1, f"{busy} of 2 refused as busy": 1}
    )


def _outputs(directory: Path, sweep: bool) -> dict:
    """Outputs of a run, or of every point of a sweep by its subdirectory name."""
    if not sweep:
        return run_outputs(directory)
    return {p.name: run_outputs(p) for p in sorted(directory.iterdir()) if (p / "config.yaml").is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few trials (a smoke test)")
    parser.add_argument("--out", type=Path, default=Path("fault_injection.json"))
    parser.add_argument("--work", type=Path, help="working directory (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only",
        nargs="+",
        help="run the trials whose names contain one of these words (the report keeps the others' results)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = (
        dict(flips=10, truncations=3, kills=1, pairs=1)
        if args.quick
        else dict(flips=200, truncations=50, kills=10, pairs=4)
    )
    work = args.work or Path(tempfile.mkdtemp(prefix="dpsbi-faults-"))
    rng = random.Random(args.seed)
    trials = {
        "checkpoint files": lambda: checkpoint_trials(work / "checkpoint", rng, n["flips"], n["truncations"]),
        "posterior files": lambda: posterior_trials(work / "posterior", rng, n["flips"], n["truncations"]),
        "reference cache files": lambda: cache_trials(work / "cache", rng, n["flips"] // 2, n["truncations"]),
        "runs killed (SIGKILL) and rerun": lambda: kill_trials(
            work / "kill_run", rng, n["kills"], sweep=False
        ),
        "sweeps killed (SIGKILL) and rerun": lambda: kill_trials(
            work / "kill_sweep", rng, max(n["kills"] // 2, 1), sweep=True
        ),
        "concurrent runs, one directory": lambda: concurrent_trials(
            work / "concurrent_run", n["pairs"], sweep=False
        ),
        "two runs racing into one directory": lambda: sum(
            (race_trial(work / f"race_{k}") for k in range(n["pairs"])), Counter()
        ),
        "concurrent sweeps, one directory": lambda: concurrent_trials(
            work / "concurrent_sweep", max(n["pairs"] // 2, 1), sweep=True
        ),
    }
    report = json.loads(args.out.read_text()) if args.only and args.out.is_file() else {}
    for name, trial in trials.items():
        if args.only and not any(word in name for word in args.only):
            continue
        began = time.perf_counter()
        counts = trial()
        report[name] = {
            "outcomes": dict(counts),
            "trials": _trials(counts),
            "seconds": round(time.perf_counter() - began, 1),
        }
        print(
            f"{name:36s} {report[name]['trials']:4d} trials  {dict(counts)}  ({report[name]['seconds']} s)",
            flush=True,
        )
        args.out.write_text(json.dumps(report, indent=2))
    bad = sum(
        v for r in report.values() for k, v in r["outcomes"].items() if k in (DIFFERENT,) or "LOST" in k
    )
    print(f"\n{bad} trials lost, mixed or loaded something different; report in {args.out}")
    raise SystemExit(1 if bad else 0)


def _trials(counts: Counter) -> int:
    """Trials in ``counts`` (concurrency counts two keys per pair: count the outcome keys only)."""
    return sum(v for k, v in counts.items() if "refused as busy" not in k)


if __name__ == "__main__":
    main()
