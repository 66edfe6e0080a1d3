"""Binary responses (Alparslan & Yildirim, Ex. 4): ``X_i ~ Bern(theta)``, i = 1..n, released privately by

1. ``randomized_response``: every bit, kept with probability ``e^eps / (1 + e^eps)`` (local epsilon-DP);
2. ``gaussian_local``: every bit plus ``N(0, 1/eps^2)`` (local eps-Gaussian-DP);
3. ``noisy_mean``: the mean plus ``N(0, 1/(n eps)^2)`` (central eps-Gaussian-DP).

The paper compares their Fisher information (:func:`fisher_information_formula`: F_1, F_2, F_3) and gives no
prior, true value or release: the prior here is ``Beta(1, 1)``, theta* = 0.25 (the value of the paper's code
for its n-plot) and ``y_obs`` is simulated (seeded). With a Beta prior the exact posterior of every
mechanism is a mixture over the count ``j = sum_i x_i`` of ``Beta(a + j, b + n - j)`` (:func:`exact_posterior`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributions import Beta, Binomial, Categorical, Independent, MixtureSameFamily, biject_to

from ..mechanisms import Gaussian, Mechanism, RandomizedResponse
from . import register
from .base import observed_release
from .latent import LatentTask, ReparameterizedRecords, record_log_prob

MECHANISMS = ("randomized_response", "gaussian_local", "noisy_mean")
N_RECORDS = 100
TRUE_THETA = 0.25


@dataclass
class BernoulliRecords(ReparameterizedRecords):
    """``x = 1[z < theta]`` with ``z ~ U(0, 1)``; the value of a record is the bit itself."""

    n: int
    summarizer: Callable[[Tensor], Tensor]
    sequential: bool = False

    def latent(
        self, shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None = None
    ) -> Tensor:
        return torch.rand(shape + (1,), generator=generator, device=like.device, dtype=like.dtype)

    def records(self, z: Tensor, theta: Tensor) -> Tensor:
        return (z < theta[..., None, :]).to(z.dtype)

    def log_prob(self, x: Tensor, theta: Tensor) -> Tensor:
        p = theta[..., None, :]
        return (x * torch.log(p) + (1 - x) * torch.log1p(-p)).squeeze(-1)

    def values(self, x: Tensor) -> Tensor:
        return x.squeeze(-1)

    def summarize(self, values: Tensor) -> Tensor:
        return self.summarizer(values)


@dataclass
class BinomialMean:
    """Exact law of the mean of ``n`` bits: ``n s ~ Bin(n, theta)`` (a :class:`~dpsbi.tasks.latent.SummaryModel`)."""

    n: int

    def sample(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return torch.binomial(torch.full_like(theta, float(self.n)), theta, generator=generator) / self.n

    def log_prob(self, s: Tensor, theta: Tensor) -> Tensor:
        return Binomial(self.n, probs=theta, validate_args=False).log_prob(s * self.n).sum(-1)


def beta_mixture(log_coefficients: Tensor, a: float, b: float) -> MixtureSameFamily:
    """The posterior ``prop. theta^{a-1} (1-theta)^{b-1} sum_j c_j theta^j (1-theta)^{n-j}`` as a mixture of
    ``Beta(a + j, b + n - j)``, from ``log c_j`` of shape ``(n + 1,)``. Event shape ``(1,)``."""
    n = log_coefficients.shape[-1] - 1
    j = torch.arange(n + 1, dtype=torch.float64, device=log_coefficients.device)
    log_beta = torch.lgamma(a + j) + torch.lgamma(b + n - j) - math.lgamma(a + b + n)
    weights = torch.softmax(log_coefficients.double() + log_beta, 0)
    dtype = torch.get_default_dtype()
    components = Independent(Beta((a + j).to(dtype)[:, None], (b + n - j).to(dtype)[:, None]), 1)
    return MixtureSameFamily(Categorical(probs=weights.to(dtype)), components)


def record_coefficients(log_one: Tensor, log_zero: Tensor) -> Tensor:
    """``log c_j`` of ``prod_i (theta L1_i + (1 - theta) L0_i) = sum_j c_j theta^j (1-theta)^{n-j}`` from
    ``log L1, log L0`` of shape ``(n,)``: elementary symmetric sums, in log space (a loop over records)."""
    log_c = torch.full((log_one.shape[0] + 1,), -math.inf, dtype=torch.float64, device=log_one.device)
    log_c[0] = 0.0
    for l1, l0 in zip(log_one.double(), log_zero.double()):
        shifted = torch.cat([log_c.new_full((1,), -math.inf), log_c[:-1]])
        log_c = torch.logaddexp(log_c + l0, shifted + l1)
    return log_c


def exact_posterior(
    y: Tensor, mechanism: Mechanism, n: int, a: float = 1.0, b: float = 1.0
) -> MixtureSameFamily:
    """Exact ``p(theta | y)`` under the ``Beta(a, b)`` prior for a release of any of the three mechanisms."""
    y = torch.as_tensor(y, dtype=torch.get_default_dtype()).reshape(-1)
    if mechanism.dim == 1:  # noisy mean: c_j = C(n, j) eta(y | j / n)
        j = torch.arange(n + 1, dtype=y.dtype, device=y.device)
        log_choose = math.lgamma(n + 1) - torch.lgamma(j + 1) - torch.lgamma(n - j + 1)
        log_c = log_choose.double() + mechanism.log_prob(y[None, :], (j / n)[:, None]).double()
    else:
        log_c = record_coefficients(
            record_log_prob(mechanism, y, torch.ones_like(y)),
            record_log_prob(mechanism, y, torch.zeros_like(y)),
        )
    return beta_mixture(log_c, a, b)


def fisher_information_formula(theta: Tensor, epsilon: float, n: int, mechanism: str) -> Tensor:
    """The paper's Fisher information of the ``n`` releases, elementwise in ``theta``: F_1 (randomized
    response, exact), F_2 (``gaussian_local``) and F_3 (``noisy_mean``), the last two for the normal
    approximation ``N(theta, v / n)`` of the released mean, ``v = theta (1 - theta) + noise``:
    ``n / v + (1 - 2 theta)^2 / (2 v^2)``. (The paper's Ex. 4 and code drop the 1/2 of the variance term that
    its own Sec. 3.1 formula has; the difference is about 1 % at n = 100.)"""
    if mechanism == "randomized_response":
        alpha = math.tanh(epsilon / 2)  # (e^eps - 1) / (e^eps + 1)
        tau = alpha * theta + 1 / (1 + math.exp(epsilon))
        return n * alpha**2 / (tau * (1 - tau))
    noise = {"gaussian_local": 1 / epsilon**2, "noisy_mean": 1 / (n * epsilon**2)}[mechanism]
    var = theta * (1 - theta) + noise
    return n / var + (1 - 2 * theta) ** 2 / (2 * var**2)


@register("binary_responses")
def make(
    epsilon: float = 1.0,
    y_obs="simulate",
    seed: int = 0,
    mechanism: str = "randomized_response",
    n: int = N_RECORDS,
    true_theta: float = TRUE_THETA,
    prior_a: float = 1.0,
    prior_b: float = 1.0,
    delta: float = 1e-6,
) -> LatentTask:
    """``theta ~ Beta(prior_a, prior_b)``, ``n`` bits ``Bern(theta)`` released by ``mechanism`` (see module).
    Gaussian mechanisms are ``epsilon``-Gaussian-DP; ``delta`` is where they report their (epsilon, delta)."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}; choose one of {MECHANISMS}")
    dtype = torch.get_default_dtype()
    if mechanism == "noisy_mean":
        mech = Gaussian.gdp(epsilon, 1.0 / n, 1, delta=delta)
        summarizer = lambda bits: bits.mean(-1, keepdim=True)  # noqa: E731
    else:
        mech = (
            RandomizedResponse(epsilon, n)
            if mechanism == "randomized_response"
            else Gaussian.gdp(epsilon, 1.0, n, delta=delta)
        )
        summarizer = lambda bits: bits  # noqa: E731
    records = BernoulliRecords(n, summarizer, sequential=mechanism != "noisy_mean")
    prior = Independent(Beta(torch.tensor([prior_a], dtype=dtype), torch.tensor([prior_b], dtype=dtype)), 1)
    theta_true = torch.tensor([[true_theta]], dtype=dtype)

    def simulate_obs(generator: torch.Generator) -> Tensor:
        return mech.sample(records.simulate(theta_true, generator), generator=generator)

    return LatentTask(
        name="binary_responses",
        prior=prior,
        simulator=records.simulate,
        mechanism=mech,
        epsilon=epsilon,
        y_obs=observed_release("binary_responses", epsilon, y_obs, {}, simulate_obs, seed),
        true_theta=theta_true,
        transform=biject_to(prior.support),
        parameter_names=["theta"],
        exact_posterior=lambda y: exact_posterior(y, mech, n, prior_a, prior_b),
        summary_model=BinomialMean(n) if mechanism == "noisy_mean" else None,
        record_model=records,
        description=f"Binary responses (Alparslan-Yildirim Ex. 4): n={n} bits, {mechanism}.",
    )
