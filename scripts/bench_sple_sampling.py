"""Time SPLE's posterior sampling, old sampler (sbi's numpy slice sampler) against the torch elliptical slice
sampler, on one torch thread: ``python scripts/bench_sple_sampling.py [--repeats 5] [--posterior PATH] [--quick]``.

Trains a small SPLE posterior on ``regression`` at epsilon = 1 (1 round of 1000 simulations, 4 inner
releases, 20 epochs, default flow) or reuses the one saved at ``--posterior``; then, per sampler, times
``posterior.sample((2000,), seed=0)`` ``--repeats`` times (min and median wall time; every call runs the
whole sampler: initial candidates, warm-up and draws), counts the sequential calls of the log density
and the rows they evaluate, and reports the multi-chain effective sample size of the draws (min over
coordinates) and C2ST accuracies against

* ``old``: the old sampler's 2000 draws at the same seed (mean over seeds 0 and 1);
* ``reference``: a long run of the old sampler (warm-up 200, thin 10; cached next to the posterior; mean
  over seeds 0 and 1);
* ``self``: the same sampler, seed 0 against seed 1 (the noise floor of C2ST at these sizes, ~0.5).

``--releases B`` times ``posterior.sample_batched((n,), releases)`` at ``B`` prior-predictive releases (every
release's chains in one run) against a loop of calls of ``posterior.sample`` (one run per release, what
``sample_batched`` did before; timed on the first ``--looped`` releases, default :data:`LOOPED`, and scaled to
``B``; ``--looped 0`` leaves the loop out), on ``--device`` (``cpu`` or ``cuda``), with the sequential calls of
each and, on CUDA, the device-to-host synchronizations of the batched run, instead of the samplers' table.

``--quick`` is a smoke test of the script, in seconds: a one-transform flow trained for one epoch on 100
simulations, and every sampler's warm-up cut to ``QUICK_WARMUP`` steps (sbi's slice sampler still tunes for its
own 50 steps first); its timings say nothing about the default flow.

Timings on a shared machine are noisy: compare them within one run of the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from pathlib import Path

import torch
from bench_step import synchronizations

import dpsbi
from dpsbi.inference.mcmc import MCMCSettings
from dpsbi.inference.posterior import LikelihoodPosterior, load_posterior
from dpsbi.metrics import c2st

SAMPLERS = {
    "old: slice_np_vectorized": MCMCSettings(method="slice_np_vectorized", num_chains=100, thin=2, warmup=50),
    "new: elliptical_slice (default)": MCMCSettings(),
}
REFERENCE = MCMCSettings(method="slice_np_vectorized", num_chains=100, thin=10, warmup=200)
#: The fit measured, and ``--quick``'s.
FIT = dict(sims_per_round=1000, training=dict(max_epochs=20))
QUICK_FIT = dict(
    sims_per_round=100, flow=dict(transforms=1, hidden=10, blocks=1), training=dict(max_epochs=1)
)
QUICK_WARMUP = 5
#: Releases the one-run-per-release loop of ``--releases`` is timed on (its time is scaled to all of them).
LOOPED = 20


def trained_posterior(path: Path, retrain: bool, quick: bool) -> LikelihoodPosterior:
    if path.exists() and not retrain:
        return load_posterior(path)
    task = dpsbi.tasks.load("regression", epsilon=1.0)
    start = time.perf_counter()
    posterior = dpsbi.SPLE(
        task, rounds=1, inner_samples=4, progress=False, **(QUICK_FIT if quick else FIT)
    ).run()
    print(f"trained SPLE in {time.perf_counter() - start:.1f} s; saved to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    posterior.save(path)
    return posterior


def settled(config: MCMCSettings, quick: bool) -> MCMCSettings:
    """``config``, its warm-up cut to :data:`QUICK_WARMUP` steps for ``--quick``."""
    return dataclasses.replace(config, warmup=QUICK_WARMUP) if quick else config


def with_config(posterior: LikelihoodPosterior, config: MCMCSettings) -> LikelihoodPosterior:
    return LikelihoodPosterior(posterior.task, posterior.flow, posterior.method, config)


class Counting:
    """The posterior's log density, counting its calls and rows."""

    def __init__(self, posterior: LikelihoodPosterior) -> None:
        self.fn, self.calls, self.rows = posterior.log_density_z, 0, 0
        posterior.log_density_z = self

    def __call__(self, z, y):
        self.calls += 1
        self.rows += z.shape[0]
        return self.fn(z, y)


def diagnostics(posterior: LikelihoodPosterior, n: int, seed: int) -> dict:
    """The sampler's ``info`` (see :func:`~dpsbi.inference.mcmc.slice_sample_groups`) for ``posterior.sample((n,),
    seed=seed)``: the same run, with its diagnostics kept."""
    info: dict = {}
    posterior._slice_sample(
        n, posterior._conditions(None, None, True), posterior._noise_generator(None, seed), info
    )
    return info


def batched(
    posterior: LikelihoodPosterior,
    releases: int,
    samples: int,
    device: str,
    quick: bool,
    looped: int = LOOPED,
) -> None:
    """Print the wall seconds and sequential density calls of ``sample_batched`` at ``releases`` prior-predictive
    releases against one ``sample`` per release on the first ``looped`` of them (module docstring), with the
    posterior's MCMC settings (their warm-up cut under ``quick``)."""
    generator = torch.Generator().manual_seed(0)
    task = posterior.task
    y = task.simulate_release(task.prior.sample((releases,)), generator=generator).to(device)
    post = with_config(posterior, settled(posterior.mcmc, quick)).to(device)
    counting = Counting(post)
    timings = {}
    runs = [("sample_batched, one run", lambda: post.sample_batched((samples,), y, seed=0))]
    if looped:
        runs.append(
            ("sample per release", lambda: [post.sample((samples,), y=r[None], seed=0) for r in y[:looped]])
        )
    warm = y[: min(releases, 2)]
    start = time.perf_counter()
    post.sample_batched((samples,), warm, seed=0)  # warm-up (a CUDA context, kernels), on two releases
    print(f"warm-up, {len(warm)} releases: {time.perf_counter() - start:.2f} s", flush=True)
    for name, run in runs:
        calls = counting.calls
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        scale = 1 if name.startswith("sample_batched") else releases / min(releases, looped)
        timings[name] = ((time.perf_counter() - start) * scale, round((counting.calls - calls) * scale))
    print(
        f"\n{samples} draws at each of {releases} releases on {device}, {posterior.task.name}, {post.mcmc.method}"
    )
    for name, (seconds, calls) in timings.items():
        print(f"{name:28s} {seconds:8.2f} s {calls:7d} calls")
    if device.startswith("cuda"):
        calls = counting.calls
        syncs = len(synchronizations(lambda: post.sample_batched((samples,), warm, seed=0)))
        print(
            f"synchronizations of one sample_batched run at {len(warm)} releases: {syncs}, in "
            f"{counting.calls - calls} density calls (each shrinkage round reads one count back)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--posterior", type=Path, default=Path("/tmp/dpsbi-bench/sple_regression_eps1.pt"))
    parser.add_argument("--retrain", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument(
        "--quick", action="store_true", help="seconds-scale fit and warm-ups (a smoke test of the script)"
    )
    parser.add_argument("--releases", type=int, default=0, help="time sample_batched at this many releases")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--looped", type=int, default=LOOPED, help="releases the per-release loop is timed on (0: none)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    samplers = {name: settled(config, args.quick) for name, config in SAMPLERS.items()}
    reference_settings = settled(REFERENCE, args.quick)

    posterior = trained_posterior(args.posterior, args.retrain, args.quick)
    if args.releases:
        return batched(posterior, args.releases, args.samples, args.device, args.quick, args.looped)
    reference_path = args.posterior.with_suffix(".reference.pt")
    if reference_path.exists() and not args.retrain:
        reference = torch.load(reference_path)
    else:
        start = time.perf_counter()
        reference = with_config(posterior, reference_settings).sample((args.samples,), seed=12345)
        print(
            f"reference run (old sampler, warm-up {reference_settings.warmup}, thin {reference_settings.thin}): {time.perf_counter() - start:.1f} s"
        )
        torch.save(reference, reference_path)

    rows, draws = [], {}
    for name, config in samplers.items():
        post = with_config(posterior, config)
        counting = Counting(post)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            sample = post.sample((args.samples,), seed=0)
            times.append(time.perf_counter() - start)
        calls, evaluated = counting.calls // args.repeats, counting.rows // args.repeats
        draws[name] = (sample, post.sample((args.samples,), seed=1))
        info = diagnostics(with_config(posterior, config), args.samples, seed=0)
        rows.append(
            dict(
                name=name,
                config=config,
                calls=calls,
                evaluated=evaluated,
                min=min(times),
                median=statistics.median(times),
                ess=float(info["ess"].min()),
                first=info.get("first_accept", math.nan),
                c2st_self=c2st(*draws[name]),
                c2st_ref=statistics.mean(c2st(x, reference) for x in draws[name]),
            )
        )
    old = draws[next(iter(samplers))]
    for row, pair in zip(rows, draws.values()):
        row["c2st_old"] = (
            statistics.mean(c2st(x, y) for x, y in zip(pair, old)) if pair is not old else math.nan
        )

    print(
        f"\nposterior.sample(({args.samples},), seed=0) on {args.posterior.name}, torch threads = {torch.get_num_threads()}, repeats = {args.repeats}"
    )
    header = f"{'sampler':34s} {'chains':>6s} {'warmup':>6s} {'thin':>4s} {'calls':>6s} {'rows':>8s} {'min s':>7s} {'median s':>8s} {'ESS':>6s} {'1st acc':>7s} {'c2st old':>8s} {'c2st ref':>8s} {'c2st self':>9s}"
    print(header)
    print("-" * len(header))
    for r in rows:
        c = r["config"]
        print(
            f"{r['name']:34s} {c.num_chains:6d} {c.warmup:6d} {c.thin:4d} {r['calls']:6d} {r['evaluated']:8d} {r['min']:7.2f} {r['median']:8.2f} "
            f"{r['ess']:6.0f} {r['first']:7.2f} {r['c2st_old']:8.3f} {r['c2st_ref']:8.3f} {r['c2st_self']:9.3f}"
        )
    print(
        "\ncalls/rows: sequential calls of the log density (flow + prior) and rows evaluated per sample() call, the initial "
        f"candidates included; ESS: multi-chain effective sample size of the {args.samples} draws, min over coordinates; "
        "1st acc: fraction of updates accepted at their first proposal; c2st old / ref: mean over seeds 0 and 1 of the "
        "accuracy against the old sampler's draws at the same seed / the reference run; c2st self: seed 0 vs seed 1 of "
        "the same sampler. C2ST of 2000 vs 2000 draws has a standard deviation of ~0.01."
    )


if __name__ == "__main__":
    main()
