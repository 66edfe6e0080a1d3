"""The Laplace mechanism."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import AdditiveNoise, Mechanism, check_positive, check_scale
from .epsilon import batched_copy, epsilons


class Laplace(AdditiveNoise, Mechanism):
    """``y = s + b * Lap(1)`` on every coordinate, with ``b = sensitivity / epsilon``.

    ``sensitivity`` is the L1 sensitivity of the whole ``dim``-dimensional statistic, so the
    release is ``epsilon``-DP.
    """

    #: :meth:`with_epsilon` also takes a tensor of epsilons (see :mod:`dpsbi.mechanisms.epsilon`).
    batched_epsilon = True

    def __init__(self, epsilon: float, sensitivity: float, dim: int = 1) -> None:
        super().__init__(dim, epsilon)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        self.scale = check_scale(
            "scale",
            self.sensitivity / self.epsilon,
            f"epsilon={self.epsilon:g}, sensitivity={self.sensitivity:g}",
        )

    @classmethod
    def from_scale(cls, scale: float, sensitivity: float, dim: int = 1) -> Laplace:
        """The mechanism with noise scale ``b = scale`` exactly; its ``epsilon`` is ``sensitivity / scale``."""
        scale = check_scale("scale", check_positive("scale", scale))
        mech = cls(check_positive("sensitivity", sensitivity) / scale, sensitivity, dim)
        mech.scale = scale
        return mech

    def with_epsilon(self, epsilon: float | Tensor) -> Laplace:
        """The same mechanism (sensitivity, dim) at another ``epsilon``: ``b = sensitivity / epsilon``. A tensor
        of epsilons broadcasting with the summaries gives one mechanism drawing each row at its own epsilon
        (:mod:`dpsbi.mechanisms.epsilon`)."""
        if not torch.is_tensor(epsilon):
            return type(self)(epsilon, self.sensitivity, self.dim)
        epsilon = epsilons(epsilon)
        return batched_copy(self, epsilon, scale=self.sensitivity / epsilon)

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        # Inverse CDF written on both halves so that neither side loses precision near 0 or 1.
        noise = torch.where(u < 0.5, torch.log(2 * u), -torch.log(2 * (1 - u)))
        return s + self.scale * noise

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        return (-(y - s).abs() / self.scale - math.log(2 * self.scale)).sum(-1)

    def max_log_prob(self, y: Tensor) -> Tensor:
        return torch.full(y.shape[:-1], -self.dim * math.log(2 * self.scale), dtype=y.dtype, device=y.device)

    def noise_log_prob(self, x: Tensor) -> Tensor:
        return -x.abs() / self.scale - math.log(2 * self.scale)

    def noise_log_cdf(self, x: Tensor) -> Tensor:
        z = x / self.scale
        return torch.where(
            z < 0, z.clamp(max=0) - math.log(2), torch.log1p(-0.5 * torch.exp(-z.clamp(min=0)))
        )

    def __repr__(self) -> str:
        return f"Laplace(dim={self.dim}, epsilon={self.epsilon:g}, sensitivity={self.sensitivity:g}, scale={self.scale:g})"
