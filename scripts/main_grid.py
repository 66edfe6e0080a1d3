"""The main table of docs/RESULTS.md: every paper task x epsilon x method x seed of ``scripts/results_grid.sh``.

    python scripts/main_grid.py collect multirun/grid --out results/main_grid.jsonl
    python scripts/main_grid.py report results/main_grid.jsonl --figure docs/figures/main_grid.png

``collect`` writes one row per finished run below the given directories (its final metrics, seed, wall and CPU time, and when it
first reached C2ST <= 0.55), replacing the row of the same cell (task, epsilon, method, seed) already in the file,
whichever sweep directory either ran in; ``report`` prints the table, mean and
spread over seeds per task, epsilon and method, and draws C2ST against CPU time; ``report --runs`` prints one row
per run with each parameter's sd and 95 % width against the reference's (several rows files: a column names
each run's), its figure each run's sd ratio against epsilon.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from frontier import read_jsonl  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from dpsbi.experiment.comparison import collect as final_rows  # noqa: E402
from dpsbi.experiment.outputs import SUMMARY_COLUMNS, read_rows  # noqa: E402
from dpsbi.files import atomic_write_text  # noqa: E402

BAR = 0.55
#: Per-parameter columns a run records (``sd_ratio[log_beta]``, ...): kept by ``collect``, shown by ``report --runs``.
PER_PARAMETER = ("sd_ratio[", "width95_ratio[")
METHODS = ("sppe", "sple", "naive_npe", "da_mcmc", "smc_abc")


def first_at_bar(rounds: list[dict]) -> float | None:
    """CPU seconds of the first round whose C2ST is at most :data:`BAR`; ``None`` if none is."""
    return next((r.get("cpu_time") for r in rounds if r.get("c2st", 1.0) <= BAR), None)


def run_rows(sweep: Path) -> list[dict]:
    """One row per finished run below ``sweep`` (a sweep directory, or a folder of them)."""
    out = []
    for row in final_rows(sweep):
        run = sweep / row["run"]
        rounds = read_rows(run / row["method"] / "rounds.json")
        seed = int(OmegaConf.load(run / "config.yaml").seed)
        kept = {k: v for k, v in row.items() if k in SUMMARY_COLUMNS or k.startswith(PER_PARAMETER)}
        out.append(
            {**kept, "seed": seed, "cpu_at_bar": first_at_bar(rounds), "run": f"{sweep.name}/{row['run']}"}
        )
    return out


def cell(row: dict) -> tuple:
    """A run's cell of the grid: task, epsilon, method and seed (one row each in the rows file)."""
    return row["task"], float(row["epsilon"]), row["method"], row["seed"]


def collect(sweeps: list[Path], path: Path) -> None:
    """Add the finished runs of ``sweeps`` to the JSON-lines file ``path``; a run replaces the row of its cell
    (:func:`cell`), so a grid rerun into other sweep directories counts each seed once."""
    rows = {cell(r): r for r in read_jsonl(path)} if path.is_file() else {}
    rows.update({cell(r): r for sweep in sweeps for r in run_rows(sweep)})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in sorted(rows.values(), key=key)))
    print(f"{len(rows)} runs in {path}")


def key(row: dict) -> tuple:
    """Sort order: task, epsilon, method (in :data:`METHODS` order), seed."""
    method = METHODS.index(row["method"]) if row["method"] in METHODS else len(METHODS)
    return row["task"], float(row["epsilon"]), method, row["method"], row["seed"]


def spread(values: list[float], digits: str) -> str:
    """``mean ± sd`` (``mean`` alone for one value)."""
    if len(values) == 1:
        return format(values[0], digits)
    return f"{format(statistics.mean(values), digits)} ± {format(statistics.stdev(values), digits)}"


def groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows grouped by (task, epsilon, method), in :func:`key` order."""
    out: dict[tuple, list[dict]] = {}
    for row in sorted(rows, key=key):
        out.setdefault((row["task"], float(row["epsilon"]), row["method"]), []).append(row)
    return out


def table(rows: list[dict]) -> str:
    """Markdown table: per task, epsilon and method, seeds, C2ST and MMD (mean ± sd), CPU and wall seconds
    (mean), simulations, and how many seeds reached C2ST <= 0.55 (and at how many CPU seconds, mean); where the
    runs recorded it, the posterior sd over the reference's (``sd_ratio``, the mean over parameters; mean ± sd)."""
    ratios = any("sd_ratio" in r for r in rows)
    lines = [
        "| task | epsilon | method | seeds | C2ST | MMD | CPU s | wall s | simulations | at C2ST <= 0.55 (CPU s) |"
        + (" sd ratio |" if ratios else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if ratios else ""),
    ]
    for (task, epsilon, method), group in groups(rows).items():
        reached = [r["cpu_at_bar"] for r in group if r["cpu_at_bar"] is not None]
        at_bar = f"{len(reached)} of {len(group)}" + (f" ({statistics.mean(reached):.0f})" if reached else "")
        recorded = [r["sd_ratio"] for r in group if "sd_ratio" in r]
        lines.append(
            f"| {task} | {epsilon:g} | {method} | {', '.join(str(r['seed']) for r in group)} | "
            f"{spread([r['c2st'] for r in group], '.3f')} | {spread([r['mmd'] for r in group], '.2g')} | "
            f"{statistics.mean(r['cpu_time'] for r in group):.0f} | {statistics.mean(r['wall_time'] for r in group):.0f} | "
            f"{group[0]['num_simulations']} | {at_bar} |"
            + ((f" {spread(recorded, '.2f')} |" if recorded else " - |") if ratios else "")
        )
    return "\n".join(lines)


def parameter_names(rows: list[dict]) -> list[str]:
    """The parameters whose sd ratio some row records (``sd_ratio[name]``), in first-seen order."""
    prefix = PER_PARAMETER[0]
    return list(dict.fromkeys(k[len(prefix) : -1] for r in rows for k in r if k.startswith(prefix)))


def run_table(rows: list[dict]) -> str:
    """Markdown table, one row per run: its rows file (``source``, where several were read), task, epsilon,
    method, seed, C2ST, CPU seconds, and each parameter's posterior sd and central 95 % width over the
    reference's (where the run recorded them)."""
    names, sources = parameter_names(rows), any("source" in r for r in rows)

    def ratios(row: dict, metric: str) -> str:
        return ", ".join(
            format(row[f"{metric}[{n}]"], ".2f") if f"{metric}[{n}]" in row else "-" for n in names
        )

    lines = [
        ("| rows " if sources else "")
        + f"| task | epsilon | method | seed | C2ST | CPU s | sd ratio ({', '.join(names)}) | 95 % width ratio |",
        ("|---" if sources else "") + "|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda r: (r.get("source", ""), *key(r))):
        lines.append(
            (f"| {row['source']} " if sources else "")
            + f"| {row['task']} | {float(row['epsilon']):g} | {row['method']} | {row['seed']} | {row['c2st']:.3f} | "
            f"{row['cpu_time']:.0f} | {ratios(row, 'sd_ratio')} | {ratios(row, 'width95_ratio')} |"
        )
    return "\n".join(lines)


def plot_ratios(rows: list[dict], path: Path) -> None:
    """One panel per parameter: each run's posterior sd over the reference's against epsilon, colored by its
    rows file (or method); shaded: within 15 %."""
    names = parameter_names(rows)
    groups_of = sorted({r.get("source", r["method"]) for r in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 2.8), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], names):
        for i, group in enumerate(groups_of):
            runs = [r for r in rows if r.get("source", r["method"]) == group and f"sd_ratio[{name}]" in r]
            x = [float(r["epsilon"]) * 1.08 ** (i - (len(groups_of) - 1) / 2) for r in runs]
            ax.scatter(x, [r[f"sd_ratio[{name}]"] for r in runs], s=14, color=f"C{i}", label=group)
        ax.axhspan(0.85, 1.15, color="k", alpha=0.08)
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("epsilon")
    axes[0][0].set_ylabel("posterior sd / reference's")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)


def plot(rows: list[dict], path: Path) -> None:
    """One panel per task and epsilon: each run's final C2ST against its CPU seconds, colored by method."""
    cells = sorted({(r["task"], float(r["epsilon"])) for r in rows})
    colors = {m: f"C{i}" for i, m in enumerate(METHODS)}
    fig, axes = plt.subplots(1, len(cells), figsize=(2.6 * len(cells), 2.8), squeeze=False, sharey=True)
    for ax, (task, epsilon) in zip(axes[0], cells):
        for (t, e, method), group in groups(rows).items():
            if (t, e) == (task, epsilon):
                x, y = [r["cpu_time"] for r in group], [r["c2st"] for r in group]
                ax.scatter(x, y, s=14, color=colors.get(method, "k"), label=method)
        ax.axhline(BAR, color="k", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{task}, epsilon {epsilon:g}", fontsize=8)
        ax.set_xlabel("CPU seconds")
    axes[0][0].set_ylabel("C2ST (0.5 = exact)")
    handles = {label: h for ax in axes[0] for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), fontsize=7, loc="center right")
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    save(fig, path)


def save(fig: plt.Figure, path: Path) -> None:
    """Write ``fig`` to ``path`` (its folder made) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    c = commands.add_parser("collect", help="add the finished runs below directories to a rows file")
    c.add_argument("sweeps", nargs="+", type=Path)
    c.add_argument("--out", type=Path, required=True)
    r = commands.add_parser("report", help="the table (and figure) from rows files")
    r.add_argument("rows", type=Path, nargs="+")
    r.add_argument("--figure", type=Path)
    r.add_argument(
        "--runs",
        action="store_true",
        help="one row per run, with each parameter's sd and width ratio (the figure: sd ratio against epsilon)",
    )
    args = parser.parse_args(argv)
    if args.command == "collect":
        collect(args.sweeps, args.out)
        return
    rows = [
        {**row, **({"source": path.stem} if len(args.rows) > 1 else {})}
        for path in args.rows
        for row in read_jsonl(path)
    ]
    if args.runs and not parameter_names(rows):
        parser.error(
            "report --runs: no run in these rows records per-parameter sd ratios (sd_ratio[name]); collect them again"
        )
    print(run_table(rows) if args.runs else table(rows))
    if args.figure:
        (plot_ratios if args.runs else plot)(rows, args.figure)


if __name__ == "__main__":
    main()
