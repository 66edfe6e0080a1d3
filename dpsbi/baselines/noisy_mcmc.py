"""MCMC for noisy statistics (Alparslan & Yildirim): the random-walk Metropolis-Hastings driver shared by
MH with the CLT likelihood (Alg. 4, :func:`mh_clt`), pseudo-marginal MH (Alg. 5, :func:`pmmh`) and MH with
averaged acceptance ratios (Alg. 6-8, :func:`mhaar`).

Every algorithm proposes ``theta' = T(phi + L xi)``, ``xi ~ N(0, I)``, a Gaussian random walk in the task's
unconstrained space (``T = task.transform``; the prior density there includes ``log |det J_T|``), and
accepts with ``prior ratio x R``, where a :class:`Move` supplies an estimate ``R`` of the likelihood ratio
and the auxiliary state (a likelihood estimate or latent data) after acceptance and after rejection.
Independent chains run side by side as a batch dimension.
"""

from __future__ import annotations

import abc

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..diagnostics import chain_diagnostics
from ..mechanisms.base import open_unit
from ..tasks import Task
from .result import BaselineResult
from .smc_abc import unconstrained_log_prior

Carry = tuple[Tensor, ...]


class Move(abc.ABC):
    """The likelihood part of one MH step for ``C`` chains.

    ``init(theta)`` gives the auxiliary state for ``theta (C, d)``; ``move(theta, theta_prop, carry)``
    returns the log of the estimated likelihood ratio ``(C,)`` and the states to keep after acceptance and
    after rejection (tuples of tensors whose first dimension is the chain).
    """

    #: Simulated summaries (or data sets) per chain and iteration, for ``num_simulations``.
    simulations_per_step: int = 0
    #: Settings reported in the result's ``info``.
    info: dict

    @abc.abstractmethod
    def init(self, theta: Tensor, generator: torch.Generator | None) -> Carry:
        """Auxiliary state at the chains' starting points."""

    @abc.abstractmethod
    def __call__(
        self, theta: Tensor, theta_prop: Tensor, carry: Carry, generator: torch.Generator | None
    ) -> tuple[Tensor, Carry, Carry]:
        """``(log R (C,), state if accepted, state if rejected)``."""


def _select(accept: Tensor, a: Carry, b: Carry) -> Carry:
    """Per chain, ``a`` where ``accept`` (C,) else ``b``."""
    return tuple(torch.where(accept.view(-1, *[1] * (x.ndim - 1)), x, y) for x, y in zip(a, b))


def initial_theta(task: Task, theta0: Tensor | None, num_chains: int) -> Tensor:
    """Starting points ``(num_chains, dim_theta)``: ``theta0`` (one row, broadcast, or one per chain) or the prior mean."""
    theta = task.prior.mean if theta0 is None else torch.as_tensor(theta0, dtype=task.prior.mean.dtype)
    if theta.numel() not in (task.dim_theta, num_chains * task.dim_theta):
        raise ValueError(
            f"theta0 must hold 1 or num_chains={num_chains} rows of {task.dim_theta} numbers, got shape {tuple(theta.shape)}"
        )
    return task.check_theta(theta.reshape(-1, task.dim_theta).expand(num_chains, -1).clone())


def proposal_factor(proposal_scale: float | Tensor, dim: int, like: Tensor) -> Tensor:
    """Lower factor ``L (dim, dim)`` of the random-walk covariance ``L L^T`` in the unconstrained space:
    ``proposal_scale`` is a standard deviation (a number, or ``(dim,)`` per coordinate) or a covariance ``(dim, dim)``."""
    scale = torch.as_tensor(proposal_scale, dtype=like.dtype, device=like.device)
    if scale.ndim == 0 or scale.shape == (dim,):
        factor = torch.diag(scale.expand(dim))
        ok = bool((scale > 0).all() and torch.isfinite(scale).all())
    elif scale.shape == (dim, dim):
        factor, status = torch.linalg.cholesky_ex((scale + scale.mT) / 2)
        ok = status.item() == 0 and bool(torch.allclose(scale, scale.mT))
    else:
        raise ValueError(
            f"proposal_scale must be a number, ({dim},) or ({dim}, {dim}), got shape {tuple(scale.shape)}"
        )
    if not ok:
        raise ValueError(
            "proposal_scale must be positive (a symmetric positive-definite matrix when a covariance)"
        )
    return factor


def run_metropolis(
    task: Task,
    move: Move,
    num_iterations: int,
    proposal_scale: float | Tensor,
    theta0: Tensor | None = None,
    num_chains: int = 1,
    burn_in: int | None = None,
    thin: int = 1,
    generator: torch.Generator | None = None,
    progress: bool = True,
    method: str = "MCMC",
) -> BaselineResult:
    """Runs ``num_chains`` random-walk MH chains for ``num_iterations`` steps with ``move``'s likelihood ratios.

    Keeps every ``thin``-th state after ``burn_in`` (default: a quarter). Returns the kept draws
    ``(num_chains * kept, dim_theta)``, chain after chain; ``info`` holds ``chains (C, kept, dim_theta)``,
    ``acceptance_rate`` (overall, after burn-in) and ``acceptance_per_chain``, the chains' diagnostics
    (:func:`dpsbi.diagnostics.chain_diagnostics`, each ``(dim_theta,)``: ArviZ's bulk ``ess`` and ``ess_tail``,
    rank-normalized split ``rhat``, NaN for one chain, and the integrated autocorrelation time ``iat`` that
    the bulk ESS implies), and the move's own settings.
    """
    burn_in = num_iterations // 4 if burn_in is None else int(burn_in)
    if num_chains < 1 or thin < 1 or not 0 <= burn_in < num_iterations:
        raise ValueError(
            f"{method}: need num_chains >= 1, thin >= 1 and 0 <= burn_in < num_iterations, got num_chains={num_chains}, "
            f"thin={thin}, burn_in={burn_in}, num_iterations={num_iterations}"
        )
    theta = initial_theta(task, theta0, num_chains)
    phi = task.transform.inv(theta)
    _, log_prior = unconstrained_log_prior(task, phi)
    if not torch.isfinite(log_prior).all():
        raise ValueError(
            f"{method}: theta0 has zero prior density: {theta[~torch.isfinite(log_prior)][0].tolist()}"
        )
    factor = proposal_factor(proposal_scale, phi.shape[-1], phi)
    carry = move.init(theta, generator)
    kept, accepted = [], torch.zeros(num_chains, dtype=torch.long, device=phi.device)
    bar = tqdm(range(num_iterations), desc=method, disable=not progress)
    for step in bar:
        xi = torch.randn(phi.shape, generator=generator, device=phi.device, dtype=phi.dtype)
        phi_prop = phi + xi @ factor.mT
        theta_prop, log_prior_prop = unconstrained_log_prior(task, phi_prop)
        valid = torch.isfinite(log_prior_prop) & torch.isfinite(theta_prop).all(-1)
        # Chains whose proposal has no prior mass evaluate the move at their current point and reject.
        theta_eval = torch.where(valid[:, None], theta_prop, theta)
        log_ratio, carry_accept, carry_reject = move(theta, theta_eval, carry, generator)
        log_u = torch.log(
            open_unit(torch.rand(num_chains, generator=generator, device=phi.device, dtype=phi.dtype))
        )
        accept = valid & (log_u < log_prior_prop - log_prior + log_ratio)
        phi = torch.where(accept[:, None], phi_prop, phi)
        theta = torch.where(accept[:, None], theta_eval, theta)
        log_prior = torch.where(accept, log_prior_prop, log_prior)
        carry = _select(accept, carry_accept, carry_reject)
        if step >= burn_in:
            accepted += accept
            if (step - burn_in) % thin == 0:
                kept.append(theta)
        if progress and step % 100 == 0:
            bar.set_postfix(
                acceptance=f"{accepted.sum().item() / max(1, (step - burn_in + 1) * num_chains):.3f}"
            )
    chains = torch.stack(kept, 1)
    steps = num_iterations - burn_in
    return BaselineResult(
        samples=chains.reshape(-1, chains.shape[-1]),
        num_simulations=num_chains * (num_iterations + 1) * move.simulations_per_step,
        info=dict(
            chains=chains,
            acceptance_rate=float(accepted.sum()) / (steps * num_chains),
            acceptance_per_chain=accepted / steps,
            **chain_diagnostics(chains),
            method=method,
            num_chains=num_chains,
            burn_in=burn_in,
            thin=thin,
            **move.info,
        ),
    )
