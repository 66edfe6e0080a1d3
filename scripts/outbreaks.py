"""Figures and the R0 table of the five real outbreaks from a finished sweep of ``experiment=sir_outbreaks``.

    python scripts/outbreaks.py multirun/outbreaks -o docs/figures/outbreaks

writes ``<out>_posteriors.png`` (draws of (log beta, log gamma) per outbreak and method), ``<out>_r0.png``
(median and 95 % credible interval of R0 = beta / gamma) and ``<out>_predictive.png`` (the observed curve with
the median and 90 % band of releases simulated from 500 posterior draws of each method), and prints the R0
table in markdown with the published ranges it is compared against.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from dpsbi.experiment.config import build_task  # noqa: E402
from dpsbi.experiment.outputs import read_draws  # noqa: E402

#: Outbreaks in the paper's order, with the published R0 ranges their intervals are compared against.
PUBLISHED = {
    "sir_influenza": (
        "influenza, boarding school",
        (3.0, 4.5),
        "SIR fits to the 1978 English boarding-school data give beta / gamma of about 3.5-4 (e.g. Murray, Mathematical Biology)",
    ),
    "sir_ebola_guinea": (
        "Ebola, Guinea",
        (1.44, 2.01),
        "WHO Ebola Response Team (NEJM 2014): 1.71 (95 % CI 1.44-2.01)",
    ),
    "sir_ebola_liberia": (
        "Ebola, Liberia",
        (1.72, 1.94),
        "WHO Ebola Response Team (NEJM 2014): 1.83 (1.72-1.94)",
    ),
    "sir_ebola_sierra_leone": (
        "Ebola, Sierra Leone",
        (1.79, 2.26),
        "WHO Ebola Response Team (NEJM 2014): 2.02 (1.79-2.26)",
    ),
    "sir_covid_clark": (
        "COVID-19, Clark County",
        (2.0, 3.5),
        "early SARS-CoV-2 estimates, mostly 2-3.5 (reviews of 2020 studies)",
    ),
}
PREDICTIVE_DRAWS = 500


def finished_runs(root: Path) -> list[tuple[str, str, Path, dict]]:
    """``(task name, method, final draws CSV, task config)`` of every finished run below ``root``."""
    out = []
    for config_path in sorted(root.glob("*/config.yaml")):
        config = OmegaConf.to_container(OmegaConf.load(config_path), resolve=False)
        task, method = config["task"], config["method"]["name"]
        draws = config_path.parent / method / "samples.csv"
        if draws.is_file() and task["name"] in PUBLISHED:
            out.append((task["name"], method, draws, task))
    return out


def interval(x: torch.Tensor, level: float) -> tuple[float, float, float]:
    """Median and central ``level`` interval of draws ``x (n,)``."""
    q = torch.quantile(x.double(), torch.tensor([0.5, (1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return float(q[0]), float(q[1]), float(q[2])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("-o", "--out", type=Path, required=True, help="figure path prefix")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    runs = finished_runs(args.sweep)
    if not runs:
        raise SystemExit(f"no finished outbreak runs (samples.csv) below {args.sweep}")
    outbreaks = [name for name in PUBLISHED if any(r[0] == name for r in runs)]
    methods = sorted({r[1] for r in runs})
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig_p, ax_p = plt.subplots(1, len(outbreaks), figsize=(3.0 * len(outbreaks), 3.0), squeeze=False)
    fig_y, ax_y = plt.subplots(1, len(outbreaks), figsize=(3.0 * len(outbreaks), 3.0), squeeze=False)
    fig_r, ax_r = plt.subplots(figsize=(6.5, 3.2))
    lines = [
        "| outbreak | method | R0 median | R0 95 % interval | published | agrees |",
        "|---|---|---|---|---|---|",
    ]
    for col, name in enumerate(outbreaks):
        label, (low, high), _ = PUBLISHED[name]
        ax_r.plot(
            [low, high],
            [col - 0.35, col - 0.35],
            color="k",
            lw=3,
            alpha=0.4,
            label="published" if col == 0 else None,
        )
        for i, (_, method, path, task_config) in enumerate(r for r in runs if r[0] == name):
            draws, _ = read_draws(path)
            ax_p[0][col].scatter(draws[:, 0], draws[:, 1], s=2, alpha=0.3, color=colors[method], label=method)
            r0 = torch.exp(draws[:, 0] - draws[:, 1])
            median, lo, hi = interval(r0, 0.95)
            agrees = "yes" if lo <= high and hi >= low else "no"
            lines.append(
                f"| {label} | {method} | {median:.2f} | {lo:.2f}-{hi:.2f} | {low:g}-{high:g} | {agrees} |"
            )
            y = col + 0.1 + 0.25 * i
            ax_r.plot([lo, hi], [y, y], color=colors[method], lw=1.5, label=method if col == 0 else None)
            ax_r.plot([median], [y], "o", color=colors[method], ms=3)
            task = build_task(task_config)
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
    ax_r.set_xlabel("R0 = beta / gamma (median, 95 % interval)")
    ax_r.legend(fontsize=6)
    for fig, suffix in ((fig_p, "posteriors"), (fig_y, "predictive"), (fig_r, "r0")):
        fig.tight_layout()
        fig.savefig(f"{args.out}_{suffix}.png", dpi=80)
        plt.close(fig)
    print("\n".join(lines))
    print("\npublished ranges: " + "; ".join(f"{PUBLISHED[n][0]}: {PUBLISHED[n][2]}" for n in outbreaks))


if __name__ == "__main__":
    main()
