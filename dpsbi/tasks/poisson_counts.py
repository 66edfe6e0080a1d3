"""Gong's Example 4: a Poisson count released with Laplace noise; its exact posterior is a Gamma mixture.

``noise="discrete_laplace"`` releases the count as deployed systems do (OpenDP's ``make_geometric``, Tumult's
integer noise): an integer, two-sided geometric noise of the same scale. On integer releases its pmf is the Laplace
density up to a constant factor, so the exact posterior is the same Gamma mixture. ``noise="discrete_gaussian"``
releases it with OpenDP's Gaussian on integers: discrete Gaussian noise, the smallest sigma exactly ``(epsilon,
1e-6)``-DP (CKS Thm. 7); the posterior is again a Gamma mixture, weighted by that pmf."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions import Categorical, ExpTransform, Gamma, Independent, MixtureSameFamily

from ..mechanisms import DiscreteGaussian, DiscreteLaplace, Laplace, Mechanism
from . import register
from .base import Task, observed_release

STORED = {0.2: [37.4]}
#: The discrete Gaussian's delta.
DELTA = 1e-6
#: The release mechanisms, by ``noise``: each ``(epsilon) -> mechanism`` of sensitivity 1.
NOISE = {
    "laplace": lambda eps: Laplace(eps, 1.0, 1),
    "discrete_laplace": lambda eps: DiscreteLaplace(eps, 1, 1),
    "discrete_gaussian": lambda eps: DiscreteGaussian(eps, DELTA, 1),
}


def _weights(y: float, shape: float, rate: float, noise: Mechanism, s_max: int) -> tuple[Tensor, Tensor]:
    """Counts ``s = 0..s_max`` and their posterior probabilities given release ``y`` of ``noise``."""
    s = torch.arange(s_max + 1, dtype=torch.float64)
    q = 1 / (1 + rate)  # s ~ NegBin(shape, q): the prior predictive of a Poisson-Gamma count
    log_marginal = (
        torch.lgamma(shape + s)
        - math.lgamma(shape)
        - torch.lgamma(s + 1)
        + shape * math.log1p(-q)
        + s * math.log(q)
    )
    logw = log_marginal + noise.noise_log_prob(y - s)
    return s, torch.softmax(logw, 0)


def exact_posterior(
    y: Tensor, epsilon: float = 0.2, shape: float = 25.0, rate: float = 1.0, noise: str = "laplace"
) -> MixtureSameFamily:
    """Exact ``p(theta | y)``: the mixture over counts s of ``Gamma(shape + s, rate + 1)`` with weights ``p(s)
    p(y - s)``, ``p`` the noise's density or pmf (:data:`NOISE`). The sum runs to ``y`` plus 60 / ``epsilon``
    (60 Laplace scales, 11 discrete-Gaussian sigmas) and is truncated where the weights fall below 1e-300. Event
    shape ``(1,)``."""
    y0 = float(torch.as_tensor(y).reshape(-1)[0])
    s_max = int(max(y0, 0) + 60 / epsilon + 10 * shape / rate + 200)
    s, w = _weights(y0, shape, rate, NOISE[noise](epsilon), s_max)
    keep = w > 1e-300
    dtype = torch.get_default_dtype()
    components = Independent(
        Gamma(
            (shape + s[keep]).to(dtype)[:, None], torch.full((int(keep.sum()), 1), rate + 1.0, dtype=dtype)
        ),
        1,
    )
    return MixtureSameFamily(Categorical(probs=w[keep].to(dtype)), components)


def exact_log_likelihood(theta: Tensor, y: Tensor, epsilon: float = 0.2, noise: str = "laplace") -> Tensor:
    """``log p(y | theta) = log sum_s Pois(s; theta) p(y - s)`` for theta of shape ``(n, 1)``, ``p`` the noise's
    density or pmf (:data:`NOISE`); shape ``(n,)``. The sum over counts runs to ``y + 60 / epsilon`` plus the largest
    theta, 20 sds of its count and 50."""
    y0 = float(torch.as_tensor(y).reshape(-1)[0])
    theta = theta.double().reshape(-1, 1)
    top = theta.max().item()
    s_max = int(max(y0, 0) + 60 / epsilon + top + 20 * math.sqrt(top + 1) + 50)
    s = torch.arange(s_max + 1, dtype=torch.float64)
    log_pois = s * torch.log(theta) - theta - torch.lgamma(s + 1)
    return torch.logsumexp(log_pois + NOISE[noise](epsilon).noise_log_prob(y0 - s), dim=-1)


@register("poisson_counts")
def make(
    epsilon: float = 0.2,
    y_obs=None,
    seed: int = 0,
    shape: float = 25.0,
    rate: float = 1.0,
    true_theta: float = 25.0,
    noise: str = "laplace",
) -> Task:
    """``theta ~ Gamma(shape, rate)``, ``s ~ Poisson(theta)``, noise of sensitivity 1: ``noise="laplace"`` (Gong's),
    ``"discrete_laplace"`` or ``"discrete_gaussian"`` (integer releases; no stored release: ``y_obs`` defaults to
    one simulated)."""
    if noise not in NOISE:
        raise ValueError(f"poisson_counts: noise must be one of {sorted(NOISE)}, got {noise!r}")
    dtype = torch.get_default_dtype()
    prior = Independent(Gamma(torch.tensor([shape], dtype=dtype), torch.tensor([rate], dtype=dtype)), 1)
    mechanism = NOISE[noise](epsilon)
    if noise != "laplace" and y_obs is None:
        y_obs = "simulate"
    theta_true = torch.tensor([[true_theta]], dtype=dtype)

    def simulator(theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return torch.poisson(theta, generator=generator)

    def simulate_obs(generator: torch.Generator) -> Tensor:
        return mechanism.sample(simulator(theta_true, generator), generator=generator)

    return Task(
        name="poisson_counts",
        prior=prior,
        simulator=simulator,
        mechanism=mechanism,
        epsilon=epsilon,
        y_obs=observed_release(
            "poisson_counts", epsilon, y_obs, STORED if noise == "laplace" else {}, simulate_obs, seed
        ),
        true_theta=theta_true if isinstance(y_obs, str) else None,
        transform=ExpTransform(),
        parameter_names=["theta"],
        exact_posterior=lambda y: exact_posterior(y, epsilon, shape, rate, noise),
        statistic_bounds=[[0.0], [math.inf]],  # a count
        description=f"Gong (Ex. 4): Poisson count with {noise.replace('_', ' ')} noise; exact posterior is a Gamma mixture.",
    )
