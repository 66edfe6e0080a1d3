"""Throughput and cost of dpsbi on the machine it runs on: ``python scripts/bench.py [--quick] [--json out.json]``.

Sections (each timed after a warm-up call, median over ``--repeats``):

1. SIR exact simulations per second: the task's simulator (numba Gillespie, all numba threads) on prior draws;
2. mechanism noise per batch of ``N x M x d`` releases ``y_ij = G(s_i, u_ij)`` (100 x 32 x 10 by default): the
   binomial curve mechanism of SIR and the Laplace mechanism of regression, RQMC (scrambled Sobol) and MC;
3. one SPPE and one SPLE training step (loss forward + backward + optimizer step, batch of 100, M = 32, 10
   atoms for SPPE) on each paper task, on the CPU and on CUDA when ``torch.cuda.is_available()``;
4. end-to-end wall time of SPPE and SPLE per paper task at a stated, reduced budget (simulation, training,
   and 1000 posterior draws at ``y_obs``; SPLE's draws are MCMC);
5. peak memory: the process's max RSS, and ``torch.cuda.max_memory_allocated`` on a GPU.

``--quick`` shrinks everything to seconds (a smoke test of the script). Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numba
import torch

import dpsbi
from dpsbi.inference import SPLE, SPPE, ConditionalFlow, FlowSettings
from dpsbi.inference.losses import inner_releases, sple_loss, sppe_loss
from dpsbi.inference.parameters import ParameterSpace

TASKS = {"regression": 1.0, "naive_bayes": 10.0, "sir": 1.0}  # paper tasks at a stored release's epsilon


def timed(run: Callable[[], object], repeats: int, device: torch.device | None = None) -> float:
    """Median wall time in seconds of ``run()`` over ``repeats`` calls after one warm-up call."""

    def once() -> float:
        start = time.perf_counter()
        run()
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    once()
    return statistics.median(once() for _ in range(repeats))


def sir_throughput(batch: int, repeats: int) -> dict:
    """Exact Gillespie simulations per second on prior draws (minor and major outbreaks mixed)."""
    task = dpsbi.tasks.load("sir", epsilon=1.0)
    theta = task.prior.sample((batch,))
    generator = torch.Generator().manual_seed(0)
    seconds = timed(lambda: task.simulate(theta, generator), repeats)
    return {
        "batch": batch,
        "numba_threads": numba.get_num_threads(),
        "seconds": seconds,
        "sims_per_s": batch / seconds,
    }


def noise_time(task_name: str, n: int, m: int, repeats: int, device: torch.device) -> dict:
    """Seconds per batch of ``n x m`` releases of ``n`` stored summaries, RQMC and MC."""
    task = dpsbi.tasks.load(task_name, epsilon=TASKS[task_name])
    s = task.simulate(task.prior.sample((n,))).to(device)
    generator = torch.Generator(device).manual_seed(0)
    row = {
        "mechanism": type(task.mechanism).__name__,
        "shape": f"{n}x{m}x{task.dim_s}",
        "device": device.type,
    }
    for qmc, key in ((True, "rqmc_ms"), (False, "mc_ms")):
        row[key] = 1e3 * timed(lambda: inner_releases(s, task.mechanism, m, qmc, generator), repeats, device)
    return row


def step_time(
    task_name: str, method: str, batch: int, m: int, atoms: int, repeats: int, device: torch.device
) -> dict:
    """Seconds of one training step (loss forward, backward, Adam step) on a batch of ``batch`` pairs."""
    task = dpsbi.tasks.load(task_name, epsilon=TASKS[task_name])
    theta = task.prior.sample((batch,))
    s = task.simulate(theta).to(device)
    z = task.transform.inv(theta).to(device)
    y = task.release(s)
    flow = ConditionalFlow(FlowSettings(), *((z, y) if method == "SPPE" else (y, z))).to(device)
    optimizer = torch.optim.Adam(flow.parameters(), lr=5e-4)
    log_prior = ParameterSpace(task).log_prior_z(z)
    generator = torch.Generator(device).manual_seed(0)

    def step() -> None:
        optimizer.zero_grad()
        if method == "SPPE":
            loss = sppe_loss(flow, z, s, task.mechanism, m, True, generator, atoms=atoms, log_prior=log_prior)
        else:
            loss = sple_loss(flow, z, s, task.mechanism, m, True, generator)
        loss.backward()
        optimizer.step()

    return {
        "task": task_name,
        "method": method,
        "device": device.type,
        "ms": 1e3 * timed(step, repeats, device),
    }


def end_to_end(task_name: str, method: str, budget: dict, accelerator: str) -> dict:
    """Wall time of a fit at ``budget`` plus 1000 posterior draws at ``y_obs``."""
    task = dpsbi.tasks.load(task_name, epsilon=TASKS[task_name])
    estimator = {"SPPE": SPPE, "SPLE": SPLE}[method]
    start = time.perf_counter()
    posterior = estimator(
        task, **{**budget, "training": {**budget["training"], "accelerator": accelerator}}, progress=False
    ).run()
    fit = time.perf_counter() - start
    posterior.sample((1000,), seed=0)
    total = time.perf_counter() - start
    return {"task": task_name, "method": method, "accelerator": accelerator, "fit_s": fit, "total_s": total}


def peak_memory() -> dict:
    """Max resident set size of this process so far (and peak CUDA allocation), in MiB."""
    peak = {"max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available():
        peak["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return peak


def table(title: str, rows: list[dict]) -> None:
    """Print ``rows`` (dicts with the same keys) as an aligned table."""
    print(f"\n## {title}")
    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()] for row in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(rows[0])]
    print("  ".join(k.ljust(w) for k, w in zip(rows[0], widths)))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seconds-scale budgets (checks that it works)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--tasks", nargs="+", default=list(TASKS), choices=list(TASKS), help="end-to-end tasks"
    )
    parser.add_argument("--rounds", type=int, default=2, help="end-to-end rounds")
    parser.add_argument("--sims", type=int, default=500, help="end-to-end simulations per round")
    parser.add_argument("--inner-samples", type=int, default=32, help="M: releases per simulation")
    parser.add_argument("--max-epochs", type=int, default=20, help="end-to-end epoch cap per round")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest for these batches)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.rounds, args.sims, args.max_epochs, args.repeats, args.inner_samples = 1, 100, 1, 2, 8
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    accelerators = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    n, m = (20, 8) if args.quick else (100, 32)
    budget = {
        "rounds": args.rounds,
        "sims_per_round": args.sims,
        "inner_samples": args.inner_samples,
        "training": {"max_epochs": args.max_epochs},
    }
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, devices {[d.type for d in devices]}"
    )

    results = {"budget": budget, "sir": [sir_throughput(20 if args.quick else 200, args.repeats)]}
    table("SIR exact simulator (prior draws, warm-up excluded)", results["sir"])
    results["noise"] = [noise_time(t, n, m, args.repeats, d) for t in ("sir", "regression") for d in devices]
    table(f"mechanism noise per batch (N x M x d = {n} x {m} x d)", results["noise"])
    results["step"] = [
        step_time(t, method, n, m, 10, args.repeats, d)
        for d in devices
        for t in TASKS
        for method in ("SPPE", "SPLE")
    ]
    table(
        f"training step (batch {n}, M = {m}, SPPE with 10 atoms; forward + backward + Adam)", results["step"]
    )
    results["end_to_end"] = [
        end_to_end(t, method, budget, a)
        for a in accelerators
        for t in args.tasks
        for method in ("SPPE", "SPLE")
    ]
    table(f"end to end (budget {budget}, + 1000 draws at y_obs)", results["end_to_end"])
    results["memory"] = [peak_memory()]
    table("peak memory", results["memory"])
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
