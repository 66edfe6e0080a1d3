"""Exact ABC for private releases (Gong 2022): rejection (Alg. 1) and importance sampling (Sec. 3).

With the privacy mechanism's own density ``eta(y | s)`` as the ABC kernel, the accepted (or weighted)
parameters follow the exact private posterior ``p(theta | y) ∝ prior(theta) E[eta(y | s) | theta]``:
no tolerance, no approximation. The helpers here (the release to condition on, a prior density that is
``-inf`` outside the support, seeding, weight normalization) are shared by the other classical baselines.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.distributions import Distribution
from tqdm.auto import tqdm

from ..mechanisms.base import Mechanism, check_integer
from ..seeds import check_seed, seeded_global_streams
from ..tasks import Task
from .result import BaselineResult


class SimulationBudgetExceeded(RuntimeError):
    """A sampler used up its ``max_simulations`` before it had the draws it was asked for."""


@contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Run the block with torch's global RNG seeded by ``seed`` (priors' ``.sample`` draws from it) and
    restore the caller's RNG state afterwards; with ``seed=None`` the block uses the RNG as it is. A seed that is
    not an integer in ``[0, 2**63 - 1]`` is refused before the block runs."""
    if seed is None:
        yield
        return
    with seeded_global_streams(check_seed(seed)):
        yield


def target_release(task: Task, y: Tensor | None, method: str) -> Tensor:
    """The release to condition on, ``(1, dim_s)``: ``y`` or else ``task.y_obs``, checked by ``task.check_release``."""
    y = task.y_obs if y is None else y
    if y is None:
        raise ValueError(f"{method}: task {task.name!r} has no observed release; pass y=<release>")
    y = task.check_release(y)
    if y.shape[0] != 1:
        raise ValueError(f"{method} conditions on a single release, got {y.shape[0]} rows")
    return y


def normalize(log_weights: Tensor, method: str) -> Tensor:
    """Normalized weights ``(n,)`` from unnormalized log weights; raises when every weight is zero."""
    if not torch.isfinite(log_weights).any():
        raise RuntimeError(
            f"{method}: every importance weight is zero (the release has zero density under all draws); "
            "use more draws or a proposal that covers the posterior"
        )
    return torch.softmax(log_weights.double(), dim=0).to(log_weights.dtype)  # float64: sums of 10^6 weights


def kish_ess(weights: Tensor) -> float:
    """Kish's effective sample size ``1 / sum w^2`` of normalized weights."""
    return float(1.0 / (weights.double() ** 2).sum())


def mechanism_log_weights(
    task: Task,
    theta: Tensor,
    log_ratio: Tensor,
    y: Tensor,
    power: float = 1.0,
    mechanism: Mechanism | None = None,
    repeats: int = 1,
) -> Tensor:
    """``log_ratio + power * log mean_r eta(y | s_r)`` with ``repeats`` simulations ``s_r ~ simulate(theta)``,
    shape ``(n,)``: the mean is an unbiased estimate of the likelihood ``E[eta(y | s) | theta]``, less noisy with
    more repeats.

    ``log_ratio (n,)`` is the importance ratio ``log prior - log proposal`` of ``theta (n, dim_theta)``;
    rows where it is ``-inf`` (outside the prior's support) are not simulated and keep weight zero.
    ``mechanism``: ``eta`` (default: the task's).
    """
    mechanism = task.mechanism if mechanism is None else mechanism
    inside = torch.isfinite(log_ratio)
    log_w = torch.full_like(log_ratio, -math.inf)
    if inside.any():
        s = task.simulate(theta[inside].repeat(repeats, 1))
        log_eta = mechanism.log_prob(y, s).to(log_ratio).reshape(repeats, -1)
        log_w[inside] = log_ratio[inside] + power * (torch.logsumexp(log_eta, 0) - math.log(repeats))
    return log_w


def budget_error(
    method: str, max_simulations: int, accepted: int, wanted: int, simulations: int
) -> SimulationBudgetExceeded:
    """The error a sampler raises when it hits ``max_simulations``, with its progress and acceptance rate."""
    rate = accepted / max(simulations, 1)
    needed = f"about {wanted / rate:.3g}" if rate > 0 else "far more"
    return SimulationBudgetExceeded(
        f"{method} hit max_simulations={max_simulations} after {simulations} simulations with {accepted} of "
        f"{wanted} draws accepted (acceptance rate {rate:.3g}); {needed} simulations would be needed: raise "
        "max_simulations, or use importance sampling / SMC with a proposal closer to the posterior"
    )


def _at_epsilon(task: Task, epsilon: float, method: str) -> Mechanism:
    """The task's mechanism re-calibrated at ``epsilon``; a ``ValueError`` naming the family that cannot be."""
    if not callable(getattr(task.mechanism, "with_epsilon", None)):
        raise ValueError(
            f"{method}: {task.mechanism!r} has no with_epsilon, so epsilon= cannot re-calibrate it"
        )
    return task.mechanism.with_epsilon(float(epsilon))


def _check_counts(**counts: int) -> None:
    """Raise naming the first of ``counts`` that is not an integer >= 1 (:func:`check_integer`)."""
    for name, value in counts.items():
        check_integer(name, value)


def rejection_abc(
    task: Task,
    num_samples: int,
    y: Tensor | None = None,
    batch_size: int = 10_000,
    max_simulations: int = 10_000_000,
    seed: int | None = None,
    progress: bool = True,
) -> BaselineResult:
    """Exact i.i.d. draws ``(num_samples, dim_theta)`` from ``p(theta | y)`` (Gong, Alg. 1).

    Draws ``theta ~ prior``, ``s = task.simulate(theta)`` in batches of ``batch_size`` and accepts each with
    probability ``eta(y | s) / sup_s eta(y | s)`` until ``num_samples`` are accepted. Raises
    :class:`SimulationBudgetExceeded` after ``max_simulations`` simulations. ``info`` holds the acceptance
    rate and the log evidence ``log p(y) = log(acceptance rate) + log sup eta`` it implies.
    """
    method = "rejection_abc"
    task.require_mechanism_release(method)
    _check_counts(num_samples=num_samples, batch_size=batch_size, max_simulations=max_simulations)
    y = target_release(task, y, method)
    log_bound = task.mechanism.max_log_prob(y)
    accepted: list[Tensor] = []
    num_accepted = simulations = 0
    with seeded(seed), tqdm(total=num_samples, desc=method, disable=not progress) as bar:
        while num_accepted < num_samples:
            if simulations >= max_simulations:
                raise budget_error(method, max_simulations, num_accepted, num_samples, simulations)
            theta = task.prior.sample((min(batch_size, max_simulations - simulations),))
            log_accept = task.mechanism.log_prob(y, task.simulate(theta)) - log_bound
            keep = torch.rand_like(log_accept).log() < log_accept
            accepted.append(theta[keep])
            simulations += theta.shape[0]
            num_accepted += int(keep.sum())
            bar.update(min(int(keep.sum()), num_samples - bar.n))
            bar.set_postfix(acceptance=f"{num_accepted / simulations:.3g}", simulations=simulations)
    rate = num_accepted / simulations
    info = {"acceptance_rate": rate, "log_evidence": math.log(rate) + float(log_bound)}
    return BaselineResult(torch.cat(accepted)[:num_samples], simulations, info=info)


def abc_is(
    task: Task,
    num_simulations: int,
    proposal: Distribution | None = None,
    y: Tensor | None = None,
    batch_size: int = 100_000,
    seed: int | None = None,
    progress: bool = True,
    epsilon: float | None = None,
    simulations_per_draw: int = 1,
) -> BaselineResult:
    """Importance-sampling form of exact ABC (Gong, Sec. 3): ``num_simulations`` weighted draws.

    ``theta ~ proposal`` (default: the prior, a Distribution with event shape ``(dim_theta,)``),
    ``s = task.simulate(theta)``, weight ``prior(theta) / proposal(theta) * eta(y | s)``, normalized.
    Proposal draws outside the prior's support get weight zero and are not simulated. ``info`` holds the
    Kish ESS and the log evidence estimate ``log mean(unnormalized weights)``. ``simulations_per_draw``: each
    draw's ``eta(y | s)`` averaged over that many simulations (an unbiased likelihood estimate with less noise,
    so more ESS per draw where the proposal costs more than the simulator; ``num_simulations`` is then the
    number of draws, and the result's ``num_simulations`` counts every simulation). ``epsilon``: the release's
    privacy level where it is not the task's (``eta`` is the task's mechanism re-calibrated by ``with_epsilon``),
    e.g. to correct an amortized posterior's draws at that level: ``proposal=posterior.proposal(y,
    epsilon=epsilon)`` (:class:`~dpsbi.inference.proposal.DefensiveProposal`).
    """
    method = "abc_is"
    task.require_mechanism_release(method)
    _check_counts(
        num_simulations=num_simulations, batch_size=batch_size, simulations_per_draw=simulations_per_draw
    )
    y = target_release(task, y, method)
    proposal = task.prior if proposal is None else proposal
    batch_size = max(batch_size // simulations_per_draw, 1)
    mechanism = task.mechanism if epsilon is None else _at_epsilon(task, epsilon, method)
    if tuple(proposal.event_shape) != (task.dim_theta,):
        raise ValueError(
            f"{method}: proposal must have event shape ({task.dim_theta},), got {tuple(proposal.event_shape)}"
        )
    thetas, log_ws = [], []
    simulations = 0
    with seeded(seed), tqdm(total=num_simulations, desc=method, disable=not progress) as bar:
        for start in range(0, num_simulations, batch_size):
            theta = proposal.sample((min(batch_size, num_simulations - start),)).to(y)
            log_ratio = task.log_prior(theta) - proposal.log_prob(theta).to(y)
            thetas.append(theta)
            log_ws.append(
                mechanism_log_weights(
                    task, theta, log_ratio, y, mechanism=mechanism, repeats=simulations_per_draw
                )
            )
            simulations += int(torch.isfinite(log_ratio).sum()) * simulations_per_draw
            bar.update(theta.shape[0])
    log_w = torch.cat(log_ws)
    weights = normalize(log_w, method)
    info = {
        "ess": kish_ess(weights),
        "log_evidence": float(torch.logsumexp(log_w, 0)) - math.log(log_w.numel()),
    }
    return BaselineResult(torch.cat(thetas), simulations, weights=weights, info=info)
