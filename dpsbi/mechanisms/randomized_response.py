"""Randomized response on binary records."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Mechanism
from .epsilon import batched_copy, epsilons


class RandomizedResponse(Mechanism):
    """Each bit of ``s in {0, 1}^dim`` is reported truthfully with probability ``e^eps / (1 + e^eps)``.

    A record is one bit, so each bit's report is ``epsilon``-DP (local DP).
    """

    #: Releases are bits.
    lattice = 1.0

    def __init__(self, epsilon: float, dim: int = 1) -> None:
        super().__init__(dim, epsilon)
        self.keep = math.exp(self.epsilon) / (1 + math.exp(self.epsilon))

    #: :meth:`with_epsilon` also takes a tensor of epsilons (see :mod:`dpsbi.mechanisms.epsilon`).
    batched_epsilon = True

    def with_epsilon(self, epsilon: float | Tensor) -> RandomizedResponse:
        """The same mechanism (dim) at another ``epsilon``. A tensor of epsilons broadcasting with the summaries
        gives one mechanism drawing each row at its own epsilon (its ``keep`` probability a tensor;
        :mod:`dpsbi.mechanisms.epsilon`)."""
        if not torch.is_tensor(epsilon):
            return type(self)(epsilon, self.dim)
        epsilon = epsilons(epsilon)
        return batched_copy(self, epsilon, keep=torch.sigmoid(epsilon))

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        flip = (u >= self.keep).to(s.dtype)
        return s + flip * (1 - 2 * s)

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        same = (y == s).to(y.dtype if y.is_floating_point() else torch.get_default_dtype())
        logp = same * math.log(self.keep) + (1 - same) * math.log1p(-self.keep)
        return torch.where(self.in_support(y).unsqueeze(-1), logp, -math.inf).sum(-1)

    def max_log_prob(self, y: Tensor) -> Tensor:
        return torch.full(y.shape[:-1], self.dim * math.log(self.keep), dtype=y.dtype, device=y.device)

    def in_support(self, y: Tensor) -> Tensor:
        return ((y == 0) | (y == 1)).all(-1)
