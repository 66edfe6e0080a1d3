"""Several releases of the same confidential data: mechanisms composed block by block, and their privacy loss.

``Composition([m_1, ..., m_k])`` releases ``y = (y_1, ..., y_k)``, ``y_j ~ m_j(. | s_j)``, independently, where the
confidential statistic is the concatenation ``s = (s_1, ..., s_k)`` (block ``j`` of ``m_j.input_dim``
coordinates; blocks may hold the same statistic twice, e.g. a count released by two curators). Each block's
uniforms are its own slice of one uniform vector, so RQMC covers all noise coordinates at once; the likelihood is
the product of the blocks' (:meth:`Composition.log_prob` sums them).

Privacy accounting (:func:`compose_privacy`), for data sets that are neighbours in every block at once:

- every block pure ``epsilon_j``-DP (``delta_j = 0``): basic composition, ``epsilon = sum_j epsilon_j``;
- every block pure or zCDP (``rho_j``: Gaussian, discrete Gaussian; a pure block counts as ``epsilon_j^2 / 2``-zCDP,
  Bun & Steinke 2016 Prop. 1.4): ``rho = sum_j rho_j``, and at ``delta = sum_j delta_j`` the smaller of the basic
  composition ``sum_j epsilon_j`` and ``rho``'s conversion (CKS Cor. 13, :func:`~dpsbi.mechanisms.discrete.zcdp_epsilon`,
  OpenDP's ``make_zCDP_to_approxDP``);
- otherwise (an ``(epsilon_j, delta_j)`` block without rho): basic composition ``(sum_j epsilon_j, sum_j delta_j)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from scipy.optimize import brentq
from torch import Tensor

from .base import Mechanism, check_positive
from .discrete import zcdp_epsilon
from .epsilon import at_epsilons, batched_copy, epsilon_range_problem, epsilons, nominal_epsilon


class Privacy(NamedTuple):
    """The privacy loss of a composition: ``(epsilon, delta)``-DP, ``rho``-zCDP where every block is pure or zCDP
    and one is zCDP (else ``None``), and the ``rule`` that gave ``epsilon``."""

    epsilon: float
    delta: float
    rho: float | None
    rule: str


def _rho(block: Mechanism) -> float | None:
    """Block's zCDP ``rho``: its own (Gaussian, discrete Gaussian, their post-processings), ``epsilon^2 / 2`` for a
    pure block, else ``None``."""
    rho = getattr(block, "rho", None)
    if rho is not None:
        return float(rho)
    return block.epsilon**2 / 2 if block.delta == 0 else None


def compose_privacy(blocks: Sequence[Mechanism]) -> Privacy:
    """The total privacy loss of releasing every block on the same data (module docstring)."""
    epsilon = sum(float(b.epsilon) for b in blocks)
    delta = sum(float(b.delta) for b in blocks)
    if delta == 0:
        return Privacy(epsilon, 0.0, None, "basic composition of pure epsilon-DP blocks")
    if delta >= 1:
        raise ValueError(f"the blocks' deltas sum to {delta:g} >= 1: the composition guarantees nothing")
    rhos = [_rho(b) for b in blocks]
    if any(r is None for r in rhos):
        return Privacy(epsilon, delta, None, "basic composition of (epsilon, delta)-DP blocks")
    rho = sum(rhos)
    converted = zcdp_epsilon(rho, delta)
    if converted < epsilon:
        return Privacy(converted, delta, rho, "zCDP: rho summed, converted at delta (CKS Cor. 13)")
    return Privacy(epsilon, delta, rho, "basic composition (tighter here than the zCDP conversion)")


def _slices(widths: Sequence[int]) -> list[slice]:
    ends = [sum(widths[: j + 1]) for j in range(len(widths))]
    return [slice(end - w, end) for end, w in zip(ends, widths)]


class Composition(Mechanism):
    """The releases of ``mechanisms`` (blocks) on consecutive slices of the confidential statistic: block ``j``
    takes ``m_j.input_dim`` coordinates of ``s`` and ``m_j.noise_dim`` uniforms and releases ``m_j.dim``
    coordinates of ``y``. Any mix of continuous, discrete and post-processed mechanisms.

    ``epsilon``, ``delta`` (and ``rho`` where it applies) are the total privacy loss (:meth:`privacy`,
    :func:`compose_privacy`). :meth:`log_prob` is the sum of the blocks' (exact where every block's is);
    :attr:`lattices` gives each release coordinate's lattice spacing, so that SPLE dequantizes the integer blocks
    only; ``lattice`` is the spacing all coordinates share, else ``None``. :meth:`with_epsilon` re-calibrates every
    block with the budget split in the same proportions.
    """

    def __init__(self, mechanisms: Sequence[Mechanism]) -> None:
        if isinstance(mechanisms, Mechanism) or not isinstance(mechanisms, Sequence) or not mechanisms:
            raise TypeError(
                "Composition takes a non-empty list of dpsbi mechanisms, e.g. Composition([m1, m2])"
            )
        for j, m in enumerate(mechanisms):
            if not isinstance(m, Mechanism):
                raise TypeError(f"Composition: block {j} is a {type(m).__name__}, not a dpsbi Mechanism")
        self.blocks = tuple(mechanisms)
        total = compose_privacy(self.blocks)
        super().__init__(sum(m.dim for m in self.blocks), total.epsilon, total.delta)
        if total.rho is not None:
            self.rho = total.rho
        self._inputs = _slices([m.input_dim for m in self.blocks])
        self._outputs = _slices([m.dim for m in self.blocks])
        self._noises = _slices([m.noise_dim for m in self.blocks])

    def privacy(self) -> Privacy:
        """The total privacy loss of the blocks released together (:func:`compose_privacy`)."""
        return compose_privacy(self.blocks)

    @property
    def input_dim(self) -> int:
        return sum(m.input_dim for m in self.blocks)

    @property
    def noise_dim(self) -> int:
        return sum(m.noise_dim for m in self.blocks)

    @property
    def dtype(self) -> torch.dtype:
        return (
            torch.float64 if any(m.dtype == torch.float64 for m in self.blocks) else torch.get_default_dtype()
        )

    @property
    def lattices(self) -> tuple[float | None, ...]:
        return tuple(h for m in self.blocks for h in m.lattices)

    @property
    def clamps_lossless(self) -> tuple[bool, ...]:
        return tuple(c for m in self.blocks for c in m.clamps_lossless)

    @property
    def stabilizing_maps(self) -> tuple[str | None, ...]:
        return tuple(name for m in self.blocks for name in m.stabilizing_maps)

    @property
    def lattice(self) -> float | None:
        spacings = set(self.lattices)
        return spacings.pop() if len(spacings) == 1 else None

    def check_input(self, s: Tensor) -> None:
        for j, (m, part) in enumerate(zip(self.blocks, self._inputs)):
            try:
                m.check_input(s[..., part])
            except ValueError as error:
                raise ValueError(f"block {j} of the composition: {error}") from None

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        shape = torch.broadcast_shapes(s.shape[:-1], u.shape[:-1])
        parts = [
            m.transform(s[..., i], u[..., n]).expand(shape + (m.dim,))
            for m, i, n in zip(self.blocks, self._inputs, self._noises)
        ]
        return torch.cat(parts, -1)

    @property
    def has_log_prob(self) -> bool:
        return all(m.has_log_prob for m in self.blocks)

    def _per_block(self, method: str, check: str) -> None:
        """Run every block's ``require_*`` check, naming the block that fails."""
        for j, m in enumerate(self.blocks):
            try:
                getattr(m, check)(method)
            except ValueError as error:  # IntractableLikelihood is a ValueError
                raise type(error)(f"block {j} of the composition: {error}") from None

    def require_log_prob(self, method: str) -> None:
        self._per_block(method, "require_log_prob")

    def require_likelihood_flow(self, method: str) -> None:
        self._per_block(method, "require_likelihood_flow")

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        self._check_shapes(y, s)
        if not self.has_log_prob:
            self.require_log_prob("Composition.log_prob")
        return sum(
            m.log_prob(y[..., o], s[..., i]) for m, i, o in zip(self.blocks, self._inputs, self._outputs)
        )

    def max_log_prob(self, y: Tensor) -> Tensor:
        """The sum of the blocks' bounds (the supremum of a sum is at most the sum of the suprema)."""
        if not self.has_log_prob:
            self.require_log_prob("Composition.max_log_prob")
        return sum(m.max_log_prob(y[..., o]) for m, o in zip(self.blocks, self._outputs))

    def in_support(self, y: Tensor) -> Tensor:
        inside = torch.isfinite(y).all(-1)
        for m, o in zip(self.blocks, self._outputs):
            inside = inside & m.in_support(y[..., o])
        return inside

    @property
    def epsilon_range_problem(self) -> str | None:
        """Why the composition cannot draw each release at its own epsilon, or ``None``: every block must be
        able to, and every block pure (the proportional split then gives exactly the total asked for)."""
        for j, m in enumerate(self.blocks):
            problem = epsilon_range_problem(m)
            if problem:
                return f"block {j}: {problem}"
        if self.delta > 0:
            return "its blocks are not all pure epsilon-DP, so its total epsilon is re-calibrated one value at a time"
        return None

    @property
    def batched_epsilon(self) -> bool:
        return self.epsilon_range_problem is None

    def _scaled(self, factor: float) -> Composition:
        """Every block re-calibrated at ``factor`` times its epsilon."""
        return Composition([m.with_epsilon(nominal_epsilon(m) * factor) for m in self.blocks])

    def with_epsilon(self, epsilon: float | Tensor) -> Composition:
        """The blocks re-calibrated at ``c`` times their epsilons, ``c`` chosen so that the total is ``epsilon``
        (``c = epsilon / self.epsilon`` for pure blocks; solved numerically otherwise). A tensor of epsilons
        (pure blocks only, see :attr:`epsilon_range_problem`) gives one composition drawing each row at its own
        total (:mod:`dpsbi.mechanisms.epsilon`)."""
        for j, m in enumerate(self.blocks):
            if not callable(getattr(m, "with_epsilon", None)):
                raise ValueError(f"Composition.with_epsilon: block {j} ({m!r}) cannot be re-calibrated")
        if torch.is_tensor(epsilon):
            # a proportional split misses the total of blocks that are not all pure
            problem = self.epsilon_range_problem
            if problem:
                raise ValueError(f"Composition.with_epsilon cannot take a tensor of epsilons: {problem}")
            epsilon = epsilons(epsilon)
            share = [nominal_epsilon(m) / self.epsilon for m in self.blocks]
            blocks = tuple(at_epsilons(m, epsilon * w) for m, w in zip(self.blocks, share))
            return batched_copy(self, epsilon, blocks=blocks)
        epsilon = check_positive("epsilon", epsilon)  # before the root search, which 0 would send to log(0)
        first = epsilon / self.epsilon
        if self.delta == 0:
            return self._scaled(first)
        try:
            log_c = brentq(
                lambda x: math.log(self._scaled(math.exp(x)).epsilon / epsilon),
                math.log(first) - 4,
                math.log(first) + 4,
                xtol=1e-12,
            )
        except (
            ValueError
        ) as error:  # a block out of its range at a factor the search tried: the values are its
            raise ValueError(
                f"Composition.with_epsilon({epsilon:g}): its blocks cannot be re-calibrated to a total of "
                f"{epsilon:g} (a block, at a share the search tried: {error})"
            ) from None
        return self._scaled(math.exp(log_c))

    def __repr__(self) -> str:
        return f"Composition([{', '.join(repr(m) for m in self.blocks)}])"
