"""The privacy-utility curve a curator reads: posterior sd and central 95 % interval width against epsilon, from
ONE epsilon-amortized fit, beside separate sequential fits at epsilon 0.1, 1 and 10 and the reference posteriors.

``run``: per task (regression, SIR), ``SPPE(task, amortized=True, epsilon_range=(0.1, 10))`` at the library's
defaults (one torch thread; ``--range`` trains over another), then

- the curve: at each of 13 log-spaced epsilons, ``--releases`` releases of ONE confidential summary (regression:
  the paper's; SIR: one epidemic simulated at the true parameter, seed 0) with fresh noise; the mean over those
  releases of each parameter's posterior sd and 95 % width (and their spread), ``--draws`` (2000) draws per
  release, one batched call per epsilon;
- at the task's stored releases at 0.1, 1 and 10: the amortized posterior's sd, width and C2ST against the
  reference posterior (``dpsbi.experiment.reference.reference_posterior``, scripts/frontier.py's settings); with
  ``--importance N``, also its draws corrected by importance sampling (``dpsbi.baselines.corrected``: N
  proposals from the flow mixed with the prior, 4 simulations each), with their effective sample size, resampled
  plainly (``corrected at y_obs``) and without repeats (``corrected, smoothed at y_obs``).

``--task-options`` change the fitted task only (SIR's tau-leaping simulator), never the references it is scored
against. One JSON line per row is appended to ``--out``; a task already finished in the file is skipped. With
``--posteriors DIR`` each fit checkpoints its rounds to ``DIR/<task>/`` (a killed run resumes there) and is saved
as ``DIR/<task>.pt``; a fit found there is scored again without training.

``report``: reads those rows and the separate fits (``scripts/frontier.py run --defaults`` rows, seed 0, whose last
round's ``sd`` and ``width95`` are the fit's), each task's of each kind from the last of the files holding them (so
that a newer file replaces one task's rows and keeps the others'), and draws the figure, sd and width per parameter
against epsilon.

    .venv/bin/python scripts/privacy_utility.py run --out results/privacy_utility.jsonl
    .venv/bin/python scripts/frontier.py run --task regression --epsilon 0.1 --method sppe --defaults \\
        --seconds 900 --out results/frontier_defaults.jsonl    # and at 1, 10; the same for sir
    .venv/bin/python scripts/privacy_utility.py report results/privacy_utility.jsonl \\
        results/frontier_defaults.jsonl --figure docs/figures/privacy_utility.png
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from frontier import amortized_fit, read_jsonl, reference_for, spread

import dpsbi
from dpsbi.baselines import corrected, smoothed_resample
from dpsbi.baselines.fitted_proposal import covariance_supported
from dpsbi.experiment.config import build_task

RANGE = (0.1, 10.0)
GRID = torch.logspace(-1, 1, 13, dtype=torch.float64).tolist()
STORED = (0.1, 1.0, 10.0)


def confidential(task) -> torch.Tensor:
    """One confidential summary ``(1, dim_s)``: the paper's when the task holds it, else simulated at the true
    parameter with seed 0."""
    if task.s_obs is not None:
        return task.s_obs
    return task.simulate(task.true_theta, torch.Generator().manual_seed(0))


def curve(task, posterior, releases: int, n: int) -> list[dict]:
    """Rows of the curve: per epsilon of :data:`GRID`, the mean and sd over ``releases`` releases of one
    confidential summary of each parameter's posterior sd and 95 % width, from ``n`` draws each."""
    s = confidential(task).expand(releases, -1)
    rows = []
    for k, epsilon in enumerate(GRID):
        y = task.mechanism.with_epsilon(epsilon).sample(s, generator=torch.Generator().manual_seed(k))
        draws = posterior.sample_batched((n,), y=y, epsilon=epsilon, seed=k).cpu()  # (n, B, dim)
        per = [spread(draws[:, b]) for b in range(releases)]
        row = {"kind": "curve", "epsilon": epsilon, "releases": releases}
        for key in ("sd", "width95"):
            values = torch.tensor([p[key] for p in per])
            row[key] = [round(v, 5) for v in values.mean(0).tolist()]
            row[f"{key}_spread"] = [round(v, 5) for v in values.std(0).tolist()]
        rows.append(row)
    return rows


def at_stored(name: str, posterior, n: int, reference_settings: dict, proposals: int) -> list[dict]:
    """The amortized posterior at the task's stored release at each of :data:`STORED`, ``n`` draws, against as
    many of the reference's (``reference_settings`` over scripts/frontier.py's); with ``proposals``, also its
    draws corrected by importance sampling (``dpsbi.baselines.corrected``, 4 simulations a draw), resampled plainly
    (points repeat where the ESS is below ``n``, and C2ST reads the repeats) and without repeats
    (``dpsbi.baselines.smoothed_resample``, as the stored SIR references are; where the ESS supports it)."""
    rows = []
    for epsilon in STORED:
        config = {"name": name, "epsilon": epsilon}
        task = build_task(config)
        reference = reference_for(task, config, reference_settings)
        draws = {"amortized at y_obs": posterior.sample((n,), y=task.y_obs, epsilon=epsilon, seed=0).cpu()}
        if proposals:
            began = time.process_time()
            result = corrected(posterior, proposals, y=task.y_obs, epsilon=epsilon, seed=0, progress=False)
            draws["corrected at y_obs"] = result.resample(n, torch.Generator().manual_seed(0))
            if covariance_supported(result.ess, task.dim_unconstrained):
                draws["corrected, smoothed at y_obs"] = smoothed_resample(
                    task, result.samples, result.weights, n, torch.Generator().manual_seed(0)
                )[0]
            extra = {"ess": round(result.ess), "cpu_s": round(time.process_time() - began, 1)}
        for kind, sample in draws.items():
            rows.append(
                {
                    "kind": kind,
                    "epsilon": epsilon,
                    **spread(sample),
                    "reference": spread(reference.samples),
                    "c2st": round(dpsbi.metrics.c2st(sample, reference.samples[:n], seed=0), 4),
                    **(extra if kind.startswith("corrected") else {}),
                }
            )
    return rows


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    done = set()
    if args.out.exists():
        done = {r["task"] for r in map(json.loads, args.out.read_text().splitlines()) if r.get("done")}
    for name in args.tasks:
        if name in done:
            continue
        task = build_task({"name": name, "epsilon": 1.0, **args.task_options})
        posterior, fit = amortized_fit(task, tuple(args.range), args, name, seed=args.seed)
        rows = curve(task, posterior, args.releases, args.draws)
        rows += at_stored(name, posterior, args.draws, args.reference, args.importance)
        rows.append({"kind": "fit", "seed": args.seed, **fit, "done": True})
        with args.out.open("a") as f:
            for row in rows:
                f.write(json.dumps({"task": name, **row}) + "\n")
                print(json.dumps({"task": name, **row}), flush=True)


def latest(paths: list[Path], keep: Callable[[dict], bool]) -> list[dict]:
    """The rows of ``paths`` that ``keep`` accepts, each task's from the last file holding any of them."""
    by_task = {}
    for path in paths:
        rows = [r for r in read_jsonl(path) if keep(r)]
        by_task.update({task: [r for r in rows if r["task"] == task] for task in {r["task"] for r in rows}})
    return [r for rows in by_task.values() for r in rows]


def is_separate_fit(row: dict) -> bool:
    """Whether ``row`` is the last round of a seed-0 ``frontier.py run --method sppe --defaults`` fit."""
    return bool(
        row.get("last") and row.get("schedule") == "defaults" and row["method"] == "sppe" and row["seed"] == 0
    )


def report(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = latest(args.files, lambda r: "kind" in r)
    separate = latest(args.files, is_separate_fit)
    tasks = [t for t in args.tasks if any(r["task"] == t for r in rows)]
    names = {t: build_task({"name": t, "epsilon": 1.0}).parameter_names for t in tasks}
    columns = max(len(names[t]) for t in tasks)
    fig, axes = plt.subplots(
        2 * len(tasks), columns, figsize=(3.6 * columns, 5.2 * len(tasks)), squeeze=False
    )
    print(
        "| task | epsilon | parameter | sd: amortized / corrected / separate / reference "
        "| 95 % width: amortized / corrected / separate / reference |"
    )
    print("|---|---|---|---|---|")
    for t, task in enumerate(tasks):
        line = [r for r in rows if r["task"] == task and r["kind"] == "curve"]
        stored = [r for r in rows if r["task"] == task and r["kind"] == "amortized at y_obs"]
        corrected = {r["epsilon"]: r for r in rows if r["task"] == task and r["kind"] == "corrected at y_obs"}
        fits = {r["epsilon"]: r for r in separate if r["task"] == task}
        for j, parameter in enumerate(names[task]):
            for i, key in enumerate(("sd", "width95")):
                ax = axes[2 * t + i, j]
                eps = [r["epsilon"] for r in line]
                mean = torch.tensor([r[key][j] for r in line])
                band = torch.tensor([r[f"{key}_spread"][j] for r in line])
                ax.plot(eps, mean, "-", color="C0", label="one amortized fit (mean over releases)")
                ax.fill_between(eps, mean - band, mean + band, color="C0", alpha=0.2)
                ax.plot(
                    [r["epsilon"] for r in stored],
                    [r[key][j] for r in stored],
                    "o",
                    color="C0",
                    label="amortized, stored release",
                )
                ax.plot(
                    list(corrected),
                    [r[key][j] for r in corrected.values()],
                    "D",
                    mfc="none",
                    color="C2",
                    label="amortized + importance sampling, stored release",
                )
                ax.plot(
                    [r["epsilon"] for r in stored],
                    [r["reference"][key][j] for r in stored],
                    "kx",
                    ms=9,
                    label="reference",
                )
                ax.plot(
                    list(fits),
                    [f[key][j] for f in fits.values()],
                    "s",
                    mfc="none",
                    color="C3",
                    label="separate fit (SPPE defaults)",
                )
                ax.set_xscale("log")
                ax.set_xlabel("epsilon")
                ax.set_title(
                    f"{task}: {parameter}, {'posterior sd' if key == 'sd' else '95 % interval width'}",
                    fontsize=9,
                )
        for r in stored:
            fit, fixed = fits.get(r["epsilon"]), corrected.get(r["epsilon"])
            for j, parameter in enumerate(names[task]):
                cells = [
                    " / ".join(
                        [
                            f"{r[key][j]:.3g}",
                            f"{fixed[key][j]:.3g}" if fixed else "-",
                            f"{fit[key][j]:.3g}" if fit else "-",
                            f"{r['reference'][key][j]:.3g}",
                        ]
                    )
                    for key in ("sd", "width95")
                ]
                print(f"| {task} | {r['epsilon']:g} | {parameter} | {cells[0]} | {cells[1]} |")
    axes[0, 0].legend(fontsize=7)
    for ax in axes.flat:
        if not ax.has_data():
            ax.set_visible(False)
    fig.tight_layout()
    if args.figure:
        fig.savefig(args.figure, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--tasks", nargs="+", default=["regression", "sir"])
    r.add_argument(
        "--releases", type=int, default=20, help="releases of the confidential summary per epsilon"
    )
    r.add_argument("--rounds", type=int, help="rounds of the fit (default: the library's)")
    r.add_argument(
        "--range",
        type=float,
        nargs=2,
        default=RANGE,
        metavar=("LOW", "HIGH"),
        help="the fit's epsilon range (default 0.1 10; the curve and stored releases stay within 0.1-10)",
    )
    r.add_argument("--draws", type=int, default=2000, help="posterior draws per release, and per C2ST")
    r.add_argument(
        "--overrides",
        type=json.loads,
        default={},
        help="SPPE arguments over the library's defaults as JSON (a smoke test: '{\"sims_per_round\": 50}')",
    )
    r.add_argument(
        "--task-options",
        type=json.loads,
        default={},
        help="the fitted task's options as JSON ('{\"simulator\": \"tau_leap\"}': SIR's approximate simulator); "
        "the references and stored releases stay the task's defaults",
    )
    r.add_argument(
        "--reference",
        type=json.loads,
        default={},
        help="reference settings over scripts/frontier.py's as JSON (a smoke test: "
        "'{\"importance_draws\": 20000}')",
    )
    r.add_argument(
        "--importance",
        type=int,
        default=0,
        help="also correct the draws at the stored releases by importance sampling with this many proposals",
    )
    r.add_argument(
        "--posteriors", type=Path, help="checkpoint and save each fit here; one saved there is scored again"
    )
    r.add_argument("--seed", type=int, default=0, help="the fits' seed")
    r.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("report")
    p.add_argument(
        "files",
        type=Path,
        nargs="+",
        help="run files and frontier.py --defaults files; a task's amortized rows, and its separate fits, each "
        "from the last file holding them",
    )
    p.add_argument("--tasks", nargs="+", default=["regression", "sir"])
    p.add_argument("--figure", type=Path)
    args = parser.parse_args()
    if args.command == "run" and not 0 < args.range[0] <= min(STORED) <= max(STORED) <= args.range[1]:
        parser.error(f"--range must hold the stored releases' epsilons {STORED}, got {args.range}")
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
