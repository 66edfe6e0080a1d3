"""The five real outbreaks: the R0 table and figures of a finished ``experiment=sir_outbreaks`` sweep, and the
deterministic SIR's least-squares R0 under several initial conditions.

    python scripts/outbreaks.py report multirun/outbreaks -o docs/figures/outbreaks
    python scripts/outbreaks.py deterministic

``report`` writes ``<out>_posteriors.png`` (draws of (log beta, log gamma) per outbreak and method),
``<out>_r0.png`` (median and 95 % credible interval of R0 = beta / gamma) and ``<out>_predictive.png`` (the
observed curve with the median and 90 % band of releases simulated from 500 posterior draws of each method), and
prints the R0 table in markdown: whether the published point estimate lies inside each 95 % interval, beside the
deterministic SIR's least-squares R0 for the same initial condition (model error apart from method error). Runs
scored against a reference (``experiment=sir_outbreaks_private``: the curves privatized, with their exact
posteriors stored) add the reference's R0 and the method's C2ST against it.
``deterministic`` prints that least-squares R0 for initial infected fractions 1e-3 (the curves' placeholder
first point taken as data) and 1 / K for K = 10^4, 10^5 (the paper's) and 10^6: how much the initial condition
and the population size, not the data, set R0.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from scipy.optimize import least_squares  # noqa: E402

from dpsbi.experiment.config import build_task  # noqa: E402
from dpsbi.experiment.outputs import read_draws, read_rows  # noqa: E402
from dpsbi.tasks.sir import OUTBREAKS, TIMES  # noqa: E402

#: Outbreaks in the paper's order: label, published R0 point estimate and range, and where they come from (as
#: recalled from the literature, not re-derived here).
PUBLISHED = {
    "sir_influenza": (
        "influenza, boarding school",
        3.78,
        (3.0, 4.5),
        "SIR fits to the 1978 English boarding-school data: Murray, Mathematical Biology (r S0 / a = 3.78); "
        "other fits 3-4.5",
    ),
    "sir_ebola_guinea": (
        "Ebola, Guinea",
        1.71,
        (1.44, 2.01),
        "WHO Ebola Response Team (NEJM 2014): 1.71 (95 % CI 1.44-2.01)",
    ),
    "sir_ebola_liberia": (
        "Ebola, Liberia",
        1.83,
        (1.72, 1.94),
        "WHO Ebola Response Team (NEJM 2014): 1.83 (1.72-1.94)",
    ),
    "sir_ebola_sierra_leone": (
        "Ebola, Sierra Leone",
        2.02,
        (1.79, 2.26),
        "WHO Ebola Response Team (NEJM 2014): 2.02 (1.79-2.26)",
    ),
    "sir_covid_clark": (
        "COVID-19, Clark County",
        2.5,
        (2.0, 3.5),
        "early SARS-CoV-2 estimates, mostly 2-3.5 (reviews of 2020 studies); 2.5 is a common central value, "
        "not one study's",
    ),
}
#: The main paper's own reading of its outbreak fits (Sec. 4, "Real disease outbreaks").
PAPER_STATEMENT = (
    "Our estimates using privatized data are consistent with common estimates of R0 for these diseases "
    "(Eisenberg, 2020), with the exception of the flu outbreak (which should be modeled by the SI model instead "
    "of SIR)."
)
#: Initial infected fractions of the deterministic table: the placeholder first point taken as data, and 1 / K.
INITIAL_FRACTIONS = {"first point (1e-3)": 1e-3, "K = 1e4": 1e-4, "K = 1e5 (paper)": 1e-5, "K = 1e6": 1e-6}
PREDICTIVE_DRAWS = 500


def deterministic_curves(
    log_beta: np.ndarray, log_gamma: np.ndarray, i0: float, times: list[float], dt: float = 0.1
) -> np.ndarray:
    """Infected fraction of the deterministic SIR ``s' = -beta s i, i' = beta s i - gamma i`` started at
    ``(1 - i0, i0)``, at ``times`` (from 0, equally spaced), for parameter arrays of one shape ``(...)``:
    ``(..., len(times))``. Classical RK4 with steps of about ``dt``."""
    beta, gamma = np.exp(log_beta), np.exp(log_gamma)
    s, i = np.full(beta.shape, 1.0 - i0), np.full(beta.shape, i0)
    steps = max(1, math.ceil((times[1] - times[0]) / dt))
    h = (times[1] - times[0]) / steps

    def slope(s, i):
        infection = beta * s * i
        return np.stack([-infection, infection - gamma * i])

    out = [i]
    for _ in times[1:]:
        for _ in range(steps):
            state = np.stack([s, i])
            k1 = slope(*state)
            k2 = slope(*(state + h / 2 * k1))
            k3 = slope(*(state + h / 2 * k2))
            k4 = slope(*(state + h * k3))
            s, i = state + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        out.append(i)
    return np.stack(out, axis=-1)


def least_squares_r0(curve: list[float], i0: float, times: list[float] = TIMES) -> tuple[float, float]:
    """The deterministic SIR's least-squares fit to an observed infected-fraction ``curve`` (its first point,
    the initial condition, left out): ``(R0 = beta / gamma, residual sum of squares)``. A grid over
    (log beta, log gamma) in [-5, 1.5] x [-6, 0] finds the basin, ``scipy.optimize.least_squares`` refines it."""
    y = np.asarray(curve, dtype=float)
    grid = np.meshgrid(np.linspace(-5.0, 1.5, 66), np.linspace(-6.0, 0.0, 61))
    with np.errstate(over="ignore", invalid="ignore"):
        rss = ((deterministic_curves(*grid, i0, times)[..., 1:] - y[1:]) ** 2).sum(-1)
    start = np.unravel_index(np.nanargmin(rss), rss.shape)

    def residuals(p: np.ndarray) -> np.ndarray:
        return deterministic_curves(np.array(p[0]), np.array(p[1]), i0, times, dt=0.02)[1:] - y[1:]

    fit = least_squares(residuals, [grid[0][start], grid[1][start]])
    return math.exp(fit.x[0] - fit.x[1]), float(2 * fit.cost)


def deterministic(names: list[str], fractions: list[str]) -> None:
    """Print the deterministic SIR's least-squares R0 per outbreak (task ``names``) and initial infected
    fraction (keys of :data:`INITIAL_FRACTIONS`)."""
    lines = [
        "| outbreak | published | " + " | ".join(f"LS R0, i0 {k}" for k in fractions) + " |",
        "|" + "---|" * (2 + len(fractions)),
    ]
    for name in names:
        label, point, _, _ = PUBLISHED[name]
        curve = OUTBREAKS[name.removeprefix("sir_")]
        fits = [least_squares_r0(curve, INITIAL_FRACTIONS[k]) for k in fractions]
        cells = " | ".join(f"{r0:.2f} (rss {rss:.4f})" for r0, rss in fits)
        lines.append(f"| {label} | {point:g} | {cells} |")
    print("\n".join(lines))


def finished_runs(root: Path) -> list[tuple[str, str, Path, dict]]:
    """``(task name, method, run directory, task config)`` of every finished run below ``root``."""
    out = []
    for config_path in sorted(root.glob("*/config.yaml")):
        config = OmegaConf.to_container(OmegaConf.load(config_path), resolve=False)
        task, method = config["task"], config["method"]["name"]
        if (config_path.parent / method / "samples.csv").is_file() and task["name"] in PUBLISHED:
            out.append((task["name"], method, config_path.parent, task))
    return out


def r0_interval(draws: torch.Tensor) -> tuple[float, float, float]:
    """Median and central 95 % interval of R0 = beta / gamma over draws ``(n, 2)`` of (log beta, log gamma)."""
    return interval(torch.exp(draws[:, 0] - draws[:, 1]), 0.95)


def scored(run: Path, method: str) -> tuple[str, str]:
    """The reference's R0 (median and 95 % interval) and the C2ST of the method's last scored round against it,
    as table cells (``-`` where the run has no reference or no C2ST)."""
    if not (run / "reference.csv").is_file():
        return "-", "-"
    reference, _ = read_draws(run / "reference.csv")
    median, lo, hi = r0_interval(reference)
    rows = read_rows(run / method / "rounds.json") if (run / method / "rounds.json").is_file() else []
    c2st = rows[-1].get("c2st") if rows else None
    return f"{median:.2f} ({lo:.2f}-{hi:.2f})", "-" if c2st is None else f"{c2st:.3f}"


def interval(x: torch.Tensor, level: float) -> tuple[float, float, float]:
    """Median and central ``level`` interval of draws ``x (n,)``."""
    q = torch.quantile(x.double(), torch.tensor([0.5, (1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return float(q[0]), float(q[1]), float(q[2])


def report(sweeps: list[Path], out: Path) -> None:
    """The R0 table and the three figures of the finished outbreak runs below ``sweeps`` (figures at
    ``out_*``)."""
    torch.manual_seed(0)
    runs = [run for sweep in sweeps for run in finished_runs(sweep)]
    if not runs:
        raise SystemExit(f"no finished outbreak runs (samples.csv) below {' '.join(map(str, sweeps))}")
    outbreaks = [name for name in PUBLISHED if any(r[0] == name for r in runs)]
    methods = sorted({r[1] for r in runs})
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    out.parent.mkdir(parents=True, exist_ok=True)
    fig_p, ax_p = plt.subplots(1, len(outbreaks), figsize=(3.0 * len(outbreaks), 3.0), squeeze=False)
    fig_y, ax_y = plt.subplots(1, len(outbreaks), figsize=(3.0 * len(outbreaks), 3.0), squeeze=False)
    fig_r, ax_r = plt.subplots(figsize=(6.5, 3.2))
    lines = [
        "| outbreak | method | R0 median | R0 95 % interval | published | published point inside | "
        "deterministic SIR, least squares | exact posterior's R0 | C2ST against it |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for col, name in enumerate(outbreaks):
        label, point, (low, high), _ = PUBLISHED[name]
        ax_r.plot(
            [low, high], [col - 0.35] * 2, color="k", lw=3, alpha=0.4, label="published" if col == 0 else None
        )
        ax_r.plot([point], [col - 0.35], "k|", ms=8)
        for i, (_, method, run, task_config) in enumerate(r for r in runs if r[0] == name):
            draws, _ = read_draws(run / method / "samples.csv")
            ax_p[0][col].scatter(draws[:, 0], draws[:, 1], s=2, alpha=0.3, color=colors[method], label=method)
            median, lo, hi = r0_interval(draws)
            task = build_task(task_config)
            i0 = task_config.get("initial_infected", 1) / task_config.get("population", 100_000)
            ls_r0, _ = least_squares_r0(task.y_obs[0].tolist(), i0)
            inside = "yes" if lo <= point <= hi else "no"
            lines.append(
                f"| {label} | {method} | {median:.2f} | {lo:.2f}-{hi:.2f} | {point:g} ({low:g}-{high:g}) | "
                f"{inside} | {ls_r0:.2f} (i0 {i0:.0e}) | {' | '.join(scored(run, method))} |"
            )
            y = col + 0.1 + 0.25 * i
            ax_r.plot([lo, hi], [y, y], color=colors[method], lw=1.5, label=method if col == 0 else None)
            ax_r.plot([median], [y], "o", color=colors[method], ms=3)
            theta = draws[torch.randperm(draws.shape[0])[:PREDICTIVE_DRAWS]]
            releases = task.simulate_release(theta, torch.Generator().manual_seed(0))
            q = torch.quantile(releases.double(), torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64), dim=0)
            t = torch.arange(releases.shape[1])
            ax_y[0][col].fill_between(t, q[0], q[2], color=colors[method], alpha=0.2)
            ax_y[0][col].plot(t, q[1], color=colors[method], label=f"{method}: median, 90 %")
        observed = build_task(next(r[3] for r in runs if r[0] == name)).y_obs[0]
        ax_y[0][col].plot(torch.arange(observed.numel()), observed, "k.-", label="observed")
        for ax, xlabel, ylabel in (
            (ax_p[0][col], "log beta", "log gamma"),
            (ax_y[0][col], "observation", "infected fraction"),
        ):
            ax.set_title(label, fontsize=8)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
    ax_p[0][0].legend(fontsize=6, markerscale=4)
    ax_y[0][0].legend(fontsize=6)
    ax_r.set_yticks(range(len(outbreaks)), [PUBLISHED[n][0] for n in outbreaks], fontsize=7)
    ax_r.set_xscale("log")
    ax_r.set_xlabel("R0 = beta / gamma (median, 95 % interval; grey: published)")
    ax_r.legend(fontsize=6)
    for fig, suffix in ((fig_p, "posteriors"), (fig_y, "predictive"), (fig_r, "r0")):
        fig.tight_layout()
        fig.savefig(f"{out}_{suffix}.png", dpi=80)
        plt.close(fig)
    print("\n".join(lines))
    print("\npublished: " + "; ".join(f"{PUBLISHED[n][0]}: {PUBLISHED[n][3]}" for n in outbreaks))
    print(f"\nthe main paper: {PAPER_STATEMENT}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("report", help="the R0 table and figures of a finished sweep")
    r.add_argument("sweeps", nargs="+", type=Path)
    r.add_argument("-o", "--out", type=Path, required=True, help="figure path prefix")
    d = commands.add_parser(
        "deterministic", help="least-squares R0 of the deterministic SIR per initial condition"
    )
    d.add_argument("--outbreaks", nargs="+", choices=list(PUBLISHED), default=list(PUBLISHED))
    d.add_argument("--fractions", nargs="+", choices=list(INITIAL_FRACTIONS), default=list(INITIAL_FRACTIONS))
    args = parser.parse_args(argv)
    if args.command == "report":
        report(args.sweeps, args.out)
    else:
        deterministic(args.outbreaks, args.fractions)


if __name__ == "__main__":
    main()
