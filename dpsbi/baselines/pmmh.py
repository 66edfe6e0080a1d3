"""Pseudo-marginal MH for a private release (Andrieu & Roberts 2009; Alparslan & Yildirim, Alg. 5).

The likelihood ``p(y | theta) = E[eta(y | s)]``, ``s ~ model(theta)``, is replaced by its unbiased estimate
``Z(theta) = (1/N) sum_j eta(y | s_j)`` from ``N`` fresh summaries; the estimate at the current point is kept
until the next acceptance, so the chain targets the exact private posterior.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..mechanisms import Mechanism
from ..mechanisms.base import check_integer
from ..tasks import Task
from ..tasks.latent import SummaryModel
from .exact_abc import target_release
from .noisy_mcmc import Carry, Move, run_metropolis
from .result import BaselineResult

Simulate = Callable[[Tensor, "torch.Generator | None"], Tensor]


class PseudoMarginal(Move):
    """``log Z(theta)`` from ``num_particles`` summaries of ``simulate(theta (C*N, d), generator)``."""

    def __init__(self, simulate: Simulate, mechanism: Mechanism, y: Tensor, num_particles: int) -> None:
        self.simulate, self.mechanism, self.y = simulate, mechanism, y
        self.num_particles = self.simulations_per_step = check_integer("num_particles", num_particles)
        self.info = dict(num_particles=self.num_particles)

    def log_estimate(self, theta: Tensor, generator: torch.Generator | None) -> Tensor:
        """``log (1/N) sum_j eta(y | s_j)``, ``s_j ~ model(theta)``, for ``theta (C, d)``: ``(C,)``."""
        s = self.simulate(theta.repeat_interleave(self.num_particles, 0), generator)
        log_eta = self.mechanism.log_prob(self.y, s).reshape(theta.shape[0], self.num_particles)
        return torch.logsumexp(log_eta, -1) - math.log(self.num_particles)

    def init(self, theta: Tensor, generator: torch.Generator | None) -> Carry:
        return (self.log_estimate(theta, generator),)

    def __call__(self, theta, theta_prop, carry, generator):
        proposed = self.log_estimate(theta_prop, generator)
        return proposed - carry[0], (proposed,), carry


def pmmh(
    task: Task,
    num_iterations: int,
    num_particles: int,
    proposal_scale: float | Tensor,
    theta0: Tensor | None = None,
    *,
    model: SummaryModel | None = None,
    y: Tensor | None = None,
    num_chains: int = 1,
    burn_in: int | None = None,
    thin: int = 1,
    generator: torch.Generator | None = None,
    progress: bool = True,
) -> BaselineResult:
    """Alg. 5: pseudo-marginal MH with ``Z(theta) = (1/N) sum_j eta(y | s_j)`` and ``N = num_particles``.

    Summaries come from ``task.simulate`` (any task whose release came from its mechanism; exact), or from
    ``model.sample`` when a :class:`~dpsbi.tasks.latent.SummaryModel` is given (e.g. the CLT approximation,
    as in the paper's Sec. 5.2-5.3). ``y`` defaults to ``task.y_obs``. ``proposal_scale``: random-walk standard
    deviation (number or per coordinate) or covariance in the unconstrained space of ``task.transform``. See
    :func:`~dpsbi.baselines.noisy_mcmc.run_metropolis` for chains, burn-in, thinning and ``info``;
    ``num_simulations`` counts simulated summaries.
    """
    task.require_mechanism_release("pmmh")
    y = target_release(task, y, "pmmh")
    simulate = task.simulate if model is None else model.sample
    move = PseudoMarginal(simulate, task.mechanism, y, num_particles)
    return run_metropolis(
        task,
        move,
        num_iterations,
        proposal_scale,
        theta0,
        num_chains,
        burn_in,
        thin,
        generator,
        progress,
        "PMMH",
    )
