"""Stochastic SIR epidemic released through the binomial curve mechanism (main paper, Sec. 4)."""

from __future__ import annotations

import copy
import json
import math
from functools import partial
from importlib.resources import files

import torch
from torch import Tensor
from torch.distributions import MultivariateNormal

from ..mechanisms import BinomialCurve
from . import register
from .base import Task, observed_release

TIMES = [17.0 * i for i in range(10)]
TRUE_THETA = [-0.5, -3.0]
STORED = {
    10.0: [0.0010, 0.0310, 0.6140, 0.2630, 0.1230, 0.0470, 0.0180, 0.0090, 0.0050, 0.0030],
    1.0: [0.0120, 0.0150, 0.7020, 0.3130, 0.1380, 0.0530, 0.0370, 0.0120, 0.0160, 0.0130],
    0.1: [0.0750, 0.0850, 0.6820, 0.3120, 0.2240, 0.1130, 0.1120, 0.0930, 0.0810, 0.0860],
}
#: SIR's amortized SPPE fit where the call leaves these out (:attr:`~dpsbi.tasks.base.Task.amortized_recipe`): one
#: round of a million simulations of its tau-leaping model (validated against the exact one at the stored
#: releases: C2ST 0.489-0.527, docs/RESULTS.md "SIR's tau-leaping step"; 0.14 CPU ms a simulation against 8), one
#: cosine decay of 13 000 steps from lr 3e-3, over epsilon twice as far out as asked at each end (so that the
#: range's ends lie inside it). At the stored releases at 0.1 / 1 / 10 it scores C2ST 0.520-0.536 / 0.499-0.538 /
#: 0.515-0.521 against the exact references in three seeds, sds within 15 % in 17 of 18, SBC and TARP passing on
#: the exact model, in 19 CPU minutes; the exact simulator's ten rounds of 10 000 (all its 8 CPU ms a simulation
#: allow in 30 minutes) score 0.71-0.84 at 0.1 (docs/RESULTS.md, "SIR's amortized default").
AMORTIZED_RECIPE = {
    "rounds": 1,
    "sims_per_round": 1_000_000,
    "training": {"lr": 3e-3, "max_steps": 13_000},
    "task_options": {"simulator": "tau_leap"},
    "epsilon_margin": 2.0,
}
#: SIR's sequential SPPE fit at ``y_obs`` where the call leaves these out
#: (:attr:`~dpsbi.tasks.base.Task.sequential_recipe`): proposals cut at posterior mass 1e-4 (TSNPE), 2000 steps a
#: round. Atomic APT leaked tails here (posterior sd 1.1-3.0x the reference's at C2ST 0.52-0.58); truncated
#: proposals at 1000 steps kept each sd within 0.89-1.11x at epsilon 0.1 and 1 but 1.03-1.42x at 10, whose narrow
#: posterior the flow was still approaching, with C2ST 0.575 in one seed; at 2000 steps C2ST 0.503-0.534 and sds
#: 0.88-1.09x at 0.1 and 1, 1.02-1.21x at 10, in 660-794 CPU s (three seeds each; docs/RESULTS.md, "Truncated
#: proposals on SIR" and "SIR's sequential recipe").
SEQUENTIAL_RECIPE = {"truncate": 1e-4, "training": {"max_steps": 2000}}
#: Observed infected fractions of real outbreaks (not releases of the mechanism), with their provenance:
#: ``dpsbi/data/outbreaks`` (its README says what each series measures and where it was cut).
OUTBREAKS = {
    key: entry["series"]
    for key, entry in json.loads((files("dpsbi.data") / "outbreaks" / "outbreaks.json").read_text()).items()
}


def _simulator(population: int, initial_infected: int, times: list[float], method: str):
    """The confidential summary: infected counts at ``times`` from the exact or tau-leaping simulator."""
    from .. import simulators  # numba compiles on first use only

    methods = {"exact": simulators.simulate_sir, "tau_leap": simulators.tau_leap_sir}
    if method not in methods:
        raise ValueError(f"unknown SIR simulator {method!r}; choose one of {sorted(methods)}")
    fn = partial(methods[method], population=population, initial_infected=initial_infected, times=times)

    def simulate(theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return fn(theta, generator=generator)

    return simulate


def _make(
    name: str,
    epsilon: float | None,
    y_obs,
    seed: int,
    stored: dict[float, list[float]],
    prior_mean: list[float],
    prior_var: list[float],
    population: int,
    trials: int,
    pseudo_count: float | None,
    initial_infected: int,
    times: list[float] | None,
    simulator: str,
    true_theta: list[float] | None,
    release_from_mechanism: bool,
    confidential: list[float] | None = None,
) -> Task:
    dtype = torch.get_default_dtype()
    times = list(TIMES if times is None else times)
    prior = MultivariateNormal(
        torch.tensor(prior_mean, dtype=dtype), torch.diag(torch.tensor(prior_var, dtype=dtype))
    )
    mechanism = BinomialCurve(
        trials, population, len(times), epsilon=None if pseudo_count else epsilon, pseudo_count=pseudo_count
    )
    simulate = _simulator(population, initial_infected, times, simulator)
    theta_true = torch.tensor([true_theta], dtype=dtype) if true_theta is not None else None

    def simulate_obs(generator: torch.Generator) -> Tensor:
        if confidential is not None:  # real fractions: the curator's release of their counts in K
            counts = (torch.tensor([confidential], dtype=torch.float64) * population).round()
            return mechanism.sample(counts.to(dtype), generator=generator)
        if theta_true is None:
            raise ValueError(f"task {name!r} has no true parameter to simulate a release from")
        return mechanism.sample(simulate(theta_true, generator), generator=generator)

    return Task(
        name=name,
        prior=prior,
        simulator=simulate,
        mechanism=mechanism,
        epsilon=mechanism.target_epsilon if epsilon is None else epsilon,
        y_obs=observed_release(
            name, mechanism.target_epsilon if epsilon is None else epsilon, y_obs, stored, simulate_obs, seed
        ),
        true_theta=theta_true,
        parameter_names=["log_beta", "log_gamma"],
        release_from_mechanism=release_from_mechanism,
        costly_simulator=simulator == "exact",  # ~8 CPU ms a Gillespie epidemic; tau-leaping ~0.14
        description=f"Stochastic SIR (K={population}), theta=(log beta, log gamma), binomial curve release (N={trials}).",
    )


@register("sir")
def make(
    epsilon: float = 10.0,
    y_obs=None,
    seed: int = 0,
    population: int = 1_000_000,
    trials: int = 1000,
    initial_infected: int = 1,
    times: list[float] | None = None,
    simulator: str = "exact",
) -> Task:
    """SIR with prior ``N((log 0.4, log 0.125), diag(0.5, 0.2))``, true theta (-0.5, -3), M = T N / epsilon; an
    amortized SPPE fit takes :data:`AMORTIZED_RECIPE` where the call leaves it out."""
    task = _make(
        "sir",
        epsilon,
        y_obs,
        seed,
        STORED,
        [math.log(0.4), math.log(0.125)],
        [0.5, 0.2],
        population,
        trials,
        None,
        initial_infected,
        times,
        simulator,
        TRUE_THETA,
        True,
    )
    task.sequential_recipe = copy.deepcopy(SEQUENTIAL_RECIPE)
    task.amortized_recipe = copy.deepcopy(AMORTIZED_RECIPE)
    if simulator == "tau_leap":  # already the recipe's model
        task.amortized_recipe["task_options"] = {}
    return task


def _outbreak(key: str):
    def make_outbreak(
        epsilon: float | None = None,
        y_obs=None,
        seed: int = 0,
        population: int = 100_000,
        trials: int = 100,
        pseudo_count: float = 100.0,
        initial_infected: int = 1,
        times: list[float] | None = None,
        simulator: str = "exact",
    ) -> Task:
        """A real outbreak's infected fractions with the paper's settings (prior N((-2, -3), I), N = M = 100,
        K = 10^5). The data are observed fractions, not mechanism releases; ``epsilon`` is implied by M.
        ``y_obs="privatize"``: the curve released through the task's mechanism at ``seed``, as a curator would
        publish it; that is a release of the mechanism, so an exact (mechanism-kernel) posterior exists for it."""
        if epsilon is not None:
            raise ValueError(
                f"task 'sir_{key}' has its privacy level fixed by pseudo_count; pass pseudo_count, not epsilon"
            )
        privatize = isinstance(y_obs, str) and y_obs == "privatize"
        given = y_obs is not None
        return _make(
            f"sir_{key}",
            None,
            "simulate" if privatize else y_obs if given else OUTBREAKS[key],
            seed,
            {},
            [-2.0, -3.0],
            [1.0, 1.0],
            population,
            trials,
            pseudo_count,
            initial_infected,
            times,
            simulator,
            None,
            given,
            confidential=OUTBREAKS[key] if privatize else None,
        )

    return make_outbreak


for _key in OUTBREAKS:
    register(f"sir_{_key}")(_outbreak(_key))
