"""Latent-variable views of a task's confidential data, for the MCMC of Alparslan & Yildirim that updates them.

- A :class:`SummaryModel` has a tractable law ``f(s | theta)`` of the summary (Alg. 1, 4, 5, 6): the exact
  law where there is one (:class:`PoissonCount`), or the CLT approximation of an additive statistic
  ``s = mean_i t(x_i)``, ``s ~ N(mu(theta), Sigma(theta) / n)`` (:class:`GaussianCLT`).
- A :class:`ReparameterizedRecords` model writes the ``n`` records as ``x_t = phi_theta(z_t)`` with
  ``z_t ~ mu`` free of theta (Alg. 2, 3, 7, 8) and says which summary of the records the mechanism sees.

A :class:`LatentTask` is a :class:`Task` that carries these models.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor
from torch.distributions import MultivariateNormal, Normal, Poisson

from ..mechanisms import Gaussian, Laplace, Mechanism, RandomizedResponse
from .base import Task

#: Mechanisms that act on each coordinate of the summary independently (one record per coordinate).
PER_COORDINATE = (Laplace, Gaussian, RandomizedResponse)


class SummaryModel(Protocol):
    """Tractable law ``f(s | theta)`` of the confidential summary. Shapes: ``theta (..., dim_theta)``,
    ``s (..., dim_s)``; ``log_prob`` must be differentiable in ``theta`` (Fisher scores)."""

    def sample(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One summary ``(..., dim_s)`` per row of ``theta (..., dim_theta)``."""
        ...

    def log_prob(self, s: Tensor, theta: Tensor) -> Tensor:
        """``log f(s | theta)``; ``s`` and ``theta`` broadcast over their batch dimensions."""
        ...


@dataclass
class GaussianCLT:
    """``s = mean of n records' t(x)`` approximated by ``N(mu(theta), Sigma(theta) / n)``; ``moments(theta)``
    returns the per-record ``mu (..., k)`` and ``Sigma (..., k, k)`` of ``t(x)``."""

    moments: Callable[[Tensor], tuple[Tensor, Tensor]]
    n: int

    def mean_cov(self, theta: Tensor) -> tuple[Tensor, Tensor]:
        """Mean ``(..., k)`` and covariance ``(..., k, k)`` of the summary."""
        mu, sigma = self.moments(theta)
        return mu, sigma / self.n

    def sample(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        mean, cov = self.mean_cov(theta)
        z = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        if mean.shape[-1] == 1:
            return mean + cov[..., 0].sqrt() * z
        return mean + (torch.linalg.cholesky(cov) @ z[..., None]).squeeze(-1)

    def log_prob(self, s: Tensor, theta: Tensor) -> Tensor:
        return gaussian_log_prob(s, *self.mean_cov(theta))


def gaussian_log_prob(x: Tensor, mean: Tensor, cov: Tensor) -> Tensor:
    """``log N(x; mean, cov)`` for ``x, mean (..., k)`` and ``cov (..., k, k)`` (broadcasting); one-dimensional
    ``x`` skips the batched triangular solves of ``MultivariateNormal``, which are slow for many 1 x 1 blocks."""
    if x.shape[-1] == 1:
        return Normal(mean[..., 0], cov[..., 0, 0].sqrt(), validate_args=False).log_prob(x[..., 0])
    return MultivariateNormal(mean, cov, validate_args=False).log_prob(x)


class PoissonCount:
    """The exact law of the ``poisson_counts`` summary: ``s ~ Poisson(theta)``."""

    def sample(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return torch.poisson(theta, generator=generator)

    def log_prob(self, s: Tensor, theta: Tensor) -> Tensor:
        return Poisson(theta, validate_args=False).log_prob(s).sum(-1)


class ReparameterizedRecords(abc.ABC):
    """``n`` i.i.d. records ``x_t = phi_theta(z_t)`` with ``z_t ~ mu`` (free of theta), and the summary of the
    records that the task's mechanism consumes.

    Shapes: latents ``z (..., m, latent_dim)``, records ``x (..., m, record_dim)`` for any number ``m`` of
    records, ``theta (..., dim_theta)`` broadcasting over the leading dimensions. ``sequential`` says the
    summary is the per-record vector ``(t(x_1), .., t(x_n))``, released record by record (local DP).
    """

    n: int
    sequential: bool = False

    @abc.abstractmethod
    def latent(
        self, shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None = None
    ) -> Tensor:
        """Draws ``z ~ mu`` of shape ``shape + (latent_dim,)`` on ``like``'s device and dtype."""

    @abc.abstractmethod
    def records(self, z: Tensor, theta: Tensor) -> Tensor:
        """``phi_theta(z)``: records ``(..., m, record_dim)``."""

    @abc.abstractmethod
    def log_prob(self, x: Tensor, theta: Tensor) -> Tensor:
        """``log p(x_t | theta)`` per record, ``(..., m)``; differentiable in ``theta``."""

    @abc.abstractmethod
    def values(self, x: Tensor) -> Tensor:
        """Each record's value ``t(x_t)``, ``(..., m)``."""

    @abc.abstractmethod
    def summarize(self, values: Tensor) -> Tensor:
        """The summary ``(..., input_dim)`` of the mechanism from ``n`` values ``(..., n)``."""

    def summary(self, x: Tensor) -> Tensor:
        """The summary of records ``x (..., n, record_dim)``."""
        return self.summarize(self.values(x))

    def sample(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``n`` records per row of ``theta (B, dim_theta)``: ``(B, n, record_dim)``."""
        return self.records(self.latent((theta.shape[0], self.n), theta, generator), theta)

    def simulate(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The summary of fresh records, ``(B, input_dim)``: a task's simulator."""
        return self.summary(self.sample(theta, generator))


@dataclass(repr=False)
class LatentTask(Task):
    """A task that also carries the latent-variable models of its data (``None`` where it has none)."""

    summary_model: SummaryModel | None = None
    record_model: ReparameterizedRecords | None = None


def record_log_prob(mechanism: Mechanism, y: Tensor, values: Tensor) -> Tensor:
    """``log eta(y_t | t(x_t))`` of each coordinate of a per-record release, without the sum over records:
    ``y`` and ``values`` broadcast to ``(..., m)``, result ``(..., m)``."""
    if not isinstance(mechanism, PER_COORDINATE):
        raise ValueError(
            f"a record-by-record release needs a per-coordinate mechanism {PER_COORDINATE}, got {mechanism!r}"
        )
    return mechanism.coordinate_log_prob(y, values)  # elementwise: log_prob takes dim coordinates only


def summary_model_of(task: Task, model: SummaryModel | None, method: str) -> SummaryModel:
    """``model``, else the task's summary model; ``ValueError`` naming ``method`` when there is none."""
    model = getattr(task, "summary_model", None) if model is None else model
    if model is None:
        raise ValueError(
            f"{method} needs a tractable law of the summary; task {task.name!r} has none: pass model=<SummaryModel>"
        )
    return model


def record_model_of(task: Task, model: ReparameterizedRecords | None, method: str) -> ReparameterizedRecords:
    """``model``, else the task's record model; ``ValueError`` naming ``method`` when there is none."""
    model = getattr(task, "record_model", None) if model is None else model
    if not isinstance(model, ReparameterizedRecords):
        raise ValueError(
            f"{method} needs a record-level model x = phi_theta(z); task {task.name!r} has none: "
            "pass model=<ReparameterizedRecords>"
        )
    return model
