"""MH with the CLT approximation of an additive statistic under Gaussian noise (Alparslan & Yildirim, Alg. 4).

For ``s = mean_i t(x_i)`` approximately ``N(mu(theta), Sigma(theta) / n)`` and ``y = s + N(0, sigma^2 I)``,
the release is approximately ``N(mu(theta), H(theta))``, ``H = Sigma / n + sigma^2 I`` (eq. 9): a closed-form
likelihood, so plain MH samples the approximate posterior (15) exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..mechanisms import Gaussian, Mechanism
from ..tasks import Task
from ..tasks.latent import GaussianCLT, gaussian_log_prob, summary_model_of
from .exact_abc import target_release
from .noisy_mcmc import Carry, Move, run_metropolis
from .result import BaselineResult


def is_clt(model: object, mechanism: Mechanism) -> bool:
    """Whether ``model`` is a :class:`GaussianCLT` and ``mechanism`` Gaussian: the setting of Sec. 3.1 and Alg. 4."""
    return isinstance(model, GaussianCLT) and isinstance(mechanism, Gaussian)


def require_clt(model: object, mechanism: Mechanism) -> None:
    """Raise unless :func:`is_clt`."""
    if not is_clt(model, mechanism):
        raise ValueError(
            f"the CLT likelihood needs a GaussianCLT summary model and a Gaussian mechanism, got {type(model).__name__} "
            f"and {mechanism!r}; use pmmh or mhaar for other mechanisms"
        )


def clt_release_moments(model: GaussianCLT, mechanism: Gaussian, theta: Tensor) -> tuple[Tensor, Tensor]:
    """Mean ``(..., k)`` and covariance ``H (..., k, k)`` of the release under the CLT approximation (9)
    (``sigma^2 I`` becomes ``diag(sigma_j^2)`` for a Gaussian with per-coordinate sigmas)."""
    require_clt(model, mechanism)
    mean, cov = model.mean_cov(theta)
    variance = (
        torch.as_tensor(mechanism.sigma, dtype=mean.dtype, device=mean.device) ** 2
    )  # one or per coordinate
    return mean, cov + torch.diag_embed(variance.expand(mean.shape[-1:]))


class CLTLikelihood(Move):
    """Exact ratio of the CLT likelihoods ``N(y; mu(theta), H(theta))``; the carry is the current log-likelihood."""

    def __init__(self, model: GaussianCLT, mechanism: Gaussian, y: Tensor) -> None:
        require_clt(model, mechanism)
        self.model, self.mechanism, self.y = model, mechanism, y
        self.info = {}

    def log_likelihood(self, theta: Tensor) -> Tensor:
        """``log N(y; mu(theta), H(theta))`` for ``theta (C, d)``: ``(C,)``."""
        return gaussian_log_prob(self.y, *clt_release_moments(self.model, self.mechanism, theta))

    def init(self, theta: Tensor, generator: torch.Generator | None) -> Carry:
        return (self.log_likelihood(theta),)

    def __call__(self, theta, theta_prop, carry, generator):
        proposed = self.log_likelihood(theta_prop)
        return proposed - carry[0], (proposed,), carry


def mh_clt(
    task: Task,
    num_iterations: int,
    proposal_scale: float | Tensor,
    theta0: Tensor | None = None,
    *,
    model: GaussianCLT | None = None,
    y: Tensor | None = None,
    num_chains: int = 1,
    burn_in: int | None = None,
    thin: int = 1,
    generator: torch.Generator | None = None,
    progress: bool = True,
) -> BaselineResult:
    """Alg. 4: random-walk MH on ``prior(theta) N(y; mu(theta), H(theta))``, the CLT approximation of the
    private posterior for an additive statistic with Gaussian noise.

    ``model`` defaults to ``task.summary_model`` (a :class:`~dpsbi.tasks.latent.GaussianCLT`), ``y`` to
    ``task.y_obs``. ``proposal_scale``: random-walk standard deviation (number or per coordinate) or covariance in
    the unconstrained space of ``task.transform``. See :func:`~dpsbi.baselines.noisy_mcmc.run_metropolis` for
    the chains, burn-in, thinning and the returned ``info``; ``num_simulations`` is 0.
    """
    task.require_mechanism_release("mh_clt")
    y = target_release(task, y, "mh_clt")
    move = CLTLikelihood(summary_model_of(task, model, "mh_clt"), task.mechanism, y)
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
        "MH-CLT",
    )
