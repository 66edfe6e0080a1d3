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


#: Release coordinates drawn as one histogram panel each; a longer release is drawn as intervals in one panel.
PPC_PANELS = 12


def ppc_plot(
    task,
    draws: Tensor | dict[str, Tensor],
    path: Path,
    y: Tensor | None = None,
    num_releases: int = 500,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Posterior predictive check: releases simulated from the first ``num_releases`` posterior draws
    (``task.simulate_release``: ``task.simulate``, then ``task.mechanism.sample``, one release per draw) against
    the observed release ``y`` (default ``task.y_obs``; none drawn when there is none). ``draws`` is one set
    ``(n, dim_theta)`` or several ``{label: (n, dim_theta)}``, drawn in their own colours.

    A release of up to :data:`PPC_PANELS` coordinates gets a panel per coordinate: the histogram of each set's
    simulated values, the observed value as a black line. A longer release gets one panel: per coordinate, each
    set's median and central 50% and 90% intervals of the simulated values, the observed values as black dots.
    Saved to ``path``; returns each set's predictive tail probabilities ``P(y_sim <= y_obs) (dim_s,)`` (empty
    without an observed release): values near 0 or 1 flag coordinates that the posterior does not reproduce."""
    sets = {"posterior": draws} if torch.is_tensor(draws) else dict(draws)
    observed = task.y_obs if y is None else task.check_release(y)
    observed = None if observed is None else observed.detach().cpu().double().reshape(-1)
    simulated = {
        label: task.simulate_release(
            x[:num_releases].detach().to(task.prior.mean.device, torch.get_default_dtype()),
            generator=generator,
        )
        .cpu()
        .double()
        for label, x in sets.items()
    }
    colors = {label: f"C{i}" for i, label in enumerate(simulated)}
    dim = task.dim_s
    if dim <= PPC_PANELS:
        cols = min(dim, 4)
        rows = -(-dim // cols)
        fig = Figure(figsize=(3.2 * cols, 2.6 * rows + 0.4))
        axes = fig.subplots(rows, cols, squeeze=False).reshape(-1)
        for j in range(dim):
            ax = axes[j]
            pooled = torch.cat([s[:, j] for s in simulated.values()])
            low, high = float(pooled.min()), float(pooled.max())
            if observed is not None:
                low, high = min(low, float(observed[j])), max(high, float(observed[j]))
            bins = torch.linspace(low, high + 1e-9 * max(1.0, abs(high)), 31).numpy()
            for label, s in simulated.items():
                ax.hist(
                    s[:, j].numpy(),
                    bins=bins,
                    density=True,
                    histtype="step",
                    color=colors[label],
                    label=label,
                )
            if observed is not None:
                ax.axvline(float(observed[j]), color="k", lw=1.2, label="observed")
            tail = (
                ""
                if observed is None or len(simulated) > 1
                else f": P(sim <= obs) = {float((next(iter(simulated.values()))[:, j] <= observed[j]).double().mean()):.2f}"
            )
            ax.set_title(f"release[{j}]{tail}", fontsize=9)
            ax.set_yticks([])
        for ax in axes[dim:]:
            ax.set_axis_off()
    else:
        fig = Figure(figsize=(min(0.35 * dim + 2.5, 16), 3.6))
        ax = fig.subplots()
        index = torch.arange(dim, dtype=torch.float64)
        width = 0.6 / len(simulated)
        for i, (label, s) in enumerate(simulated.items()):
            q = torch.quantile(s, torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=s.dtype), dim=0)
            x = (index - 0.3 + width * (i + 0.5)).numpy()
            ax.vlines(
                x, q[0].numpy(), q[4].numpy(), color=colors[label], lw=1, label=f"{label}: 90%, 50%, median"
            )
            ax.vlines(x, q[1].numpy(), q[3].numpy(), color=colors[label], lw=4, alpha=0.6)
            ax.plot(x, q[2].numpy(), "_", color=colors[label], ms=8)
        if observed is not None:
            ax.plot(index.numpy(), observed.numpy(), "k.", ms=7, label="observed")
        ax.set_xlabel("release coordinate")
        ax.set_xticks(index.numpy()[:: max(1, dim // 20)])
        axes = [ax]
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncols=len(labels), fontsize=8)
    fig.suptitle(f"posterior predictive check: {task.name}", y=0.0, va="bottom", fontsize=9)
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, 0.25 / height, 1, 1 - 0.3 / height))
    fig.savefig(path, dpi=110)
    if observed is None:
        return {label: torch.empty(0, dtype=torch.float64) for label in simulated}
    return {label: (s <= observed).double().mean(0) for label, s in simulated.items()}
