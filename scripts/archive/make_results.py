"""Tables and figures of docs/RESULTS.md from finished sweeps (``dpsbi-run -m ... hydra.sweep.dir=DIR``).

python scripts/archive/make_results.py table DIR [DIR ...]                 markdown table of every run's final metrics
python scripts/archive/make_results.py comparison DIR -o docs/figures/x.png  the sweep's comparison figure
python scripts/archive/make_results.py privacy DIR -o docs/figures/x.png     marginals of reference and SPPE draws
                                                                      at every epsilon of the sweep
python scripts/archive/make_results.py bias DIR --epsilon 1 -o docs/figures/x.png   NaiveNPE against the reference:
                                                                      standardized mean error per parameter
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from dpsbi.experiment.comparison import collect  # noqa: E402
from dpsbi.experiment.config import METRICS  # noqa: E402
from dpsbi.experiment.outputs import read_draws  # noqa: E402
from dpsbi.experiment.plots import comparison_plot  # noqa: E402

COLUMNS = ("task", "epsilon", "reference", "method", "num_simulations", "wall_time", "ess", *METRICS)


def ess(run: Path, method: str) -> float | None:
    """A baseline's effective sample size: Kish's of its weights, or the smallest per-parameter MCMC ESS in
    its ``info``; ``None`` for neural methods (their draws are independent)."""
    path = run / method / "result.pt"
    if not path.is_file():
        return None
    result = torch.load(path, map_location="cpu", weights_only=False)
    if result.get("weights") is not None:
        return float(1.0 / (result["weights"].double() ** 2).sum())
    chain_ess = result.get("info", {}).get("ess")
    return None if chain_ess is None else float(torch.as_tensor(chain_ess).min())


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def table(roots: list[Path]) -> str:
    """Markdown table of the final row of every run below ``roots``, sorted by task, epsilon and method."""
    rows = [{**r, "ess": ess(root / r["run"], r["method"])} for root in roots for r in collect(root)]
    rows.sort(key=lambda r: (r["task"], float(r["epsilon"]), r["method"]))
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def runs(root: Path, method: str) -> dict[float, Path]:
    """Run directory of ``method`` at each epsilon below a sweep directory."""
    return {float(r["epsilon"]): root / r["run"] for r in collect(root) if r["method"] == method}


def privacy(root: Path, method: str, out: Path) -> str:
    """One panel per parameter: reference (solid) and ``method`` (dashed) marginals at every epsilon; returns
    a markdown table of the reference posterior's mean and sd per parameter at each epsilon."""
    by_eps = dict(sorted(runs(root, method).items()))
    names = read_draws(next(iter(by_eps.values())) / "reference.csv")[1]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 2.8), squeeze=False)
    lines = [
        "| epsilon | " + " | ".join(f"{n}: mean, sd" for n in names) + " |",
        "|" + "---|" * (len(names) + 1),
    ]
    for color, (eps, run) in zip(("C0", "C1", "C2", "C3"), by_eps.items()):
        reference, _ = read_draws(run / "reference.csv")
        draws, _ = read_draws(run / method / "samples.csv")
        lines.append(
            f"| {eps:g} | "
            + " | ".join(
                f"{float(m):.3g}, {float(v):.3g}" for m, v in zip(reference.mean(0), reference.std(0))
            )
            + " |"
        )
        for i, ax in enumerate(axes[0]):
            ax.hist(
                reference[:, i].numpy(),
                bins=40,
                density=True,
                histtype="step",
                color=color,
                label=f"reference, eps={eps:g}",
            )
            ax.hist(
                draws[:, i].numpy(),
                bins=40,
                density=True,
                histtype="step",
                ls="--",
                color=color,
                label=f"{method}, eps={eps:g}",
            )
            ax.set_xlabel(names[i])
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return "\n".join(lines)


def bias(root: Path, epsilon: float, out: Path | None) -> str:
    """Markdown table of ``(mean - reference mean) / reference sd`` and ``sd / reference sd`` per parameter
    for NaiveNPE and SPPE at ``epsilon``; the figure overlays their marginals on the reference's."""
    reference, names = read_draws(runs(root, "naive_npe")[epsilon] / "reference.csv")
    draws = {
        m: read_draws(runs(root, m)[epsilon] / m / "samples.csv")[0]
        for m in ("naive_npe", "sppe")
        if epsilon in runs(root, m)
    }
    mean, sd = reference.mean(0), reference.std(0)
    lines = [
        "| method | " + " | ".join(f"{n}: (mean-ref)/sd, sd/ref sd" for n in names) + " |",
        "|" + "---|" * (len(names) + 1),
    ]
    for method, x in draws.items():
        cells = [f"{float(b):+.2f}, {float(r):.2f}" for b, r in zip((x.mean(0) - mean) / sd, x.std(0) / sd)]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if out is not None:
        fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 2.8), squeeze=False)
        samples = (
            ("reference", reference, "k"),
            *((m, x, c) for (m, x), c in zip(draws.items(), ("C3", "C0"))),
        )
        for i, ax in enumerate(axes[0]):
            column = torch.cat([x[:, i] for _, x, _ in samples])
            bins = torch.linspace(
                float(column.min()), float(column.max()), 61
            ).numpy()  # shared: point masses too
            for label, x, color in samples:
                ax.hist(x[:, i].numpy(), bins=bins, density=True, histtype="step", color=color, label=label)
            ax.set_ylim(
                0, 1.5 * float(torch.histogram(reference[:, i], torch.tensor(bins), density=True).hist.max())
            )
            ax.set_xlabel(names[i])
        axes[0][0].legend(fontsize=7)
        axes[0][0].set_title(f"epsilon = {epsilon:g}", fontsize=8)
        fig.tight_layout()
        fig.savefig(out, dpi=80)
        plt.close(fig)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["table", "comparison", "privacy", "bias"])
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep directories")
    parser.add_argument("-o", "--out", type=Path, default=None, help="figure path")
    parser.add_argument("--method", default="sppe", help="method of the privacy figure")
    parser.add_argument("--epsilon", type=float, default=1.0, help="epsilon of the bias table")
    args = parser.parse_args(argv)
    if args.what != "table" and args.out is None and args.what != "bias":
        parser.error(f"{args.what} needs -o/--out")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if args.what == "table":
        print(table(args.dirs))
    elif args.what == "comparison":
        comparison_plot([r for root in args.dirs for r in collect(root)], METRICS, args.out)
    elif args.what == "privacy":
        print(privacy(args.dirs[0], args.method, args.out))
    else:
        print(bias(args.dirs[0], args.epsilon, args.out))


if __name__ == "__main__":
    main()
