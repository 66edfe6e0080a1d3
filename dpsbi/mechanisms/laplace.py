"""The Laplace mechanism, with one noise scale for all coordinates or one per coordinate."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import (
    AdditiveNoise,
    Mechanism,
    check_coordinates,
    check_scale,
    coordinate_tensor,
    log_sum,
    per_coordinate,
    show,
)
from .epsilon import batched_copy, epsilons


class Laplace(AdditiveNoise, Mechanism):
    """``y_j = s_j + b_j * Lap(1)`` on every coordinate ``j``.

    With one ``sensitivity``: the L1 sensitivity of the whole ``dim``-dimensional statistic, every ``b_j =
    sensitivity / epsilon``, and the release is ``epsilon``-DP.

    With a vector of sensitivities ``(Delta_1, ..., Delta_d)`` (e.g. a DP mean's sum and count): ``Delta_j`` bounds
    coordinate ``j``'s change between neighbouring data sets, all coordinates changing at once. The privacy loss
    is at most ``sum_j |s_j - s'_j| / b_j <= sum_j Delta_j / b_j``, so the release is ``epsilon``-DP with
    ``epsilon = sum_j Delta_j / b_j``. ``Laplace(epsilon, sensitivities)`` splits the budget evenly, ``b_j = d
    Delta_j / epsilon`` (each coordinate spends ``epsilon / d``); :meth:`from_scale` with a vector of scales
    takes any split. ``sensitivity`` and ``scale`` are then tuples of ``d`` floats.
    """

    #: :meth:`with_epsilon` also takes a tensor of epsilons (see :mod:`dpsbi.mechanisms.epsilon`).
    batched_epsilon = True
    clamp_lossless = True

    def __init__(
        self, epsilon: float, sensitivity: float | tuple[float, ...], dim: int | None = None
    ) -> None:
        sensitivity, dim = check_coordinates("sensitivity", sensitivity, dim)
        super().__init__(dim, epsilon)
        self.sensitivity = sensitivity
        if isinstance(sensitivity, tuple):
            self.scale = tuple(
                check_scale("scale", d * dim / self.epsilon, f"epsilon={self.epsilon:g}, sensitivity={d:g}")
                for d in sensitivity
            )
        else:
            self.scale = check_scale(
                "scale",
                self.sensitivity / self.epsilon,
                f"epsilon={self.epsilon:g}, sensitivity={self.sensitivity:g}",
            )

    @classmethod
    def from_scale(
        cls, scale: float | tuple[float, ...], sensitivity: float | tuple[float, ...], dim: int | None = None
    ) -> Laplace:
        """The mechanism with noise scale ``b = scale`` exactly; its ``epsilon`` is ``sensitivity / scale``, or
        ``sum_j sensitivity_j / scale_j`` for per-coordinate scales (a vector ``scale`` and a vector
        ``sensitivity``, or one sensitivity shared by every coordinate)."""
        scale, _ = check_coordinates("scale", scale, dim)
        sensitivity, _ = check_coordinates("sensitivity", sensitivity, dim)
        if not isinstance(scale, tuple) and not isinstance(sensitivity, tuple):
            scale = check_scale("scale", scale)
            mech = cls(sensitivity / scale, sensitivity, dim)
            mech.scale = scale
            return mech
        scale, sensitivity = per_coordinate(scale, sensitivity)
        scale = tuple(check_scale("scale", b) for b in scale)
        mech = cls(sum(d / b for d, b in zip(sensitivity, scale)), sensitivity)
        mech.scale = scale
        return mech

    def with_epsilon(self, epsilon: float | Tensor) -> Laplace:
        """The same mechanism (sensitivity, dim) at another ``epsilon``: ``b = sensitivity / epsilon``; with
        per-coordinate scales, every ``b_j`` multiplied by ``self.epsilon / epsilon`` (the same split of the
        budget). A tensor of epsilons broadcasting with the summaries gives one mechanism drawing each row at its
        own epsilon (:mod:`dpsbi.mechanisms.epsilon`)."""
        vector = isinstance(self.scale, tuple)
        if not torch.is_tensor(epsilon):
            if not vector:
                return type(self)(epsilon, self.sensitivity, self.dim)
            ratio = self.epsilon / float(epsilon)
            return type(self).from_scale(tuple(b * ratio for b in self.scale), self.sensitivity)
        epsilon = epsilons(epsilon)
        if not vector:
            return batched_copy(self, epsilon, scale=self.sensitivity / epsilon)
        return batched_copy(
            self, epsilon, scale=coordinate_tensor(self, self.scale, epsilon) * (self.epsilon / epsilon)
        )

    def _b(self, like: Tensor):
        """The noise scale ready to combine with ``like (..., dim)``: a float or a tensor."""
        return coordinate_tensor(self, self.scale, like)

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        # Inverse CDF written on both halves so that neither side loses precision near 0 or 1.
        noise = torch.where(u < 0.5, torch.log(2 * u), -torch.log(2 * (1 - u)))
        return s + self._b(noise) * noise

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        self._check_shapes(y, s)
        return self.noise_log_prob(y - s).sum(-1)

    def max_log_prob(self, y: Tensor) -> Tensor:
        value = -log_sum(self.scale, self.dim, 2.0)
        return torch.full(y.shape[:-1], value, dtype=y.dtype, device=y.device)

    def noise_log_prob(self, x: Tensor) -> Tensor:
        b = self._b(x)
        return -x.abs() / b - (math.log(2 * b) if isinstance(b, float) else torch.log(2 * b))

    def noise_log_cdf(self, x: Tensor) -> Tensor:
        z = x / self._b(x)
        return torch.where(
            z < 0, z.clamp(max=0) - math.log(2), torch.log1p(-0.5 * torch.exp(-z.clamp(min=0)))
        )

    def __repr__(self) -> str:
        return f"Laplace(dim={self.dim}, epsilon={show(self.epsilon)}, sensitivity={show(self.sensitivity)}, scale={show(self.scale)})"
