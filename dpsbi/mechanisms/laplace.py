"""The Laplace mechanism."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Mechanism, check_positive


class Laplace(Mechanism):
    """``y = s + b * Lap(1)`` on every coordinate, with ``b = sensitivity / epsilon``.

    ``sensitivity`` is the L1 sensitivity of the whole ``dim``-dimensional statistic, so the
    release is ``epsilon``-DP.
    """

    def __init__(self, epsilon: float, sensitivity: float, dim: int = 1) -> None:
        super().__init__(dim, epsilon)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        self.scale = self.sensitivity / self.epsilon

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        # Inverse CDF written on both halves so that neither side loses precision near 0 or 1.
        noise = torch.where(u < 0.5, torch.log(2 * u), -torch.log(2 * (1 - u)))
        return s + self.scale * noise

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        return (-(y - s).abs() / self.scale - math.log(2 * self.scale)).sum(-1)

    def max_log_prob(self, y: Tensor) -> Tensor:
        return torch.full(y.shape[:-1], -self.dim * math.log(2 * self.scale), dtype=y.dtype, device=y.device)

    def __repr__(self) -> str:
        return f"Laplace(dim={self.dim}, epsilon={self.epsilon:g}, sensitivity={self.sensitivity:g}, scale={self.scale:g})"
