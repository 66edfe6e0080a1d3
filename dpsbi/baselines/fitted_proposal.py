"""A proposal fitted to weighted draws: a Gaussian mixture in the task's unconstrained space with the draws'
weighted mean and covariance, mapped onto the prior's support. The references refit their importance samplers
with it (wide components, so that weights stay bounded) and :func:`~dpsbi.baselines.corrected` draws its adapted
second stage from it (one component at the draws' own spread)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributions import (
    Categorical,
    Distribution,
    MixtureSameFamily,
    MultivariateNormal,
    TransformedDistribution,
)

from ..tasks import Task

#: The references' components: ``0.8 N(m, 1.5^2 C) + 0.2 N(m, 3^2 C)``, wider than the posterior.
WIDE = ((1.5, 3.0), (0.8, 0.2))


def covariance_supported(ess: float, dim: int) -> bool:
    """Whether weighted draws of effective sample size ``ess`` support a covariance in ``dim`` unconstrained
    dimensions (at least two effective draws per dimension): where :func:`fitted_proposal` and
    :func:`~dpsbi.baselines.smoothed_resample` may use theirs."""
    return ess >= 2 * dim


def unconstrained_moments(
    task: Task, samples: Tensor, weights: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Weighted draws ``samples (n, dim_theta)`` in the task's unconstrained space, in float64: the points
    ``z (n, dim)``, the normalised weights ``(n,)``, and their weighted mean ``(dim,)`` and covariance ``(dim, dim)``."""
    z = task.transform.inv(samples).double()
    w = weights.double() / weights.double().sum()
    mean = (w[:, None] * z).sum(0)
    centred = z - mean
    return z, w, mean, (w[:, None] * centred).T @ centred


def fitted_proposal(
    task: Task,
    samples: Tensor,
    weights: Tensor,
    components: tuple[tuple[float, ...], tuple[float, ...]] = WIDE,
) -> Distribution:
    """A proposal over ``(dim_theta,)`` that covers weighted draws ``samples (n, dim_theta)``: in the task's
    unconstrained space ``sum_k share_k N(m, scale_k^2 C)``, ``(scales, shares) = components``, with ``(m, C)`` the
    draws' weighted mean and covariance, mapped back by ``task.transform``; in ``samples``' dtype. Draws of weight
    zero are left out (they may sit on the support's edge, where the inverse transform is infinite)."""
    scales, shares = components
    keep = weights > 0
    z, _, mean, cov = unconstrained_moments(task, samples[keep], weights[keep])
    cov = cov + 1e-9 * torch.eye(z.shape[1], dtype=z.dtype, device=z.device)
    tril = torch.linalg.cholesky(cov).to(samples.dtype)
    scale = torch.tensor(scales, dtype=samples.dtype, device=z.device)[:, None, None]
    gaussians = MultivariateNormal(mean.to(samples.dtype).expand(len(scales), -1), scale_tril=scale * tril)
    mixture = MixtureSameFamily(
        Categorical(torch.tensor(shares, dtype=samples.dtype, device=z.device)), gaussians
    )
    return TransformedDistribution(mixture, [task.transform])
