"""Monte Carlo EM for the maximum-likelihood estimate from a private release (Gong 2022, Sec. 4).

The complete data are ``(s, y)``; the mechanism ``eta(y | s)`` is free of ``theta``, so the E-step only needs
the conditional expectation of the complete-data sufficient statistic ``b(s)`` given ``y`` at the current
``theta``. It is estimated by importance sampling: ``s_i ~ pi(s | theta_t)`` from the task's simulator,
weights ``eta(y | s_i)`` (Gong's Eq. 13). The M-step is the complete-data MLE from the weighted statistics.
Monte Carlo sizes grow in stages (Gong: 10^3, 10^5, 10^7 draws with relative-change tolerances 10^-3,
10^-4, 10^-5), and the observed information at the estimate comes from Louis' (1982) identity (Eq. 16).
MCEM runs in float64: its E-step sums up to millions of weighted terms, which float32 gets wrong in the
third significant digit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..mechanisms.base import check_integer
from ..tasks import Task
from .exact_abc import kish_ess, normalize, seeded, target_release


class ExponentialFamily(Protocol):
    """The complete-data model ``pi(s | theta)`` as MCEM needs it; ``theta`` has shape ``(d,)``, ``s`` shape
    ``(n, dim_s)``."""

    def statistic(self, s: Tensor) -> Tensor:
        """Sufficient statistics ``b(s)``, shape ``(n, k)``."""

    def mle(self, stats: Tensor, weights: Tensor) -> Tensor:
        """Complete-data MLE ``(d,)`` maximizing ``sum_i w_i log pi(s_i | theta)``, from ``b(s_i) (n, k)`` and
        normalized weights ``(n,)``."""

    def score(self, theta: Tensor, s: Tensor) -> Tensor:
        """Complete-data scores ``grad_theta log pi(s_i | theta)``, shape ``(n, d)``."""

    def information(self, theta: Tensor, s: Tensor) -> Tensor:
        """Complete-data observed informations ``-hess_theta log pi(s_i | theta)``, shape ``(n, d, d)``."""


class PoissonFamily:
    """Independent counts ``s_j ~ Poisson(theta_j)``: ``b(s) = s``, MLE the weighted mean of ``s``."""

    def statistic(self, s: Tensor) -> Tensor:
        return s

    def mle(self, stats: Tensor, weights: Tensor) -> Tensor:
        return weights @ stats

    def score(self, theta: Tensor, s: Tensor) -> Tensor:
        return s / theta - 1

    def information(self, theta: Tensor, s: Tensor) -> Tensor:
        return torch.diag_embed(s / theta**2)


#: Complete-data families of the tasks that have one, by task name.
FAMILIES: dict[str, ExponentialFamily] = {"poisson_counts": PoissonFamily()}


@dataclass
class MCEMResult:
    """MCEM's maximum-likelihood ``estimate (d,)``, its ``standard_error (d,)`` (from the inverse of Louis'
    ``observed_information (d, d)``; NaN where that is not positive definite), the Monte Carlo ``score (d,)``
    at the estimate (near 0 at a maximum), the ``trace (iterations + 1, d)`` of iterates, the number of
    simulated draws, and per-iteration diagnostics in ``info``."""

    estimate: Tensor
    standard_error: Tensor
    observed_information: Tensor
    score: Tensor
    trace: Tensor
    num_simulations: int
    info: dict = field(default_factory=dict)


def e_step(task: Task, theta: Tensor, y: Tensor, num_draws: int, batch_size: int) -> tuple[Tensor, Tensor]:
    """Draws ``s (num_draws, dim_s)`` from the model at ``theta (d,)`` and their normalized weights
    ``eta(y | s)`` ``(num_draws,)``, simulated ``batch_size`` at a time."""
    sizes = [min(batch_size, num_draws - start) for start in range(0, num_draws, batch_size)]
    s = torch.cat([task.simulate(theta.expand(size, -1)) for size in sizes]).to(y)
    return s, normalize(task.mechanism.log_prob(y, s), "mcem E-step")


def louis_information(
    family: ExponentialFamily, theta: Tensor, s: Tensor, weights: Tensor
) -> tuple[Tensor, Tensor]:
    """Observed score ``(d,)`` and information ``(d, d)`` at ``theta`` from weighted draws of ``s | y, theta``:
    ``E[lambda]`` and ``E[-grad lambda] - Cov(lambda)`` with ``lambda`` the complete-data score (Louis 1982)."""
    scores = family.score(theta, s)
    mean = weights @ scores
    centered = scores - mean
    information = (
        torch.einsum("n,nij->ij", weights, family.information(theta, s)) - (centered.T * weights) @ centered
    )
    return mean, information


def mcem(
    task: Task,
    family: ExponentialFamily | None = None,
    y: Tensor | None = None,
    theta0: Tensor | None = None,
    stages: Sequence[tuple[int, float]] = ((1_000, 1e-3), (100_000, 1e-4), (1_000_000, 1e-5)),
    max_iterations: int = 20,
    batch_size: int = 1_000_000,
    seed: int | None = None,
    progress: bool = True,
) -> MCEMResult:
    """Maximum-likelihood estimate of ``theta`` from the release ``y`` (default ``task.y_obs``) by MCEM.

    ``family`` is the task's complete-data exponential family (default: the one registered for
    ``task.name`` in :data:`FAMILIES`). ``theta0 (dim_theta,)`` defaults to the prior mean. Each stage
    ``(num_draws, tolerance)`` iterates E- and M-steps with ``num_draws`` importance draws until the relative
    change ``max|theta_t+1 - theta_t| / max|theta_t|`` falls below ``tolerance`` or ``max_iterations`` pass
    (``info['converged']`` per stage: Monte Carlo noise, of relative size about ``1e-4`` at 10^6 draws on
    the Poisson task, keeps a tighter tolerance out of reach, and the last stage then just runs its
    iterations). Louis' observed information is computed from fresh draws at the estimate with the last
    stage's size. The result's tensors are float64.
    """
    method = "mcem"
    task.require_mechanism_release(method)
    if family is None:
        if task.name not in FAMILIES:
            raise ValueError(
                f"{method}: no exponential family registered for task {task.name!r} (known: {sorted(FAMILIES)}); "
                "pass family=<ExponentialFamily>"
            )
        family = FAMILIES[task.name]
    if not stages or any(int(n) < 2 or not tol > 0 for n, tol in stages):
        raise ValueError(
            f"{method}: stages must be a non-empty list of (num_draws >= 2, tolerance > 0), got {stages}"
        )
    max_iterations = check_integer(f"{method}: max_iterations", max_iterations)
    batch_size = check_integer(f"{method}: batch_size", batch_size)
    y = target_release(task, y, method).double()
    theta = task.prior.mean.to(y) if theta0 is None else torch.as_tensor(theta0).to(y).reshape(-1)
    theta = task.check_theta(theta[None])[0]
    trace, draws, ess, changes, converged = [theta], [], [], [], []
    with seeded(seed), tqdm(desc=method, disable=not progress) as bar:
        for num_draws, tolerance in stages:
            for _ in range(int(max_iterations)):
                s, weights = e_step(task, theta, y, int(num_draws), int(batch_size))
                new = family.mle(family.statistic(s), weights)
                change = float(
                    (new - theta).abs().max() / theta.abs().max().clamp(min=torch.finfo(theta.dtype).tiny)
                )
                theta = task.check_theta(new[None])[0]
                trace.append(theta)
                draws.append(int(num_draws))
                ess.append(kish_ess(weights))
                changes.append(change)
                bar.update()
                bar.set_postfix(draws=num_draws, change=f"{change:.2g}")
                if change < tolerance:
                    break
            converged.append(changes[-1] < tolerance)
        s, weights = e_step(task, theta, y, int(stages[-1][0]), int(batch_size))
    score, information = louis_information(family, theta, s, weights)
    standard_error = torch.linalg.inv(information).diagonal().sqrt()
    info = {"draws": draws, "ess": ess, "relative_change": changes, "converged": converged}
    info["final_ess"] = kish_ess(weights)
    return MCEMResult(
        theta, standard_error, information, score, torch.stack(trace), sum(draws) + s.shape[0], info
    )
