"""A conjugate Gaussian toy whose private posterior is Gaussian in closed form (test oracle)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributions import Independent, MultivariateNormal, Normal

from ..mechanisms import Gaussian
from . import register
from .base import Task, observed_release


def exact_posterior(y: Tensor, noise_var: float, mechanism_var: float, dim: int) -> MultivariateNormal:
    """``theta | y`` for ``theta ~ N(0, I)``, ``s ~ N(theta, noise_var I)``, ``y ~ N(s, mechanism_var I)``."""
    total = noise_var + mechanism_var
    y = torch.as_tensor(y, dtype=torch.get_default_dtype()).reshape(-1, dim)[0]
    return MultivariateNormal(y / (1 + total), torch.eye(dim, dtype=y.dtype) * total / (1 + total))


@register("conjugate_gaussian")
def make(
    epsilon: float = 1.0,
    y_obs="simulate",
    seed: int = 0,
    dim: int = 2,
    noise_sd: float = 1.0,
    sensitivity: float = 1.0,
    delta: float = 1e-5,
) -> Task:
    """``theta ~ N(0, I_dim)``, ``s | theta ~ N(theta, noise_sd^2 I)``, analytic Gaussian mechanism."""
    dtype = torch.get_default_dtype()
    prior = Independent(Normal(torch.zeros(dim, dtype=dtype), torch.ones(dim, dtype=dtype)), 1)
    mechanism = Gaussian(epsilon, delta, sensitivity, dim=dim)
    theta_true = torch.full((1, dim), 0.5, dtype=dtype)

    def simulator(theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return theta + noise_sd * torch.randn(
            theta.shape, generator=generator, device=theta.device, dtype=theta.dtype
        )

    def simulate_obs(generator: torch.Generator) -> Tensor:
        return mechanism.sample(simulator(theta_true, generator), generator=generator)

    return Task(
        name="conjugate_gaussian",
        prior=prior,
        simulator=simulator,
        mechanism=mechanism,
        epsilon=epsilon,
        y_obs=observed_release("conjugate_gaussian", epsilon, y_obs, {}, simulate_obs, seed),
        true_theta=theta_true,
        parameter_names=[f"theta_{i + 1}" for i in range(dim)],
        exact_posterior=lambda y: exact_posterior(y, noise_sd**2, mechanism.sigma**2, dim),
        description="Gaussian prior, Gaussian summary, Gaussian mechanism: closed-form private posterior.",
    )
