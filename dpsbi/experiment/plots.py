"""Figures of a run and of a sweep, drawn with matplotlib's object API (no display needed)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor

#: Scatter points per sample set in the pair plot's off-diagonal panels.
SCATTER_POINTS = 500


def _marginals(ax, values: dict[str, Tensor], colors: dict[str, str], reference: str | None) -> None:
    """Histograms of each set's ``(n,)`` values on common bins; the height is capped at 1.5 times the
    ``reference`` set's peak, so that a collapsed (point-mass) posterior does not flatten the others."""
    pooled = torch.cat(list(values.values()))
    bins = torch.linspace(float(pooled.min()), float(pooled.max()) + 1e-9, 41).numpy()
    for label, v in values.items():
        heights, _, _ = ax.hist(
            v.numpy(), bins=bins, density=True, histtype="step", color=colors[label], label=label
        )
        if label == reference:
            ax.set_ylim(0, 1.5 * float(heights.max()))


def pair_plot(
    draws: dict[str, Tensor],
    names: Sequence[str],
    path: Path,
    truth: Tensor | None = None,
    reference: str | None = "reference",
) -> None:
    """Pair plot of several sample sets ``{label: (n, d)}``: marginal histograms on the diagonal, scatter
    plots below it, the true parameter ``truth (1, d)`` as lines and a star. The diagonal's height is set by
    the set labelled ``reference`` when there is one."""
    d = len(names)
    fig = Figure(figsize=(2.4 * d + 1, 2.4 * d))
    axes = fig.subplots(d, d, squeeze=False)
    colors = {label: f"C{i}" for i, label in enumerate(draws)}
    draws = {label: x.detach().cpu().double() for label, x in draws.items()}
    true = truth.reshape(-1).tolist() if truth is not None else None
    for i in range(d):
        for j in range(d):
            ax = axes[i, j]
            if j > i:
                ax.set_axis_off()
                continue
            if i == j:
                _marginals(ax, {label: x[:, i] for label, x in draws.items()}, colors, reference)
            for label, x in draws.items():
                if i != j:
                    sub = x[:SCATTER_POINTS]
                    ax.scatter(sub[:, j].numpy(), sub[:, i].numpy(), s=3, alpha=0.35, color=colors[label])
            if true is not None:
                ax.axvline(true[j], color="k", lw=0.8, ls="--")
                if i != j:
                    ax.axhline(true[i], color="k", lw=0.8, ls="--")
                    ax.plot(true[j], true[i], "k*", ms=8)
            ax.set_xlabel(names[j] if i == d - 1 else "")
            ax.set_ylabel(names[i] if j == 0 and i > 0 else "")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(
        handles, labels, loc="upper right" if d > 1 else "upper center", ncols=1 if d > 1 else len(labels)
    )
    fig.tight_layout(rect=(0, 0, 1, 1 if d > 1 else 0.88))
    fig.savefig(path, dpi=110)


def metrics_plot(rows: list[dict], metrics: Sequence[str], path: Path) -> None:
    """Each metric against the number of simulations, one line per method (rows: per-round metrics)."""
    metrics = [m for m in metrics if any(row.get(m) is not None for row in rows)]
    if not metrics:
        return
    fig = Figure(figsize=(3.6 * len(metrics), 3.2))
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    by_method = defaultdict(list)
    for row in rows:
        by_method[row["method"]].append(row)
    for ax, metric in zip(axes, metrics):
        for method, points in by_method.items():
            xs = [p["num_simulations"] for p in points if p.get(metric) is not None]
            ax.plot(xs, [p[metric] for p in points if p.get(metric) is not None], "o-", label=method)
        ax.set_xscale("log")
        ax.set_xlabel("simulations")
        ax.set_title(metric)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _symlog_if_collapsed(ax, nlogs: list[float]) -> None:
    """A symlog axis when a collapsed method's NLOG (~1e15) would flatten every other method's."""
    if nlogs and max(map(abs, nlogs)) > 1e4:
        ax.set_yscale("symlog", linthresh=10)
        ax.set_ylim(bottom=min(nlogs) - 1)


def comparison_plot(rows: list[dict], metrics: Sequence[str], path: Path) -> None:
    """A sweep's final metrics: one panel per (task, metric), one line per method against epsilon (log
    scale) when the sweep varies epsilon, else one point per run."""
    metrics = [m for m in metrics if any(row.get(m) is not None for row in rows)]
    tasks = list(dict.fromkeys(row["task"] for row in rows))
    if not metrics or not tasks:
        return
    fig = Figure(figsize=(3.6 * len(metrics), 3.2 * len(tasks)))
    axes = fig.subplots(len(tasks), len(metrics), squeeze=False)
    for t, task in enumerate(tasks):
        runs = [row for row in rows if row["task"] == task]
        epsilons = {row.get("epsilon") for row in runs}
        by_method = defaultdict(list)
        for row in runs:
            by_method[row["method"]].append(row)
        for m, metric in enumerate(metrics):
            ax = axes[t, m]
            for i, (method, points) in enumerate(by_method.items()):
                points = sorted(
                    (p for p in points if p.get(metric) is not None), key=lambda p: p.get("epsilon") or 0
                )
                if len(epsilons) > 1:
                    ax.plot([p["epsilon"] for p in points], [p[metric] for p in points], "o-", label=method)
                else:
                    ax.plot([i] * len(points), [p[metric] for p in points], "o", label=method)
            if len(epsilons) > 1:
                ax.set_xscale("log")
                ax.set_xlabel("epsilon")
            else:
                ax.set_xticks(range(len(by_method)), list(by_method), rotation=30)
            if metric == "nlog":
                _symlog_if_collapsed(ax, [row["nlog"] for row in runs if row.get("nlog") is not None])
            ax.set_title(f"{task}: {metric}")
        axes[t, 0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
