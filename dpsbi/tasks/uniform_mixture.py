"""The ABCDP toy (Park et al. 2021, Sec. 6.1): mixing proportions of a mixture of uniforms.

``theta ~ Dirichlet(1, ..., 1)`` in 5 dimensions and each of ``n_obs = 5000`` observations is drawn from
``sum_i theta_i U[i-1, i]``; ``theta* = (0.25, 0.04, 0.33, 0.04, 0.34)``.

How it fits the :class:`~dpsbi.tasks.Task` interface. ABCDP compares whole datasets by the MMD of a
Gaussian kernel ``k(x, x') = exp(-(x - x')^2 / (2 l^2))`` whose bandwidth ``l`` comes from the median
heuristic on simulated (public) data. Here the kernel is replaced by its Gauss-Hermite quadrature over
the kernel's spectral measure, ``k~(x, x') = sum_j a_j cos(w_j (x - x'))`` with ``a_j > 0``,
``sum_j a_j = 1`` (the ``num_frequencies`` positive nodes ``w_j`` of a symmetric rule); with the default 10
and the median-heuristic bandwidth (about 1.18), ``|k~ - k| < 1e-6`` on the data's range, ``|x - x'| <= 5``. ``k~`` has the finite feature
map ``phi(x) = (sqrt(a_j) cos(w_j x), sqrt(a_j) sin(w_j x))_j`` with ``|phi(x)| = 1``, so

- the task's confidential summary is the empirical mean embedding ``s = mean_i phi(x_i)``,
  of dimension ``2 * num_frequencies``;
- the Euclidean distance ``|s - s'|_2`` *is* the (biased, not squared) MMD of ``k~`` between the two
  datasets, which is what ABCDP thresholds;
- ``k~ <= 1``, so by Park et al.'s Lemma 1 replacing one observation moves ``s`` (and hence the distance)
  by at most ``2 / n_obs`` in L2.

The release ``y_obs`` (used by SPPE, SPLE, rejection ABC, ...) is the Gaussian mechanism on ``s`` with that
L2 sensitivity ``2 / n_obs`` at ``(epsilon, delta)``. ABCDP instead runs on the data holder's side: it needs
the confidential ``s_obs`` (kept on the task when the observation is simulated) and spends its own budget.
"""

from __future__ import annotations

import math

import torch
from numpy.polynomial.hermite import hermgauss
from torch import Tensor
from torch.distributions import Dirichlet, StickBreakingTransform

from ..mechanisms import Gaussian
from . import register
from .base import Task, observed_release

TRUE_THETA = [0.25, 0.04, 0.33, 0.04, 0.34]
N_OBS = 5000
#: Elements of the (rows, observations, frequencies) work tensor per chunk of the simulator.
_CHUNK_ELEMENTS = 2**22


def sample_mixture(theta: Tensor, n_obs: int, generator: torch.Generator | None = None) -> Tensor:
    """``n_obs`` draws from ``sum_i theta_i U[i-1, i]`` for each row of ``theta (B, K)``; shape ``(B, n_obs)``."""
    opts = dict(generator=generator, device=theta.device, dtype=theta.dtype)
    pick, offset = torch.rand(2, theta.shape[0], n_obs, **opts)
    component = torch.searchsorted(theta.cumsum(-1).contiguous(), pick.contiguous(), right=True)
    return component.clamp(max=theta.shape[-1] - 1).to(theta.dtype) + offset


def spectral_quadrature(bandwidth: float, num_frequencies: int) -> tuple[Tensor, Tensor]:
    """Frequencies ``w (J,)`` and weights ``a (J,)`` (summing to 1) with ``sum_j a_j cos(w_j r)`` approximating
    ``exp(-r^2 / (2 bandwidth^2))``: the positive half of a ``2J``-node Gauss-Hermite rule."""
    nodes, weights = hermgauss(2 * num_frequencies)
    positive = nodes > 0
    dtype = torch.get_default_dtype()
    frequencies = torch.as_tensor(math.sqrt(2.0) * nodes[positive] / bandwidth, dtype=dtype)
    return frequencies, torch.as_tensor(2.0 * weights[positive] / math.sqrt(math.pi), dtype=dtype)


def mean_embedding(x: Tensor, frequencies: Tensor, weights: Tensor) -> Tensor:
    """Mean feature ``mean_i phi(x_i)`` of datasets ``x (B, n)`` (1-d observations); shape ``(B, 2J)``."""
    phase = x[..., None] * frequencies.to(x)
    scale = weights.to(x).sqrt()
    return torch.cat([phase.cos().mean(-2) * scale, phase.sin().mean(-2) * scale], -1)


def median_bandwidth(num_datasets: int = 100, n_obs: int = 200, seed: int = 0) -> float:
    """Median heuristic on prior-predictive data (public): the median over simulated datasets of the
    median pairwise distance between their observations."""
    generator = torch.Generator().manual_seed(seed)
    gaps = -torch.rand(num_datasets, 5, generator=generator, dtype=torch.float64).log()
    theta = gaps / gaps.sum(-1, keepdim=True)  # Dirichlet(1, ..., 1): normalized exponentials
    x = sample_mixture(theta, n_obs, generator)
    upper = torch.triu_indices(n_obs, n_obs, offset=1)
    pairwise = (x[:, :, None] - x[:, None, :]).abs()[:, upper[0], upper[1]]
    return float(pairwise.median(-1).values.median())


@register("uniform_mixture")
def make(
    epsilon: float = 1.0,
    y_obs="simulate",
    seed: int = 0,
    n_obs: int = N_OBS,
    num_frequencies: int = 10,
    bandwidth: float | None = None,
    delta: float = 1e-5,
) -> Task:
    """``theta ~ Dir(1_5)``, ``n_obs`` draws of ``sum_i theta_i U[i-1, i]``, summarized by their mean embedding
    (see the module docstring); release by the Gaussian mechanism with L2 sensitivity ``2 / n_obs``."""
    if int(n_obs) < 1 or int(num_frequencies) < 1 or (bandwidth is not None and not bandwidth > 0):
        raise ValueError(
            f"need n_obs >= 1, num_frequencies >= 1 and bandwidth > 0, got {n_obs}, {num_frequencies}, {bandwidth}"
        )
    dtype = torch.get_default_dtype()
    prior = Dirichlet(torch.ones(5, dtype=dtype))
    frequencies, weights = spectral_quadrature(bandwidth or median_bandwidth(), num_frequencies)
    mechanism = Gaussian(epsilon, delta, sensitivity=2.0 / n_obs, dim=2 * num_frequencies)
    theta_true = torch.tensor([TRUE_THETA], dtype=dtype)
    rows = max(1, _CHUNK_ELEMENTS // (n_obs * num_frequencies))

    def simulator(theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        chunks = [
            mean_embedding(sample_mixture(t, n_obs, generator), frequencies, weights)
            for t in theta.split(rows)
        ]
        return torch.cat(chunks)

    generator = torch.Generator().manual_seed(seed)
    simulated = isinstance(y_obs, str)
    s_obs = simulator(theta_true, generator) if simulated else None

    def release_obs(_: torch.Generator) -> Tensor:  # the release noise continues the data's random stream
        return mechanism.sample(s_obs, generator=generator)

    return Task(
        name="uniform_mixture",
        prior=prior,
        simulator=simulator,
        mechanism=mechanism,
        epsilon=epsilon,
        y_obs=observed_release("uniform_mixture", epsilon, y_obs, {}, release_obs, seed),
        true_theta=theta_true if simulated else None,
        s_obs=s_obs,
        transform=StickBreakingTransform(),
        parameter_names=[f"theta_{i + 1}" for i in range(5)],
        description="ABCDP toy: Dirichlet weights of 5 uniforms; the draws are summarized by a Gaussian-kernel mean embedding.",
    )
