"""Parameters that are several probability vectors: a product of Dirichlets and its bijection to R^d."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributions import Dirichlet, Distribution, StickBreakingTransform, Transform, constraints


class ProductSimplex(constraints.Constraint):
    """Vectors made of consecutive blocks, each a probability vector (non-negative, summing to 1)."""

    event_dim = 1

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = list(sizes)
        super().__init__()

    def check(self, value: Tensor) -> Tensor:
        ok = [constraints.simplex.check(block) for block in value.split(self.sizes, dim=-1)]
        return torch.stack(ok, -1).all(-1)


class ProductDirichlet(Distribution):
    """Independent Dirichlet blocks concatenated into one vector; ``concentrations`` is a list of 1-d tensors."""

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(self, concentrations: list[Tensor], validate_args: bool | None = None) -> None:
        self.blocks = [Dirichlet(c) for c in concentrations]
        self.sizes = [int(c.shape[-1]) for c in concentrations]
        super().__init__(torch.Size(), torch.Size([sum(self.sizes)]), validate_args=validate_args)

    @property
    def support(self) -> ProductSimplex:
        return ProductSimplex(self.sizes)

    @property
    def mean(self) -> Tensor:
        return torch.cat([b.mean for b in self.blocks], -1)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        return torch.cat([b.rsample(sample_shape) for b in self.blocks], -1)

    def log_prob(self, value: Tensor) -> Tensor:
        parts = value.split(self.sizes, dim=-1)
        return sum(b.log_prob(v) for b, v in zip(self.blocks, parts))


class BlockStickBreaking(Transform):
    """Bijection from ``R^(sum(sizes) - len(sizes))`` onto a :class:`ProductSimplex`, block by block."""

    domain = constraints.real_vector
    bijective = True

    def __init__(self, sizes: list[int], cache_size: int = 0) -> None:
        super().__init__(cache_size=cache_size)
        self.sizes = list(sizes)
        self._breaker = StickBreakingTransform()

    @constraints.dependent_property(is_discrete=False, event_dim=1)
    def codomain(self) -> ProductSimplex:
        return ProductSimplex(self.sizes)

    def __eq__(self, other) -> bool:
        return isinstance(other, BlockStickBreaking) and other.sizes == self.sizes

    def _call(self, x: Tensor) -> Tensor:
        return torch.cat([self._breaker(b) for b in x.split([k - 1 for k in self.sizes], -1)], -1)

    def _inverse(self, y: Tensor) -> Tensor:
        return torch.cat([self._breaker.inv(b) for b in y.split(self.sizes, -1)], -1)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        xs = x.split([k - 1 for k in self.sizes], -1)
        ys = y.split(self.sizes, -1)
        return sum(self._breaker.log_abs_det_jacobian(a, b) for a, b in zip(xs, ys))

    def forward_shape(self, shape: torch.Size) -> torch.Size:
        return shape[:-1] + (shape[-1] + len(self.sizes),)

    def inverse_shape(self, shape: torch.Size) -> torch.Size:
        return shape[:-1] + (shape[-1] - len(self.sizes),)


def multinomial_counts(total: Tensor, probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Multinomial counts with per-row totals ``total (B,)`` and probabilities ``probs (B, C)``, as ``(B, C)``,
    by sequential conditional binomials (vectorized over rows; the loop runs over the C categories)."""
    remaining = total.to(probs.dtype)
    rest = torch.ones_like(remaining)
    counts = []
    for c in range(probs.shape[-1] - 1):
        q = (probs[:, c] / rest.clamp(min=1e-30)).clamp(0, 1)
        x = torch.binomial(remaining, q, generator=generator)
        counts.append(x)
        remaining, rest = remaining - x, rest - probs[:, c]
    counts.append(remaining)
    return torch.stack(counts, -1)
