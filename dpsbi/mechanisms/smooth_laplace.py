"""Laplace noise scaled by the smooth sensitivity of a median or maximum (Nissim, Raskhodnikova & Smith 2007).

The formulas are those of Alparslan & Yildirim (Sec. 5.4) for values ``0 <= s_1 <= ... <= s_n <= A_s`` (sorted,
with ``s_i = 0`` for ``i < 1`` and ``s_i = A_s`` for ``i > n``):

- maximum: ``S = max_k e^{-k beta} max(A_s - s_{n-k}, s_n - s_{n-k-1})``;
- median ``s_m`` (``m = floor((n + 1) / 2)``, the lower median when n is even):
  ``S = max_k e^{-k beta} max_{t=0..k+1} (s_{m+t} - s_{m+t-k-1})``;

for ``k = 0..n``. The release ``y = statistic + (S / alpha) Lap(1)`` with ``alpha = epsilon / 2`` and
``beta = epsilon / (2 log(2 / delta))`` is (epsilon, delta)-DP (Nissim et al. state it for epsilon, delta < 1;
the paper also uses epsilon = 5).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Mechanism, check_integer, check_positive
from .laplace import Laplace

STATISTICS = ("median", "max")


def _padded(values: Tensor, upper: float) -> Tensor:
    """Sorted values ``(..., n)`` with a 0 before and ``upper`` after them: ``(..., n + 2)``."""
    s = values.sort(-1).values
    return torch.cat([torch.zeros_like(s[..., :1]), s, torch.full_like(s[..., :1], upper)], -1)


def _median_pairs(p: Tensor, m: int, reach: int, beta: float) -> Tensor:
    """``max e^{-(i - j - 1) beta} (p_i - p_j)`` over ``m <= i <= m + reach``, ``m - reach <= j <= m`` (clipped to
    the padded values ``p (..., n + 2)``): ``(...)``."""
    i = torch.arange(m, min(p.shape[-1] - 1, m + reach) + 1, device=p.device)
    j = torch.arange(max(0, m - reach), m + 1, device=p.device)
    gap = (i[:, None] - j[None, :] - 1).clamp(min=0).to(p.dtype)  # k = i - j - 1
    spread = p[..., i, None] - p[..., None, j]
    return (spread * torch.exp(-beta * gap)).flatten(-2).amax(-1)


def smooth_sensitivity_median(values: Tensor, beta: float, upper: float) -> Tensor:
    """beta-smooth sensitivity ``(...)`` of the (lower) median of ``values (..., n)`` in ``[0, upper]``.

    With the padded sorted values ``p_0 = 0, p_1..p_n, p_{n+1} = upper`` and the median at ``p_m``, each pair
    ``j <= m <= i`` with ``i > j`` contributes ``e^{-(i - j - 1) beta} (p_i - p_j)`` (the term ``t = i - m`` of
    ``k = i - j - 1``); pairs reaching beyond the padding add nothing larger. A pair with an end more than
    ``K`` places from the median weighs at most ``upper e^{-K beta}``, so after a first pass over pairs within
    ``2 / beta`` places, only pairs within the ``K`` that brings this below the batch's smallest value so far
    are scanned. Vectorized over the batch.
    """
    n = values.shape[-1]
    p = _padded(values, upper)
    m = (n + 1) // 2
    first = min(n + 1, math.ceil(2 / beta))
    sens = _median_pairs(p, m, first, beta)
    least = float(sens.min()) if sens.numel() else upper
    reach = n + 1 if least <= 0 else min(n + 1, math.ceil(math.log(upper / least) / beta))
    return sens if reach <= first else torch.maximum(sens, _median_pairs(p, m, reach, beta))


def smooth_sensitivity_max(values: Tensor, beta: float, upper: float) -> Tensor:
    """beta-smooth sensitivity ``(...)`` of the maximum of ``values (..., n)`` in ``[0, upper]``:
    ``max_k e^{-k beta} max(upper - s_{n-k}, s_n - s_{n-k-1})`` with ``s_i = 0`` for ``i < 1``."""
    n = values.shape[-1]
    p = _padded(values, upper)[..., : n + 1]  # p_0 = 0, p_1..p_n
    descending = p.flip(-1)  # s_n, s_{n-1}, .., s_1, 0
    below = torch.cat([descending[..., 1:], torch.zeros_like(p[..., :1])], -1)  # s_{n-k-1}, k = 0..n
    b = torch.maximum(upper - descending, p[..., -1:] - below)
    k = torch.arange(n + 1, device=values.device, dtype=values.dtype)
    return (b * torch.exp(-beta * k)).amax(-1)


class SmoothSensitivityLaplace(Mechanism):
    """Release of the median or maximum of ``n`` values in ``[0, upper]`` with Laplace noise of scale
    ``S(x) / alpha``, ``S`` the beta-smooth sensitivity of the data.

    The noise depends on the data beyond the statistic, so the summary it consumes is the pair
    ``s = (statistic, S)`` (``input_dim = 2``, from :meth:`summarize`) while the release is one number
    (``dim = 1``). ``log_prob(y, s)`` is the Laplace density with that scale.
    """

    def __init__(self, epsilon: float, delta: float, upper: float, n: int, statistic: str = "median") -> None:
        super().__init__(1, epsilon, delta)
        if not 0 < delta < 1:
            raise ValueError(f"smooth sensitivity needs 0 < delta < 1, got {delta}")
        if statistic not in STATISTICS:
            raise ValueError(f"unknown statistic {statistic!r}; choose one of {STATISTICS}")
        self.upper = check_positive("upper", upper)
        self.n, self.statistic = check_integer("n", n), statistic
        self.alpha = self.epsilon / 2
        self.beta = self.epsilon / (2 * math.log(2 / self.delta))
        self._unit = Laplace(1.0, 1.0)

    #: Why it cannot be trained over a range of epsilons (:func:`dpsbi.mechanisms.epsilon.epsilon_range_problem`).
    epsilon_range_problem = (
        "its summary holds the smooth sensitivity, which depends on epsilon (through beta), so a simulated "
        "summary cannot be released again at another epsilon"
    )

    def with_epsilon(self, epsilon: float) -> SmoothSensitivityLaplace:
        """The same release (delta, upper, n, statistic) at another ``epsilon`` (one number: the summary it
        consumes, the beta-smooth sensitivity, changes with epsilon too, see :meth:`summarize`)."""
        return type(self)(epsilon, self.delta, self.upper, self.n, self.statistic)

    @property
    def input_dim(self) -> int:
        return 2

    def summarize(self, values: Tensor) -> Tensor:
        """The summary ``(statistic, smooth sensitivity)`` of ``values (..., n)`` in ``[0, upper]``: ``(..., 2)``."""
        if values.shape[-1] != self.n:
            raise ValueError(
                f"expected {self.n} values in the last dimension, got shape {tuple(values.shape)}"
            )
        if self.statistic == "max":
            stat, sens = values.amax(-1), smooth_sensitivity_max(values, self.beta, self.upper)
        else:
            stat = values.sort(-1).values[..., (self.n + 1) // 2 - 1]
            sens = smooth_sensitivity_median(values, self.beta, self.upper)
        return torch.stack([stat, sens], -1)

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        scale = s[..., 1:] / self.alpha
        return s[..., :1] + scale * self._unit.transform(torch.zeros_like(u), u)

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        self._check_shapes(y, s)
        scale = s[..., 1:] / self.alpha
        return self._unit.log_prob((y - s[..., :1]) / scale, torch.zeros_like(scale)) - torch.log(scale).sum(
            -1
        )

    def max_log_prob(self, y: Tensor) -> Tensor:
        # The sensitivity is at least upper * e^{-n beta} (the k = n term spans the padding 0 .. upper).
        least = self.upper * math.exp(-self.n * self.beta) / self.alpha
        return torch.full(y.shape[:-1], -math.log(2 * least), dtype=y.dtype, device=y.device)

    def __repr__(self) -> str:
        return (
            f"SmoothSensitivityLaplace({self.statistic}, n={self.n}, upper={self.upper:g}, "
            f"epsilon={self.epsilon:g}, delta={self.delta:g})"
        )
