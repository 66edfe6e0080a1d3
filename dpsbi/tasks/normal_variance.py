"""Variance of a normal population from a private statistic (Alparslan & Yildirim, Ex. 2 and Sec. 5).

Records ``X_i ~ N(0, theta)`` clamped to ``[-A, A]`` (A = 10, n = 100, theta* = 2); each record's value is
``|X_i|^a``. Releases (option ``statistic`` / ``release``):

- ``mean`` (additive): ``mean |X_i|^a`` plus Laplace or Gaussian noise of scale ``A^a / (n epsilon)``
  (Gaussian: epsilon-Gaussian-DP, as in the paper; Sec. 5.1-5.3);
- ``median`` / ``max`` (non-additive) with Laplace noise scaled by the smooth sensitivity, ``delta = 1/n^2``
  (Sec. 5.4, epsilon = 5);
- ``release='sequential'`` (local DP): every ``|X_i|^a`` with its own noise of scale ``A^a / epsilon`` (Sec. 5.5).

Prior: the paper's runs use a flat prior on theta > 0 (improper; its PMMH/MHAAR code moves log theta without
the Jacobian, i.e. flat in log theta). Here it is made proper as ``Uniform(0, A^2)``: the clamped data cannot
have a variance above ``A^2``. The paper gives no releases, so ``y_obs`` is simulated (seeded) from theta*.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributions import Independent, Normal, Uniform, biject_to

from ..mechanisms import Gaussian, Laplace, Mechanism
from ..mechanisms.smooth_laplace import SmoothSensitivityLaplace
from . import register
from .base import observed_release
from .latent import GaussianCLT, LatentTask, ReparameterizedRecords

N_RECORDS = 100
BOUND = 10.0
TRUE_THETA = 2.0


def abs_moments(theta: Tensor, power: float) -> tuple[Tensor, Tensor]:
    """Mean ``(..., 1)`` and variance ``(..., 1, 1)`` of ``|X|^power`` for ``X ~ N(0, theta)`` (Ex. 2):
    ``(2 theta)^{a/2} Gamma((a+1)/2) / sqrt(pi)`` and ``(2 theta)^a [Gamma(a + 1/2) / sqrt(pi) - Gamma((a+1)/2)^2 / pi]``.
    The clamping at ``+-A`` is ignored (its mass ``P(|X| > 10)`` is below 1e-11 for theta <= 2.5)."""
    a = float(power)
    g1 = math.exp(math.lgamma((a + 1) / 2)) / math.sqrt(math.pi)
    g2 = math.exp(math.lgamma(a + 0.5)) / math.sqrt(math.pi)
    mean = (2 * theta) ** (a / 2) * g1
    var = (2 * theta) ** a * (g2 - g1**2)
    return mean, var[..., None]


@dataclass
class ClampedNormalRecords(ReparameterizedRecords):
    """``x = clamp(sqrt(theta) z, -bound, bound)`` with ``z ~ N(0, 1)``; values ``|x|^power``; the mechanism's
    summary of the ``n`` values is ``summarizer(values)``."""

    n: int
    bound: float
    power: float
    summarizer: Callable[[Tensor], Tensor]
    sequential: bool = False

    def latent(
        self, shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None = None
    ) -> Tensor:
        return torch.randn(shape + (1,), generator=generator, device=like.device, dtype=like.dtype)

    def records(self, z: Tensor, theta: Tensor) -> Tensor:
        return (theta[..., None, :].sqrt() * z).clamp(-self.bound, self.bound)

    def log_prob(self, x: Tensor, theta: Tensor) -> Tensor:
        """Normal density inside ``(-bound, bound)``; at ``+-bound`` the clamped mass ``Phi(-bound / sqrt(theta))``."""
        sd = theta[..., None, :].sqrt()
        inside = Normal(0.0, sd, validate_args=False).log_prob(x)
        edge = torch.special.log_ndtr(-self.bound / sd).expand_as(inside)
        return torch.where(x.abs() >= self.bound, edge, inside).squeeze(-1)

    def values(self, x: Tensor) -> Tensor:
        return x.squeeze(-1).abs() ** self.power

    def summarize(self, values: Tensor) -> Tensor:
        return self.summarizer(values)


def _mechanism(
    statistic: str, release: str, noise: str, epsilon: float, delta: float | None, n: int, top: float
) -> Mechanism:
    """The release mechanism of the chosen statistic; ``top = A^a`` bounds a record's value."""
    if statistic in ("median", "max"):
        if noise != "laplace":
            raise ValueError(
                f"the {statistic} is released with smooth-sensitivity Laplace noise; got noise={noise!r}"
            )
        return SmoothSensitivityLaplace(epsilon, 1 / n**2 if delta is None else delta, top, n, statistic)
    dim, sensitivity = (n, top) if release == "sequential" else (1, top / n)
    if noise == "laplace":
        return Laplace(epsilon, sensitivity, dim)
    if noise == "gaussian":
        return Gaussian.gdp(epsilon, sensitivity, dim, **({} if delta is None else {"delta": delta}))
    raise ValueError(f"unknown noise {noise!r}; choose 'laplace' or 'gaussian'")


@register("normal_variance")
def make(
    epsilon: float = 5.0,
    y_obs="simulate",
    seed: int = 0,
    statistic: str = "mean",
    power: float = 1.0,
    noise: str = "laplace",
    release: str = "batch",
    n: int = N_RECORDS,
    bound: float = BOUND,
    true_theta: float = TRUE_THETA,
    delta: float | None = None,
) -> LatentTask:
    """``theta ~ Uniform(0, bound^2)``, ``n`` records ``clamp(N(0, theta), -bound, bound)``, value ``|x|^power``;
    ``statistic`` in ``mean | median | max`` (batch) or ``release='sequential'`` (every value, local DP).
    ``delta`` is the smooth-sensitivity delta (default ``1/n^2``) or the delta at which a Gaussian-DP
    mechanism reports its (epsilon, delta)."""
    if statistic not in ("mean", "median", "max"):
        raise ValueError(f"unknown statistic {statistic!r}; choose 'mean', 'median' or 'max'")
    if release not in ("batch", "sequential"):
        raise ValueError(f"unknown release {release!r}; choose 'batch' or 'sequential'")
    if release == "sequential" and statistic != "mean":
        raise ValueError("a sequential release shares every record's value; leave statistic='mean'")
    if not (power > 0 and bound > 0 and n >= 1):
        raise ValueError(f"need power > 0, bound > 0 and n >= 1, got power={power}, bound={bound}, n={n}")
    dtype = torch.get_default_dtype()
    mechanism = _mechanism(statistic, release, noise, epsilon, delta, n, bound**power)
    if statistic != "mean":
        summarizer = mechanism.summarize
    elif release == "sequential":
        summarizer = lambda values: values  # noqa: E731
    else:
        summarizer = lambda values: values.mean(-1, keepdim=True)  # noqa: E731
    records = ClampedNormalRecords(n, bound, power, summarizer, sequential=release == "sequential")
    additive = statistic == "mean" and release == "batch"
    prior = Independent(Uniform(torch.zeros(1, dtype=dtype), torch.full((1,), bound**2, dtype=dtype)), 1)
    theta_true = torch.tensor([[true_theta]], dtype=dtype)

    def simulate_obs(generator: torch.Generator) -> Tensor:
        return mechanism.sample(records.simulate(theta_true, generator), generator=generator)

    label = "sequential" if release == "sequential" else statistic
    return LatentTask(
        name="normal_variance",
        prior=prior,
        simulator=records.simulate,
        mechanism=mechanism,
        epsilon=epsilon,
        y_obs=observed_release("normal_variance", epsilon, y_obs, {}, simulate_obs, seed),
        true_theta=theta_true,
        transform=biject_to(prior.support),
        parameter_names=["theta"],
        summary_model=GaussianCLT(lambda theta: abs_moments(theta, power), n) if additive else None,
        record_model=records,
        description=f"Normal variance (Alparslan-Yildirim): {label} of |x|^{power:g}, {noise} noise, n={n}.",
    )
