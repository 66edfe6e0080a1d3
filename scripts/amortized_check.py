"""Amortized posteriors against exact ones over the prior predictive, at several epsilons.

Per task: one ``SPPE(task, amortized=True, epsilon_range=RANGE)`` fit at the library's defaults (one torch
thread), then at each of three epsilons of the range:

- accuracy: ``--releases`` releases drawn from the prior predictive (a prior draw, its confidential summary, the
  mechanism at that epsilon), each scored by C2ST between 2000 draws (``--draws``) of the posterior and as many
  of the task's exact posterior at that release and epsilon, and by the spread ratios (posterior sd and central
  95 % width over the exact posterior's, per parameter: ``dpsbi.metrics.spread_ratios``), whose mean over
  releases and parameters and largest per-parameter deviation from 1 are reported, and by the error of the
  posterior mean in exact sds (``dpsbi.metrics.mean_shift``: a posterior of the right spread in the wrong place);
- calibration: sbi's own ``run_sbc`` / ``check_sbc`` (KS p-value of each parameter's ranks) and ``run_tarp`` /
  ``check_tarp`` (ATC, KS p-value) over ``--pairs`` prior-predictive pairs, the posterior set to that epsilon
  with ``set_default_epsilon`` so that sbi's calls pass releases only;
- cost: seconds for those draws at one release (median over the releases) and at all of them in one batched call.

The first five tasks have exact posteriors at any release: ``conjugate_gaussian`` (Gaussian mechanism, closed
form), ``poisson_counts`` (Gong's, Laplace noise: a Gamma mixture), ``poisson_counts_discrete`` (the same count
released with discrete Laplace noise, as OpenDP's ``make_geometric`` does: an integer release),
``poisson_counts_gaussian`` (with discrete Gaussian noise at delta 1e-6, as OpenDP's Gaussian on integers: over
epsilon 0.1-1, below where an epsilon has several sigmas) and ``naive_bayes`` (Laplace noise on 8 cells: exact by
enumeration). ``regression`` (over epsilon 0.1-10, scored at both ends and 1)
has none: each release's reference is the validated sampler of scripts/frontier.py (importance sampling of the
exact private posterior, the mechanism as kernel; 1.1 million simulations, about 15 CPU seconds a release), so it
is left out of the default ``--tasks``, as is ``census_table`` (46 cells, discrete Gaussian noise, over zCDP rho
0.1-1: the fit's epsilons are rho's at delta 1e-10), whose references are importance sampling with its exact
likelihood (about 42 CPU seconds a release). ``sir`` (over 0.1-10) has references at its stored releases only: run
it with ``--releases 0`` (calibration alone, no exact draws needed). One JSON line per (task, epsilon) is appended to ``--out`` as it goes, and
one per task for the fit; a task whose fit line is in the file is skipped (a killed run resumes at its task).
``--range LOW HIGH`` fits over another epsilon range than the task's (a hundredfold one on the small exact tasks),
scored at ``--epsilons`` (any inside it; without ``--range`` they pick from the task's three).
``--task-options`` change the fitted task only (SIR's tau-leaping simulator, as scripts/privacy_utility.py's do):
the releases, calibration pairs and references it is scored at stay the task's defaults.
With ``--posteriors DIR`` each fit checkpoints its rounds to ``DIR/<task>/`` (a killed fit resumes there) and is saved
as ``DIR/<task>.pt`` (``DIR/<task>_sple/`` and ``DIR/<task>_sple.pt`` for ``--method sple``); a fit found there is
scored again without training (``scripts/frontier.py``'s ``amortized_fit``).
With ``--importance N`` each release is also scored after importance sampling corrects the flow's draws
(``dpsbi.baselines.corrected``, N proposals in two stages, ``--adapt``; the row's ``importance``): C2ST, spreads,
mean shift, the effective sample sizes (both stages' and the first's) and the CPU seconds per release. SBC and TARP
stay the flow's; with ``--importance-calibration M`` they are also run on the corrected draws (M proposals a
pair, over the same ``--pairs``; the row's ``importance_calibration``).

``--method sple`` fits and scores ``SPLE(task, amortized=True, epsilon_range=RANGE)`` instead: a likelihood flow
whose posterior is drawn by the slice sampler of its ``mcmc`` settings (``--overrides`` sets them, e.g.
``{"mcmc": {"num_chains": 20, "warmup": 5}}`` for a smoke test), every release's chains in one batched run; the
cost columns then time MCMC. Its rows carry ``"method": "sple"`` (SPPE's carry none), a file may hold both
methods' fits of a task (each resumes on its own), and ``--importance`` / ``--importance-calibration``, which
correct a posterior flow's draws, are refused. SPLE takes no task recipe (``task.amortized_recipe`` is SPPE's).

    .venv/bin/python scripts/amortized_check.py --out results/amortized_check.jsonl
    .venv/bin/python scripts/amortized_check.py --tasks poisson_counts --rounds 1 --releases 3 --pairs 20 --out /tmp/a.jsonl
    .venv/bin/python scripts/amortized_check.py --method sple --tasks naive_bayes --out results/amortized_check_sple.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from frontier import REFERENCE, amortized_fit, reference_cache

import dpsbi
from dpsbi.baselines.correction import ADAPT, SIMULATIONS_PER_DRAW
from dpsbi.experiment.reference import reference_posterior
from dpsbi.metrics import SPREADS, c2st, mean_shift, spread_ratios
from dpsbi.seeds import seeded_global_streams

#: name -> (tasks.load arguments, epsilon range of the fit, the epsilons scored).
TASKS = {
    "conjugate_gaussian": ({"name": "conjugate_gaussian"}, (0.5, 10.0), (0.7, 2.0, 7.0)),
    "poisson_counts": ({"name": "poisson_counts"}, (0.1, 2.0), (0.15, 0.5, 1.5)),
    "poisson_counts_discrete": (
        {"name": "poisson_counts", "noise": "discrete_laplace"},
        (0.1, 2.0),
        (0.15, 0.5, 1.5),
    ),
    # OpenDP's Gaussian on integers: a scalar discrete Gaussian, one sigma per epsilon only below ~1.63 (delta 1e-6)
    "poisson_counts_gaussian": (
        {"name": "poisson_counts", "noise": "discrete_gaussian"},
        (0.1, 1.0),
        (0.15, 0.4, 0.9),
    ),
    "naive_bayes": ({"name": "naive_bayes"}, (1.0, 10.0), (1.5, 4.0, 9.0)),
    "regression": ({"name": "regression"}, (0.1, 10.0), (0.1, 1.0, 10.0)),
    # 46 cells over zCDP rho 0.1-1 (epsilon at delta 1e-10), scored at rho 0.15, 0.2461 (2020's) and 0.7
    "census_table": ({"name": "census_table"}, (2.8818, 10.0343), (3.5738, 4.6574, 8.2291)),
    # calibration only (--releases 0): no exact posterior at a simulated release (references take ~15 CPU minutes
    # each, scripts/sir_references.py); scored against its stored references by scripts/privacy_utility.py
    "sir": ({"name": "sir"}, (0.1, 10.0), (0.1, 1.0, 10.0)),
}
#: The tasks scored by default: those with closed-form posteriors (``regression``'s 60 references take ~15 CPU
#: minutes, ``census_table``'s, exact-likelihood importance sampling, ~40).
DEFAULT_TASKS = [name for name in TASKS if name not in ("regression", "census_table", "sir")]


def load(arguments: dict, epsilon: float):
    """The task at ``epsilon`` (its observed release simulated unless ``arguments`` give ``y_obs``: most tasks
    store one at one epsilon only)."""
    arguments = {"y_obs": "simulate", **arguments}
    return dpsbi.tasks.load(arguments.pop("name"), epsilon=epsilon, **arguments)


def prior_predictive(task, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` pairs ``(theta, y)`` of the task's prior predictive at its epsilon. The parameters and the
    simulations draw from different streams: one seed for both would make a Gaussian simulator's noise a copy of
    the prior draws."""
    with seeded_global_streams(seed):
        theta = task.prior.sample((n,))
    return theta, task.simulate_release(theta, generator=torch.Generator().manual_seed(seed + 10_000))


def exact_draws(task, arguments: dict, y: torch.Tensor, n: int, seed: int, reference: dict) -> torch.Tensor:
    """``n`` draws of the task's posterior at release ``y``: its closed form, else the validated reference
    sampler at that release (scripts/frontier.py's settings, ``reference`` over them; cached by release, so that
    a second fit scored at the same releases reuses them)."""
    if task.exact_posterior is None:
        config = {**arguments, "epsilon": task.epsilon, "y_obs": y.tolist()}
        at = load({**arguments, "y_obs": y}, task.epsilon)
        settings = {**REFERENCE, **reference, "num_samples": n}
        cached = {"cache_dir": reference_cache(), "seed": seed, "progress": False}
        return reference_posterior(at, config, **cached, **settings).samples
    with seeded_global_streams(seed):
        return task.exact_posterior(y[None]).sample((n,)).reshape(n, -1)


def correct(posterior, release: torch.Tensor, epsilon: float, proposals: int, args, seed: int):
    """``posterior``'s draws at ``release`` corrected by ``dpsbi.baselines.corrected`` with ``proposals`` proposals
    and ``--simulations-per-draw`` / ``--adapt``: the result, and ``--draws`` draws resampled from it."""
    from dpsbi.baselines import corrected

    result = corrected(
        posterior,
        proposals,
        y=release,
        epsilon=epsilon,
        simulations_per_draw=args.simulations_per_draw,
        adapt=args.adapt,
        seed=seed,
        progress=False,
    )
    return result, result.resample(args.draws, torch.Generator().manual_seed(seed))


class Corrected:
    """``posterior``'s draws corrected at each release (:func:`correct`, ``proposals`` a release, at ``epsilon``),
    behind the one call sbi's SBC and TARP make, ``sample_batched((n,), x=xs)`` ``(n, B, dim_theta)``. The last
    batch's draws are kept, so that TARP on the releases SBC saw reuses them."""

    def __init__(self, posterior, epsilon: float, proposals: int, args) -> None:
        self.posterior, self.epsilon, self.proposals = posterior, epsilon, proposals
        self.args = argparse.Namespace(**{**vars(args), "draws": None})
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None

    def sample_batched(self, sample_shape, x: torch.Tensor, **_) -> torch.Tensor:
        if self.last is not None and torch.equal(self.last[0], x):
            return self.last[1]
        (self.args.draws,) = sample_shape
        draws = [
            correct(self.posterior, release, self.epsilon, self.proposals, self.args, i)[1]
            for i, release in enumerate(x)
        ]
        self.last = (x.clone(), torch.stack(draws, 1))
        return self.last[1]


def calibration(task, posterior, pairs: int, seed: int) -> dict:
    """sbi's SBC and TARP over ``pairs`` prior-predictive pairs at the task's epsilon; ``posterior``: a flow, or
    :class:`Corrected`."""
    from sbi.diagnostics import check_sbc, check_tarp, run_sbc, run_tarp

    theta, y = prior_predictive(task, pairs, seed)
    if hasattr(posterior, "set_default_epsilon"):
        posterior.set_default_epsilon(task.epsilon)
    torch.manual_seed(seed)
    ranks, dap = run_sbc(theta, y, posterior, num_posterior_samples=500, show_progress_bar=False)
    sbc = check_sbc(ranks, task.prior.sample((pairs,)), dap, num_posterior_samples=500)
    ecp, alpha = run_tarp(theta, y, posterior, num_posterior_samples=500, show_progress_bar=False)
    atc, tarp_p = check_tarp(ecp, alpha)
    return {
        "sbc_ks_p": [round(float(p), 4) for p in sbc["ks_pvals"]],
        "sbc_ks_p_min": round(float(sbc["ks_pvals"].min()), 4),
        "tarp_atc": round(float(atc), 4),
        "tarp_ks_p": round(float(tarp_p), 4),
    }


def spread_summary(spreads: list[dict[str, list[float]]]) -> dict:
    """Per spread measure (``sd_ratio``, ``width95_ratio``): its mean over releases and parameters, its mean per
    parameter over releases, and the ratio farthest from 1 (in log) of any release and parameter."""
    out = {}
    for name in SPREADS:
        table = torch.tensor([s[name] for s in spreads])  # (releases, parameters)
        out[f"{name}_mean"] = round(float(table.mean()), 4)
        out[f"{name}_by_parameter"] = [round(v, 4) for v in table.mean(0).tolist()]
        out[f"{name}_worst"] = round(float(table.flatten()[table.log().abs().argmax()]), 4)
    return out


def shift_summary(shifts: list[list[float]]) -> dict:
    """The mean errors (``dpsbi.metrics.mean_shift``, in reference sds) of each release and parameter: their mean
    absolute value, the mean absolute value per parameter, the largest per release, and the largest."""
    table = torch.tensor(shifts).abs()  # (releases, parameters)
    return {
        "mean_shift_abs_mean": round(float(table.mean()), 4),
        "mean_shift_abs_by_parameter": [round(v, 4) for v in table.mean(0).tolist()],
        "mean_shift_abs_by_release": [round(v, 4) for v in table.amax(1).tolist()],
        "mean_shift_abs_worst": round(float(table.max()), 4),
    }


def importance(posterior, y: torch.Tensor, epsilon: float, exact: list[torch.Tensor], args) -> dict:
    """The flow's draws corrected by importance sampling at each release ``y[i]``: ``dpsbi.baselines.corrected``
    with ``--importance`` proposals from the flow mixed with the prior, each weighted by the task's exact
    likelihood where it carries one, else by the mean of ``--simulations-per-draw`` mechanism densities,
    resampled to ``--draws`` and scored as the flow's draws are; with each release's effective sample size and
    CPU seconds."""
    scores, spreads, shifts, ess, ess_first, seconds = [], [], [], [], [], []
    for i, release in enumerate(y):
        began = time.process_time()
        result, draws = correct(posterior, release, epsilon, args.importance, args, i)
        ess_first.append(round(result.info["ess_first"]))
        seconds.append(time.process_time() - began)
        ess.append(round(result.ess))
        scores.append(round(c2st(draws, exact[i]), 4))
        spreads.append(spread_ratios(draws, exact[i]))
        shifts.append(mean_shift(draws, exact[i]))
    return {
        "proposals": args.importance,
        "simulations_per_draw": args.simulations_per_draw,
        "adapt": args.adapt,
        "c2st": scores,
        "c2st_mean": round(statistics.mean(scores), 4),
        "c2st_worst": max(scores),
        **spread_summary(spreads),
        **shift_summary(shifts),
        "ess": ess,
        "ess_min": min(ess),
        "ess_first": ess_first,
        "cpu_s_per_release": round(statistics.median(seconds), 2),
    }


def accuracy(posterior, at, arguments: dict, k: int, args: argparse.Namespace) -> dict:
    """The row's accuracy and cost at ``at``'s epsilon (the ``k``-th scored): ``--releases`` prior-predictive
    releases, each scored against the task's exact posterior; with ``--importance``, the corrected draws too."""
    epsilon = at.epsilon
    _, y = prior_predictive(at, args.releases, seed=100 + k)
    single = []
    for i in range(args.releases):
        began = time.perf_counter()
        posterior.sample((args.draws,), y=y[i], epsilon=epsilon, seed=i)
        single.append(time.perf_counter() - began)
    began = time.perf_counter()
    draws = posterior.sample_batched((args.draws,), y=y, epsilon=epsilon, seed=0)
    batched = time.perf_counter() - began
    exact = [exact_draws(at, arguments, y[i], args.draws, i, args.reference) for i in range(args.releases)]
    scores = [round(c2st(draws[:, i], exact[i]), 4) for i in range(args.releases)]
    spreads = [spread_ratios(draws[:, i], exact[i]) for i in range(args.releases)]
    shifts = [mean_shift(draws[:, i], exact[i]) for i in range(args.releases)]
    return {
        "releases": args.releases,
        "c2st": scores,
        "c2st_mean": round(statistics.mean(scores), 4),
        "c2st_worst": max(scores),
        **spread_summary(spreads),
        **shift_summary(shifts),
        f"draws_{args.draws}_one_release_s": round(statistics.median(single), 4),
        f"draws_{args.draws}_at_{args.releases}_releases_s": round(batched, 4),
        **({"importance": importance(posterior, y, epsilon, exact, args)} if args.importance else {}),
    }


def scored_epsilons(name: str, args: argparse.Namespace) -> list[tuple[int, float]]:
    """``(k, epsilon)`` of each epsilon scored: the task's three, those of them in ``--epsilons``, or with
    ``--range`` every one of ``--epsilons``; ``k`` (its releases' seeds) the task epsilon's index where it is one,
    else after them."""
    listed = TASKS[name][2]
    wanted = args.epsilons if args.range else [e for e in listed if not args.epsilons or e in args.epsilons]
    return [(listed.index(e) if e in listed else len(listed) + i, e) for i, e in enumerate(wanted)]


def check(name: str, args: argparse.Namespace) -> None:
    arguments, (low, high), _ = TASKS[name]
    low, high = args.range or (low, high)
    task = load({**arguments, **args.task_options}, (low * high) ** 0.5)
    posterior, times = amortized_fit(task, (low, high), args, name, seed=args.seed, estimator=args.method)
    method = {} if args.method == "sppe" else {"method": args.method}  # SPPE's rows as before the option
    fit = {
        "task": name,
        **method,
        "seed": args.seed,
        "rounds": args.rounds,
        "overrides": args.overrides,
        **times,
    }
    if args.task_options:
        fit["task_options"] = args.task_options
    if args.range:
        fit["epsilon_range"] = [low, high]
    for k, epsilon in scored_epsilons(name, args):
        at = load(arguments, epsilon)
        row = {"task": name, **method, "epsilon": epsilon, "epsilon_range": list(posterior.epsilon_range)}
        if args.releases:
            row.update(accuracy(posterior, at, arguments, k, args))
        row.update(calibration(at, posterior, args.pairs, seed=200 + k))
        if args.importance_calibration:
            began = time.process_time()
            sampler = Corrected(posterior, epsilon, args.importance_calibration, args)
            row["importance_calibration"] = {
                "proposals": args.importance_calibration,
                **calibration(at, sampler, args.pairs, seed=200 + k),
                "cpu_s": round(time.process_time() - began, 1),
            }
        append(args.out, row)
    append(args.out, {**fit, "fit_done": True})


def append(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def finished(path: Path) -> set[tuple]:
    """The ``(task, method, range)`` of every fit line in ``path`` (rows without a method are SPPE's, without an
    ``epsilon_range`` fitted over the task's own: ``None``)."""
    if not path.exists():
        return set()
    rows = map(json.loads, path.read_text().splitlines())
    return {
        (r["task"], r.get("method", "sppe"), tuple(r["epsilon_range"]) if "epsilon_range" in r else None)
        for r in rows
        if r.get("fit_done")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=list(TASKS))
    parser.add_argument(
        "--method",
        choices=("sppe", "sple"),
        default="sppe",
        help="the amortized estimator fitted and scored (sple: a likelihood flow sampled by slice sampling)",
    )
    parser.add_argument(
        "--releases", type=int, default=20, help="prior-predictive releases per epsilon (0: calibration only)"
    )
    parser.add_argument("--pairs", type=int, default=300, help="SBC / TARP pairs per epsilon")
    parser.add_argument("--draws", type=int, default=2000, help="posterior and exact draws per release")
    parser.add_argument("--rounds", type=int, help="rounds of the fit (default: the library's)")
    parser.add_argument(
        "--overrides",
        type=json.loads,
        default={},
        help="estimator arguments over the library's defaults as JSON (a smoke test: '{\"sims_per_round\": 50}')",
    )
    parser.add_argument(
        "--reference",
        type=json.loads,
        default={},
        help="reference settings over scripts/frontier.py's, as JSON (tasks without an exact posterior)",
    )
    parser.add_argument(
        "--task-options",
        type=json.loads,
        default={},
        help='options of the fitted task as JSON (SIR\'s tau-leaping simulator: \'{"simulator": "tau_leap"}\'); '
        "the releases, calibration pairs and references scored stay the task's defaults",
    )
    parser.add_argument(
        "--epsilons", type=float, nargs="+", help="score at these epsilons (default: each task's three)"
    )
    parser.add_argument(
        "--range",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="the fit's epsilon range (default: each task's); score inside it with --epsilons",
    )
    parser.add_argument(
        "--importance",
        type=int,
        default=0,
        help="also score the draws corrected by importance sampling with this many proposals per release",
    )
    parser.add_argument(
        "--simulations-per-draw",
        type=int,
        default=SIMULATIONS_PER_DRAW,
        help="simulations averaged per proposal (--importance; tasks without an exact likelihood)",
    )
    parser.add_argument(
        "--adapt",
        type=float,
        default=ADAPT,
        help="the adapted second stage's share of the proposals (--importance; 0: the flow's proposal alone)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--posteriors", type=Path, help="checkpoint and save each fit here; one saved there is scored again"
    )
    parser.add_argument(
        "--importance-calibration",
        type=int,
        default=0,
        help="also run SBC and TARP on corrected draws, with this many proposals a pair",
    )
    args = parser.parse_args()
    if args.pairs < 10:
        parser.error(
            f"--pairs must be at least 10 (sbi's TARP bins its coverage in pairs // 10 bins, its SBC check "
            f"cross-validates a classifier in 5 folds), got {args.pairs}"
        )
    if args.range and not args.epsilons:
        parser.error("--range needs --epsilons: a task's own three may lie outside the range")
    if args.range and not 0 < args.range[0] < args.range[1]:
        parser.error(f"--range must be 0 < LOW < HIGH, got {args.range}")
    outside = [e for e in args.epsilons or () if args.range and not args.range[0] <= e <= args.range[1]]
    if outside:
        parser.error(f"--epsilons {outside} lie outside --range {args.range}")
    if args.method == "sple" and (args.importance or args.importance_calibration):
        parser.error(
            "--importance and --importance-calibration correct a posterior flow's draws: --method sppe only"
        )
    torch.set_num_threads(1)
    done = finished(args.out)
    for name in args.tasks:
        if (name, args.method, tuple(args.range) if args.range else None) not in done:
            check(name, args)


if __name__ == "__main__":
    main()
