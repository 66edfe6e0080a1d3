"""Randomized response on binary records."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Mechanism
from .epsilon import batched_copy, epsilons, readable


class RandomizedResponse(Mechanism):
    """Each bit of ``s in {0, 1}^dim`` is reported truthfully with probability ``e^eps / (1 + e^eps)``.

    A record is one bit, so each bit's report is ``epsilon``-DP (local DP).
    """

    #: Releases are bits.
    lattice = 1.0

    def __init__(self, epsilon: float, dim: int = 1) -> None:
        super().__init__(dim, epsilon)
        # e^eps / (1 + e^eps), without overflow at a large epsilon
        self.keep = 1 / (1 + math.exp(-self.epsilon))

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

    def check_input(self, s: Tensor) -> None:
        """Raise ``ValueError`` unless every entry of ``s (..., dim)`` is a bit, 0 or 1."""
        bad = (s != 0) & (s != 1)
        if bool(bad.any()):
            raise ValueError(
                f"RandomizedResponse reports bits; s holds values other than 0 and 1, e.g. {s[bad][0].item()}"
            )

    def coordinate_log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        """Elementwise ``log eta(y_i | s_i)``, shape ``broadcast(y, s)``: ``log keep`` where the bit is reported
        as it is, ``log(1 - keep)`` where it is flipped, ``-inf`` where ``y_i`` is not a bit, NaN where ``s_i`` is not
        (no release of it is defined). Each bit's report has the same law, so ``y`` and ``s`` may hold any number of
        them (a release record by record, :func:`~dpsbi.tasks.latent.record_log_prob`)."""
        dtype = y.dtype if y.is_floating_point() else torch.get_default_dtype()
        same = (y == s).to(dtype)
        eps = self.epsilon  # a tensor for a mechanism at a tensor of epsilons (with_epsilon)
        if torch.is_tensor(eps):  # log keep = -log(1 + e^-eps), log(1 - keep) = -log(1 + e^eps)
            log_keep, log_flip = -torch.nn.functional.softplus(-eps), -torch.nn.functional.softplus(eps)
        else:
            log_keep = -math.log1p(math.exp(-eps))
            log_flip = -eps + log_keep
        logp = same * log_keep + (1 - same) * log_flip
        logp = torch.where((y == 0) | (y == 1), logp, -math.inf)
        return torch.where((s == 0) | (s == 1), logp, math.nan)

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        """``log eta(y | s)`` summed over the ``dim`` bits, shape ``broadcast(y, s)[:-1]``. Statistics that are not
        bits are refused (:meth:`check_input`) where their values can be read without waiting for a device
        (:func:`~dpsbi.mechanisms.epsilon.readable`); elsewhere they give NaN."""
        self._check_shapes(y, s)
        if readable(s):
            self.check_input(s)
        return self.coordinate_log_prob(y, s).sum(-1)

    def max_log_prob(self, y: Tensor) -> Tensor:
        return torch.full(y.shape[:-1], self.dim * math.log(self.keep), dtype=y.dtype, device=y.device)

    def in_support(self, y: Tensor) -> Tensor:
        return ((y == 0) | (y == 1)).all(-1)
