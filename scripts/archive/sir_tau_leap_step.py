"""SIR's tau-leaping step against the exact model at the stored releases (docs/RESULTS.md, "SIR's tau-leaping
step").

For each ``EPSILON:SCHEME[:DT]`` cell, the private posterior at the stored release by importance sampling with
a Gaussian proposal (the stored exact reference's mean, 1.5x its sds), 4 simulations a draw, against that
reference: the weighted mean's shift and sd over the reference's (per parameter, in reference sds), the ESS,
and C2ST of 2000 draws resampled without repeats (``smoothed_resample``). ``SCHEME``: ``exact`` (Gillespie),
``exposure`` (the library's ``tau_leap_sir``) or ``start`` (the step's exposures from its start, the library's
scheme before the twenty-fourth session, kept here to compare). One JSON line a cell, appended to ``OUT`` as
it goes: ``python scripts/archive/sir_tau_leap_step.py OUT DRAWS 10:exact 10:start:0.1 10:exposure:0.1 ...``.
A cell ``trajectories:SCHEME:DT`` compares ``I(t) / K`` itself instead: DRAWS epidemics at the true parameter in a
population of 10 000, the mean's shift and the sd's ratio per observation time against the exact simulator's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from functools import partial

import torch
from torch.distributions import MultivariateNormal

import dpsbi
from dpsbi.baselines import abc_is, smoothed_resample
from dpsbi.experiment.reference import reference_posterior
from dpsbi.simulators import gillespie_sir, tau_leap_sir
from dpsbi.tasks.sir import TIMES, TRUE_THETA


def tau_leap_from_start(theta, population, initial_infected, times, dt, generator=None):
    """``I(t)`` ``(n, T)`` by tau-leaping with each step's exposures taken from its start (``E = I h``)."""
    beta, gamma = theta[:, 0].exp(), theta[:, 1].exp()
    s, i = torch.full_like(beta, population - initial_infected), torch.full_like(beta, initial_infected)
    out, start = torch.empty(theta.shape[0], len(times), dtype=theta.dtype), 0.0
    for k, stop in enumerate(times):
        steps = math.ceil((stop - start) / dt)
        h = (stop - start) / max(steps, 1)
        for _ in range(steps):
            infections = torch.binomial(s, -torch.expm1(-beta * i * h / population), generator=generator)
            recoveries = torch.binomial(i, -torch.expm1(-gamma * h).expand_as(i), generator=generator)
            s, i = s - infections, i + infections - recoveries
        out[:, k], start = i, stop
    return out


#: The tau-leaping schemes compared: the library's and the one it replaced.
SCHEMES = {"exposure": tau_leap_sir, "start": tau_leap_from_start}


def cell(epsilon: float, scheme: str, dt: float, draws: int) -> dict:
    """One row: ``scheme``'s importance posterior at the stored release at ``epsilon`` against the reference."""
    task = dpsbi.tasks.load("sir", epsilon=epsilon)
    reference = reference_posterior(task, {"name": "sir", "epsilon": epsilon}, "stored", 2000).samples
    if scheme != "exact":
        fn = SCHEMES[scheme]
        simulate = partial(fn, population=1_000_000, initial_infected=1, times=TIMES, dt=dt)
        task = dataclasses.replace(
            task, simulator=lambda theta, generator=None: simulate(theta, generator=generator)
        )
    mean, sd = reference.mean(0), reference.std(0)
    proposal = MultivariateNormal(mean, 2.25 * torch.cov(reference.T))
    began = time.process_time()
    result = abc_is(task, draws, proposal=proposal, seed=0, progress=False, simulations_per_draw=4)
    cpu = time.process_time() - began
    w = result.weights
    m = w @ result.samples
    s = (w @ (result.samples - m) ** 2).sqrt()
    resampled = smoothed_resample(task, result.samples, w, 2000, torch.Generator().manual_seed(0))[0]
    return {
        "epsilon": epsilon,
        "scheme": scheme,
        "dt": dt if scheme != "exact" else None,
        "draws": draws,
        "ess": round(result.ess),
        "cpu_s": round(cpu, 1),
        "shift_in_reference_sds": [round(v, 3) for v in ((m - mean) / sd).tolist()],
        "sd_ratio": [round(v, 3) for v in (s / sd).tolist()],
        "c2st": round(float(dpsbi.metrics.c2st(resampled, reference, seed=0)), 4),
    }


def trajectories(scheme: str, dt: float, n: int, population: int = 10_000) -> dict:
    """One row: ``scheme``'s ``I(t) / K`` (t > 0) over ``n`` epidemics at the true parameter against the exact
    simulator's, the mean's shift in sds and the sd's ratio at each observation time."""
    theta = torch.tensor([TRUE_THETA]).double().expand(n, -1)
    exact = torch.from_numpy(gillespie_sir(theta.numpy(), population=population, seed=21))[:, 1:] / population
    fn = SCHEMES[scheme]
    tau = fn(theta, population, 1, TIMES, dt, generator=torch.Generator().manual_seed(21))[:, 1:] / population
    sd = ((exact.var(0) + tau.var(0)) / 2).sqrt()
    return {
        "trajectories": scheme,
        "dt": dt,
        "epidemics": n,
        "population": population,
        "shift_in_sds": [round(v, 3) for v in ((tau.mean(0) - exact.mean(0)) / sd).tolist()],
        "sd_ratio": [round(v, 3) for v in (tau.std(0) / exact.std(0)).tolist()],
    }


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    out, draws = argv[0], int(argv[1])
    for spec in argv[2:]:
        epsilon, scheme, *dt = spec.split(":")
        step = float(dt[0]) if dt else 0.1
        if epsilon == "trajectories":
            row = trajectories(scheme, step, draws)
        else:
            row = cell(float(epsilon), scheme, step, draws)
        print(json.dumps(row), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
