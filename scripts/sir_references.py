"""Exact-model (Gillespie) SIR reference posteriors at the stored releases, kept in dpsbi/data/references:
the ``sir`` task's (``--epsilon``) and the privatized real outbreaks' (``--outbreak KEY``: the task
``sir_KEY`` with ``y_obs="privatize"`` at ``--release-seed``, the curve released through the mechanism).

Self-normalised importance sampling of the exact private posterior, ``w = prior / q * eta(y_obs | s)`` with
``s`` from the exact simulator (the binomial mechanism is the kernel: consistent, no tolerance):

1. proposal q0: a defensive Gaussian mixture (``dpsbi.baselines.fitted_proposal``) fitted to an importance
   reference of the tau-leap model (SMC-ABC pilot with the mechanism kernel, then ``--tau-draws`` draws);
2. ``--refit-draws`` exact-model draws from q0; q1 = the defensive mixture refitted to them (``--refits`` > 1:
   again, each q_k+1 refitted to all weighted draws so far, for a posterior the first refit misses);
3. exact-model draws from the last proposal up to ``--draws`` in all. All stages are pooled (unnormalised weights from
   independent proposals are each unbiased), the Kish ESS reported, and ``--store`` draws resampled
   without repeats (``dpsbi.baselines.smoothed_resample``) into ``dpsbi/data/references/sir_eps<epsilon>.csv`` (an
   outbreak: ``sir_<outbreak>_private<release seed>.csv``) with the provenance beside it.

Work is checkpointed per chunk of ``--chunk`` draws (seeded by its index) in ``--work``: a killed run resumes
to the same result, and a larger ``--draws`` later extends it. One thread (numba and torch):
``NUMBA_NUM_THREADS=1 python scripts/sir_references.py --epsilon 1 --draws 40000``, or
``... --outbreak ebola_guinea``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

import dpsbi
from dpsbi.baselines import abc_is, smc_abc, smoothed_resample
from dpsbi.baselines.exact_abc import kish_ess
from dpsbi.baselines.fitted_proposal import fitted_proposal
from dpsbi.experiment import stored_references
from dpsbi.files import atomic_save
from dpsbi.tasks.sir import OUTBREAKS


def chunked_is(
    task, proposal, first: int, last: int, chunk: int, work: Path, tag: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance draws ``first..last`` (chunk indices) from ``proposal``: ``theta (n, 2)`` and unnormalised log
    weights ``(n,)``, each chunk computed once and kept in ``work``."""
    thetas, log_ws = [], []
    for index in range(first, last):
        path = work / f"{tag}_{index:04d}.pt"
        if not path.exists():
            start = time.time()
            result = abc_is(task, chunk, proposal, seed=seed * 100_000 + index, progress=False)
            log_w = torch.log(result.weights) + result.info["log_evidence"] + math.log(chunk)
            atomic_save({"theta": result.samples, "log_w": log_w}, path)
            print(
                f"  {tag} chunk {index}: {chunk} draws in {time.time() - start:.0f} s, chunk ESS {result.info['ess']:.0f}",
                flush=True,
            )
        stored = torch.load(path)
        thetas.append(stored["theta"])
        log_ws.append(stored["log_w"])
    return torch.cat(thetas), torch.cat(log_ws)


def kish(log_w: torch.Tensor) -> float:
    """Kish's ESS of unnormalised log weights."""
    return kish_ess(torch.softmax(log_w.double(), 0))


def target(args: argparse.Namespace) -> tuple[str, dict, str]:
    """The task's name, its factory keywords (less the simulator) and the stored entry's stem."""
    if args.outbreak is not None:
        name = f"sir_{args.outbreak}"
        return name, {"y_obs": "privatize", "seed": args.release_seed}, f"{name}_private{args.release_seed}"
    return "sir", {"epsilon": args.epsilon}, f"sir_eps{args.epsilon:g}"


def tau_leap_proposal(name: str, kwargs: dict, particles: int, draws: int, work: Path, seed: int):
    """q0: the defensive mixture fitted to the tau-leap model's importance reference (kept in ``work``)."""
    path = work / "tau_leap.pt"
    if not path.exists():
        tau = dpsbi.tasks.load(name, **kwargs, simulator="tau_leap")
        start = time.time()
        pilot = smc_abc(tau, num_particles=particles, kernel="mechanism", seed=seed, progress=False)
        refit = abc_is(
            tau, draws, fitted_proposal(tau, pilot.samples, pilot.weights), seed=seed + 1, progress=False
        )
        atomic_save({"samples": refit.samples, "weights": refit.weights, "ess": refit.info["ess"]}, path)
        print(
            f"  tau-leap proposal: ESS {refit.info['ess']:.0f} of {draws} in {time.time() - start:.0f} s",
            flush=True,
        )
    stored = torch.load(path)
    return stored


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--epsilon", type=float, help="the sir task's stored release: 0.1, 1 or 10")
    which.add_argument(
        "--outbreak",
        choices=sorted(OUTBREAKS),
        help="a real outbreak's curve, privatized",
    )
    parser.add_argument("--release-seed", type=int, default=0, help="seed of the privatized outbreak release")
    parser.add_argument("--draws", type=int, default=40_000, help="exact-model importance draws in all")
    parser.add_argument(
        "--refit-draws", type=int, default=10_000, help="draws from each proposal before it is refitted"
    )
    parser.add_argument("--refits", type=int, default=1, help="how many times the proposal is refitted")
    parser.add_argument("--chunk", type=int, default=2_000)
    parser.add_argument("--tau-particles", type=int, default=2000)
    parser.add_argument("--tau-draws", type=int, default=20_000)
    parser.add_argument("--store", type=int, default=10_000, help="resampled draws kept in the repository")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("results/sir_references"))
    parser.add_argument(
        "--store-dir",
        type=Path,
        default=stored_references.STORE,
        help="where the draws and provenance go (default: the repository's dpsbi/data/references)",
    )
    args = parser.parse_args(argv)
    if (
        args.draws % args.chunk
        or args.refit_draws % args.chunk
        or args.refits * args.refit_draws >= args.draws
    ):
        parser.error(
            "--draws and --refit-draws must be multiples of --chunk, with --refits x --refit-draws < --draws"
        )
    if args.epsilon is not None and args.release_seed:
        parser.error("--release-seed picks a privatized outbreak release: give it with --outbreak")
    torch.set_num_threads(1)
    name, kwargs, stem = target(args)
    work = args.work / stem.removeprefix("sir_")
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    task = dpsbi.tasks.load(name, **kwargs, simulator="exact")
    tau = tau_leap_proposal(name, kwargs, args.tau_particles, args.tau_draws, work, args.seed)
    proposal = fitted_proposal(task, tau["samples"], tau["weights"])
    split, stages = args.refit_draws // args.chunk, []
    for k in range(args.refits + 1):  # stage k draws from q_k; the last one up to --draws
        last = args.draws // args.chunk if k == args.refits else (k + 1) * split
        stages.append(chunked_is(task, proposal, k * split, last, args.chunk, work, f"q{k}", args.seed))
        theta, log_w = (torch.cat(parts) for parts in zip(*stages))
        if k < args.refits:
            proposal = fitted_proposal(task, theta, torch.softmax(log_w.double(), 0).to(theta))
    ess = kish(log_w)
    weights = torch.softmax(log_w.double(), 0)[:, None]
    try:
        draws, bandwidth = smoothed_resample(
            task, theta, weights[:, 0], args.store, torch.Generator().manual_seed(args.seed)
        )
    except ValueError as error:  # too few effective draws for a reference: say so in one line, store nothing
        sys.exit(f"sir_references.py: {stem}, {args.draws} draws: {error}")
    mean = (weights * theta.double()).sum(0)
    sd = ((weights * (theta.double() - mean) ** 2).sum(0)).sqrt()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    provenance = {
        "method": (
            "self-normalised importance sampling of the exact private posterior (binomial mechanism as kernel, "
            "exact Gillespie simulator); proposal: defensive Gaussian mixture fitted to the tau-leap model's "
            f"importance reference (ESS {tau['ess']:.0f}), refitted {args.refits} time(s), each after "
            f"{args.refit_draws} exact-model draws, to all weighted draws so far; all stages pooled; {args.store} draws by Liu-West shrunk kernel resampling (bandwidth {bandwidth:.3f} "
            "of the posterior sd, mean and covariance kept: no repeated draws for C2ST to recognise)"
        ),
        "importance_draws": args.draws,
        "ess": round(ess, 1),
        "ess_stages": [round(kish(stage_log_w), 1) for _, stage_log_w in stages],
        "bandwidth": round(bandwidth, 4),
        "weighted_mean": mean.tolist(),
        "weighted_sd": sd.tolist(),
        "monte_carlo_se_of_mean": (sd / math.sqrt(ess)).tolist(),
        "seed": args.seed,
        "command": "NUMBA_NUM_THREADS=1 python scripts/sir_references.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "git_commit": commit,
        "made": datetime.date.today().isoformat(),
        "wall_seconds_this_invocation": round(time.time() - started),
    }
    path = stored_references.write(stem, task, draws, provenance, store=args.store_dir)
    print(f"{stem}: ESS {ess:.0f} of {args.draws}; mean {mean.tolist()} sd {sd.tolist()}; wrote {path}")


if __name__ == "__main__":
    main()
