"""RQMC against MC for the SPPE and SPLE losses (main paper, Fig. 1).

For a fixed flow (randomly initialised, or trained for a few epochs of one SPPE/SPLE round) and a few
stored pairs ``(theta_i, s_i)`` from the prior, the loss estimate is recomputed under ``--repeats``
independent randomizations of the mechanism noise for ``M = 1, 2, 4, ..., --max-m`` inner draws, with
scrambled Sobol points (RQMC) and with plain uniforms (MC). Prints the variance and RMSE table and the
fitted log-log slopes (MC: -1 for the variance; RQMC: steeper), and writes a CSV, a JSON summary and a
figure into ``--out``.

    python scripts/rqmc_loss_variance.py --out results/rqmc --tasks regression sir
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.inference import SPLE, SPPE, ConditionalFlow, FlowSettings  # noqa: E402
from dpsbi.inference.losses import loss_estimates, sple_loss, sppe_loss  # noqa: E402

LOSSES = {"SPPE": (SPPE, sppe_loss), "SPLE": (SPLE, sple_loss)}


def fixed_flow(task, method: str, epochs: int, sims: int, seed: int, progress: bool) -> ConditionalFlow:
    """The flow whose loss is studied: one round of ``method`` trained for ``epochs`` epochs on ``sims``
    prior simulations, or (``epochs = 0``) a fresh flow z-scored on such simulations."""
    if epochs:
        return (
            LOSSES[method][0](
                task,
                rounds=1,
                sims_per_round=sims,
                seed=seed,
                progress=progress,
                training=dict(max_epochs=epochs),
            )
            .run()
            .flow
        )
    torch.manual_seed(seed)
    theta = task.prior.sample((sims,))
    z, y = task.transform.inv(theta), task.release(task.simulate(theta))
    return ConditionalFlow(FlowSettings(), *((z, y) if method == "SPPE" else (y, z))).eval()


def study(task, flow, loss, pairs: int, repeats: int, ms: list[int], seed: int) -> dict:
    """Variance and RMSE of the loss estimate at each M for MC and RQMC, and the log-log slopes."""
    torch.manual_seed(seed)
    theta = task.prior.sample((pairs,))
    s = task.simulate(theta, torch.Generator().manual_seed(seed))
    z = task.transform.inv(theta)
    generator = torch.Generator().manual_seed(seed + 1)
    estimates = {
        (qmc, m): loss_estimates(loss, flow, z, s, task.mechanism, m, qmc, repeats, generator).double()
        for qmc in (False, True)
        for m in ms
    }
    reference = float(estimates[(True, ms[-1])].mean())  # unbiased and by far the most precise
    rows, slopes = [], {}
    for qmc, name in ((False, "MC"), (True, "RQMC")):
        var = np.array([float(estimates[(qmc, m)].var()) for m in ms])
        rmse = np.array([float(((estimates[(qmc, m)] - reference) ** 2).mean().sqrt()) for m in ms])
        slopes[name] = {
            "variance": float(np.polyfit(np.log(ms), np.log(var), 1)[0]),
            "rmse": float(np.polyfit(np.log(ms), np.log(rmse), 1)[0]),
        }
        rows += [{"estimator": name, "M": m, "variance": v, "rmse": r} for m, v, r in zip(ms, var, rmse)]
    return {"rows": rows, "slopes": slopes, "reference_loss": reference}


def plot(results: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6), squeeze=False)
    for ax, (key, result) in zip(axes[0], results.items()):
        for name, style in (("MC", "o-"), ("RQMC", "s-")):
            rows = [r for r in result["rows"] if r["estimator"] == name]
            ax.loglog(
                [r["M"] for r in rows],
                [r["rmse"] for r in rows],
                style,
                label=f"{name} (slope {result['slopes'][name]['rmse']:.2f})",
            )
        ms = np.array([r["M"] for r in rows], dtype=float)
        first = result["rows"][0]["rmse"]
        ax.loglog(ms, first * (ms / ms[0]) ** -0.5, "k:", lw=1, label="$M^{-1/2}$")
        ax.set(title=key, xlabel="inner samples M", ylabel="RMSE of the loss estimate")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--tasks", nargs="+", default=["regression"], help="tasks (e.g. regression sir)")
    parser.add_argument("--epsilon", type=float, default=None, help="privacy level (default: each task's)")
    parser.add_argument("--pairs", type=int, default=10, help="stored (theta, s) pairs")
    parser.add_argument("--repeats", type=int, default=50, help="independent randomizations per M")
    parser.add_argument("--max-m", type=int, default=256, help="largest M (a power of two)")
    parser.add_argument(
        "--epochs", type=int, default=5, help="training epochs of the fixed flow (0: random init)"
    )
    parser.add_argument("--sims", type=int, default=500, help="simulations to train / z-score the flow")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args(argv)
    ms = [2**k for k in range(int(np.log2(args.max_m)) + 1)]
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.tasks:
        task = dpsbi.tasks.load(name, **({} if args.epsilon is None else {"epsilon": args.epsilon}))
        for method, (_, loss) in LOSSES.items():
            flow = fixed_flow(task, method, args.epochs, args.sims, args.seed, args.progress)
            results[f"{name} {method}"] = study(task, flow, loss, args.pairs, args.repeats, ms, args.seed)
    print(f"{'task / loss':<18} {'M':>5} {'MC var':>11} {'RQMC var':>11} {'ratio':>7}")
    for key, result in results.items():
        by = {(r["estimator"], r["M"]): r for r in result["rows"]}
        for m in ms:
            mc, rq = by[("MC", m)]["variance"], by[("RQMC", m)]["variance"]
            print(f"{key:<18} {m:>5} {mc:>11.3e} {rq:>11.3e} {mc / rq:>7.1f}")
        s = result["slopes"]
        print(
            f"{key:<18} slopes of log variance vs log M: MC {s['MC']['variance']:.2f}, RQMC {s['RQMC']['variance']:.2f}"
        )
    with open(args.out / "rqmc_loss_variance.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["case", "estimator", "M", "variance", "rmse"])
        writer.writeheader()
        writer.writerows({"case": key, **row} for key, result in results.items() for row in result["rows"])
    summary = {
        key: {"slopes": r["slopes"], "reference_loss": r["reference_loss"]} for key, r in results.items()
    }
    (args.out / "rqmc_loss_variance.json").write_text(
        json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "results": summary}, indent=2)
    )
    plot(results, args.out / "rqmc_loss_variance.png")
    return results


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
