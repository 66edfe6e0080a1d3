"""Post-processing as part of the mechanism: the curator releases ``fn(noisy)``, not the noisy statistic.

Post-processing keeps the privacy guarantee (``epsilon``, ``delta`` are the inner mechanism's), but changes the
likelihood, which inference must use. :class:`PostProcessed` wraps a mechanism and a step (or a list of steps,
applied in order); built-in steps:

- :data:`nonnegative`: clamp at 0. Exact likelihood: ``P(y_i = 0) = P(noisy_i <= 0)`` from the inner CDF,
  ``eta(y_i)`` of the inner mechanism above 0. On an integer mechanism the release stays on the lattice; on a
  continuous one it is an atom at 0 on top of a density (the likelihood is then w.r.t. that mixed measure, which
  exact ABC can use; a likelihood flow cannot model it, so SPLE refuses it).
- :data:`rounded`: round to integers. Exact likelihood ``P(y_i = k) = P(k - 1/2 <= noisy_i <= k + 1/2)`` for
  Laplace / Gaussian noise; the identity on integer mechanisms. The release is on the integer lattice.
- :data:`consistent_total`: Census-style consistency. The noisy cells are clamped at 0, rescaled to sum to the
  exact confidential total ``T = sum_i s_i`` (an *invariant*, released exactly) and rounded to nonnegative integers
  by largest remainders, so the release sums to ``T``. Its likelihood is intractable: methods that evaluate
  ``eta(y | s)`` refuse it; SPPE (and SPLE: the release is on the integer lattice) simulate it. Note that the
  exact total is not protected: the DP guarantee holds only between data sets with the same total, as for the
  2020 US Census invariants.

Exact likelihoods are built per coordinate (``coordinate_log_prob``, ``coordinate_log_cdf``,
``coordinate_log_sf``, ``coordinate_max_log_prob``) from mechanisms with independent coordinates
(:class:`~dpsbi.mechanisms.base.AdditiveNoise`: Laplace, Gaussian, DiscreteLaplace, DiscreteGaussian), so steps
compose: ``PostProcessed(Laplace(...), [rounded, nonnegative])`` has an exact likelihood.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .base import AdditiveNoise, IntractableLikelihood, Mechanism
from .epsilon import at_epsilons

#: Privacy levels a post-processed mechanism states as its inner mechanism does (``Task.validate`` reads them).
_FORWARDED = ("target_epsilon", "mu", "rho")


def _log_sub_exp(a: Tensor, b: Tensor) -> Tensor:
    """``log(e^a - e^b)`` for ``a >= b``; ``-inf`` where both are ``-inf``."""
    return torch.where(a > -math.inf, a + torch.log(-torch.expm1((b - a).clamp(max=0))), a)


def _coordinatewise(mechanism: Mechanism) -> bool:
    """Whether ``mechanism`` has exact per-coordinate likelihood functions (independent coordinates)."""
    if isinstance(mechanism, AdditiveNoise):
        return True
    return isinstance(mechanism, PostProcessed) and mechanism.coordinatewise


def _integers(y: Tensor) -> Tensor:
    return torch.isfinite(y) & (y == torch.round(y))


class PostProcessing:
    """A post-processing step: ``release = fn(noisy)`` (or ``fn(noisy, s)`` with ``uses_summary=True``), ``fn``
    a vectorized torch function keeping the shape ``(..., dim)``.

    A user-defined step has no exact likelihood (methods that evaluate ``eta(y | s)`` refuse it). Declare what
    it keeps so that SPLE's likelihood flow can model its releases: ``lattice=h`` (every release a multiple of
    ``h``) or ``keeps_density=True`` (a continuous mechanism's releases keep a density, e.g. a smooth bijection).
    Subclasses (the built-in steps) override the hooks below, each given the inner mechanism.
    """

    def __init__(
        self,
        fn: Callable[..., Tensor],
        name: str | None = None,
        *,
        lattice: float | None = None,
        keeps_density: bool = False,
        uses_summary: bool = False,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"a post-processing step needs a callable fn, got {type(fn).__name__}")
        self.fn, self.uses_summary = fn, bool(uses_summary)
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.declared_lattice = None if lattice is None else float(lattice)
        self.keeps_density = bool(keeps_density)

    def __call__(self, noisy: Tensor, s: Tensor) -> Tensor:
        return self.fn(noisy, s) if self.uses_summary else self.fn(noisy)

    def check(self, inner: Mechanism) -> None:
        """Raise ``ValueError`` if the step cannot follow ``inner``."""

    def lattice(self, inner: Mechanism) -> float | None:
        """Spacing of the lattice the releases lie on, or ``None``."""
        return self.declared_lattice

    def release_problem(self, inner: Mechanism) -> str | None:
        """Why a likelihood flow cannot model the releases (neither a density nor a lattice), or ``None``."""
        if self.declared_lattice is not None or (self.keeps_density and inner.lattice is None):
            return None
        return (
            f"step {self.name!r} is not declared to keep a density or a lattice "
            "(PostProcessing(fn, lattice=h) or keeps_density=True)"
        )

    def likelihood_problem(self, inner: Mechanism) -> str | None:
        """Why there is no exact likelihood, or ``None``."""
        return f"no exact likelihood is known for the user-defined step {self.name!r}"

    def coordinatewise(self, inner: Mechanism) -> bool:
        """Whether the per-coordinate functions below are exact."""
        return False

    def in_support(self, inner: Mechanism, y: Tensor) -> Tensor:
        ok = torch.isfinite(y).all(-1)
        h = self.lattice(inner)
        return ok if h is None else ok & _integers(y / h).all(-1)

    def log_prob(self, inner: Mechanism, y: Tensor, s: Tensor) -> Tensor:
        return self.coordinate_log_prob(inner, y, s).sum(-1)

    def max_log_prob(self, inner: Mechanism, y: Tensor) -> Tensor:
        return self.coordinate_max_log_prob(inner, y).sum(-1)

    def coordinate_log_prob(self, inner: Mechanism, y: Tensor, s: Tensor) -> Tensor:
        raise NotImplementedError

    def coordinate_log_cdf(self, inner: Mechanism, y: Tensor, s: Tensor) -> Tensor:
        raise NotImplementedError

    def coordinate_log_sf(self, inner: Mechanism, y: Tensor, s: Tensor) -> Tensor:
        raise NotImplementedError

    def coordinate_max_log_prob(self, inner: Mechanism, y: Tensor) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


def _inner_problem(inner: Mechanism) -> str | None:
    return inner.likelihood_problem if isinstance(inner, PostProcessed) else None


class _Nonnegative(PostProcessing):
    """Clamp every coordinate at 0."""

    def __init__(self) -> None:
        super().__init__(lambda noisy: noisy.clamp(min=0), "nonnegative")

    def lattice(self, inner: Mechanism) -> float | None:
        return inner.lattice  # 0 is on every lattice

    def release_problem(self, inner: Mechanism) -> str | None:
        if inner.lattice is None:
            return "clamping a continuous release at 0 puts an atom at 0 on top of a density"
        return None

    def likelihood_problem(self, inner: Mechanism) -> str | None:
        problem = _inner_problem(inner)
        if problem is None and not _coordinatewise(inner):
            problem = (
                "clamping at 0 has an exact likelihood only after mechanisms with independent coordinates "
                f"(Laplace, Gaussian, DiscreteLaplace, DiscreteGaussian), not {type(inner).__name__}"
            )
        return problem

    def coordinatewise(self, inner: Mechanism) -> bool:
        return _coordinatewise(inner)

    def in_support(self, inner: Mechanism, y: Tensor) -> Tensor:
        return inner.in_support(y) & (y >= 0).all(-1)

    def coordinate_log_prob(self, inner, y, s):
        at_zero = inner.coordinate_log_cdf(torch.zeros_like(y), s)  # P(noisy <= 0)
        above = inner.coordinate_log_prob(y, s)
        return torch.where(y < 0, -math.inf, torch.where(y == 0, at_zero, above))

    def coordinate_log_cdf(self, inner, y, s):
        return torch.where(y < 0, -math.inf, inner.coordinate_log_cdf(y, s))

    def coordinate_log_sf(self, inner, y, s):
        return torch.where(y < 0, 0.0, inner.coordinate_log_sf(y, s))

    def coordinate_max_log_prob(self, inner, y):
        return torch.where(y == 0, 0.0, inner.coordinate_max_log_prob(y))


class _Rounded(PostProcessing):
    """Round every coordinate to the nearest integer (ties to even; they have probability 0 under a density)."""

    def __init__(self) -> None:
        super().__init__(torch.round, "rounded", lattice=1.0)

    def likelihood_problem(self, inner: Mechanism) -> str | None:
        if inner.lattice == 1:
            return _inner_problem(inner)  # rounding integers changes nothing
        if inner.lattice is not None:
            return (
                f"rounding a release on a lattice of spacing {inner.lattice:g} has no exact likelihood here"
            )
        if not isinstance(inner, AdditiveNoise):
            return (
                "rounding has an exact likelihood only for Laplace or Gaussian noise (or integer releases), "
                f"not after {type(inner).__name__}"
            )
        return None

    def coordinatewise(self, inner: Mechanism) -> bool:
        return _coordinatewise(inner) and self.likelihood_problem(inner) is None

    def in_support(self, inner: Mechanism, y: Tensor) -> Tensor:
        ok = _integers(y).all(-1)
        return ok & inner.in_support(y) if inner.lattice == 1 else ok

    def log_prob(self, inner, y, s):
        return inner.log_prob(y, s) if inner.lattice == 1 else super().log_prob(inner, y, s)

    def max_log_prob(self, inner, y):
        return inner.max_log_prob(y) if inner.lattice == 1 else super().max_log_prob(inner, y)

    def coordinate_log_prob(self, inner, y, s):
        if inner.lattice == 1:
            return inner.coordinate_log_prob(y, s)
        # P(k - 1/2 <= noisy <= k + 1/2) from whichever tail keeps the difference accurate.
        hi, lo = y + 0.5, y - 0.5
        cdf_hi = inner.coordinate_log_cdf(hi, s)
        from_cdf = _log_sub_exp(cdf_hi, inner.coordinate_log_cdf(lo, s))
        from_sf = _log_sub_exp(inner.coordinate_log_sf(lo, s), inner.coordinate_log_sf(hi, s))
        mass = torch.where(cdf_hi < -math.log(2), from_cdf, from_sf)
        return torch.where(_integers(y), mass, -math.inf)

    def coordinate_log_cdf(self, inner, y, s):
        return inner.coordinate_log_cdf(y if inner.lattice == 1 else torch.floor(y) + 0.5, s)

    def coordinate_log_sf(self, inner, y, s):
        return inner.coordinate_log_sf(y if inner.lattice == 1 else torch.floor(y) + 0.5, s)

    def coordinate_max_log_prob(self, inner, y):
        if inner.lattice == 1:
            return inner.coordinate_max_log_prob(y)
        # Symmetric unimodal noise: the interval centred on the mode holds the most, 1 - 2 F(-1/2).
        tail = inner.noise_log_cdf(torch.full_like(y, -0.5))
        return torch.log1p(-2 * torch.exp(tail))


def _largest_remainder(cells: Tensor, total: Tensor) -> Tensor:
    """Nonnegative integers ``(..., d)`` summing to the integer ``total (...)``, proportional to the nonnegative
    ``cells`` (evenly split where they are all 0) by largest remainders (ties to the first cell)."""
    d = cells.shape[-1]
    mass = cells.sum(-1, keepdim=True)
    share = torch.where(mass > 0, cells / mass.clamp(min=torch.finfo(cells.dtype).tiny), 1.0 / d)
    exact = share * total.unsqueeze(-1)
    floor = torch.floor(exact)
    left = (total - floor.sum(-1)).round().clamp(0, d)  # units still to hand out, 0 <= left < d
    order = torch.sort(exact - floor, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(d, device=cells.device).expand_as(order))
    return floor + (rank < left.unsqueeze(-1)).to(cells.dtype)


class _ConsistentTotal(PostProcessing):
    """Census-style consistency: cells clamped at 0, rescaled to the exact total ``sum_i s_i`` and rounded to
    nonnegative integers by largest remainders."""

    def __init__(self) -> None:
        super().__init__(self._apply, "consistent_total", lattice=1.0, uses_summary=True)

    @staticmethod
    def _apply(noisy: Tensor, s: Tensor) -> Tensor:
        total = torch.round(s.sum(-1)).expand(noisy.shape[:-1])
        return _largest_remainder(noisy.clamp(min=0), total)

    def check(self, inner: Mechanism) -> None:
        if inner.input_dim != inner.dim or inner.dim < 2:
            raise ValueError(
                "consistent_total adjusts the cells of a release to their confidential total: it needs a "
                f"mechanism on >= 2 cells that consumes just them (input_dim == dim), got {inner!r}"
            )

    def likelihood_problem(self, inner: Mechanism) -> str | None:
        return (
            "the consistency step (cells rescaled to the exact total and rounded by largest remainders) "
            "has an intractable likelihood"
        )

    def in_support(self, inner: Mechanism, y: Tensor) -> Tensor:
        return (_integers(y) & (y >= 0)).all(-1)


#: Clamp at 0 (exact likelihood after Laplace, Gaussian and the discrete mechanisms).
nonnegative = _Nonnegative()
#: Round to integers (exact likelihood after Laplace and Gaussian noise; the identity on integer releases).
rounded = _Rounded()
#: Cells adjusted to sum to the exact confidential total (intractable likelihood).
consistent_total = _ConsistentTotal()


class PostProcessed(Mechanism):
    """The release ``fn(noisy)`` of ``mechanism``'s noisy output: ``fn`` a :class:`PostProcessing` step (e.g.
    :data:`nonnegative`, :data:`rounded`, :data:`consistent_total`), a list of them applied in order, or a plain
    vectorized torch function ``noisy -> release`` (no exact likelihood, see :class:`PostProcessing`).

    It consumes the inner mechanism's summary and uniforms (``y = fn(G(s, u))``), states its privacy levels
    (``epsilon``, ``delta``, and ``rho``, ``mu``, ``target_epsilon`` where the inner has them) and its lattice is the
    step's. :meth:`log_prob` is exact where :attr:`has_log_prob`; otherwise it raises :class:`IntractableLikelihood`,
    and methods that need it refuse the mechanism up front (``require_log_prob``).
    """

    def __init__(self, mechanism: Mechanism, fn: PostProcessing | Callable | Sequence) -> None:
        if not isinstance(mechanism, Mechanism):
            raise TypeError(f"PostProcessed needs a dpsbi Mechanism, got {type(mechanism).__name__}")
        if isinstance(fn, (list, tuple)):
            if not fn:
                raise ValueError("PostProcessed needs at least one post-processing step")
            for step in fn[:-1]:
                mechanism = PostProcessed(mechanism, step)
            fn = fn[-1]
        step = fn if isinstance(fn, PostProcessing) else PostProcessing(fn)
        step.check(mechanism)
        self.inner, self.step = mechanism, step
        super().__init__(mechanism.dim, mechanism.epsilon, mechanism.delta)

    def __getattr__(self, name: str):
        if name in _FORWARDED and "inner" in self.__dict__:
            return getattr(self.inner, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def lattice(self) -> float | None:
        return self.step.lattice(self.inner)

    @property
    def input_dim(self) -> int:
        return self.inner.input_dim

    def check_input(self, s: Tensor) -> None:
        self.inner.check_input(s)

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    @property
    def noise_dim(self) -> int:
        return self.inner.noise_dim

    @property
    def likelihood_problem(self) -> str | None:
        """Why :meth:`log_prob` is not exact, or ``None`` when it is."""
        return self.step.likelihood_problem(self.inner)

    @property
    def has_log_prob(self) -> bool:
        return self.likelihood_problem is None

    @property
    def coordinatewise(self) -> bool:
        """Whether the per-coordinate likelihood functions are exact (so further steps can build on them)."""
        return self.has_log_prob and self.step.coordinatewise(self.inner)

    def require_log_prob(self, method: str) -> None:
        problem = self.likelihood_problem
        if problem is not None:
            raise IntractableLikelihood(
                f"{method} needs the likelihood eta(y | s) of {self!r}, but {problem}; "
                "use a simulation-based method (SPPE; SPLE for lattice releases; smc_abc with kernel='euclidean')"
            )

    def require_likelihood_flow(self, method: str) -> None:
        self.inner.require_likelihood_flow(method)
        problem = self.step.release_problem(self.inner)
        if problem is not None:
            raise ValueError(
                f"{method} models the release with a likelihood flow, which needs a density or a lattice, but for "
                f"{self!r} {problem}; use SPPE"
            )

    def _exact(self, what: str) -> None:
        problem = self.likelihood_problem
        if problem is not None:
            raise IntractableLikelihood(f"{self!r}.{what}: {problem}")

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        return self.step(self.inner.transform(s, u), s)

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        self._check_shapes(y, s)
        self._exact("log_prob")
        return self.step.log_prob(self.inner, y, s)

    def max_log_prob(self, y: Tensor) -> Tensor:
        self._exact("max_log_prob")
        return self.step.max_log_prob(self.inner, y)

    def in_support(self, y: Tensor) -> Tensor:
        return self.step.in_support(self.inner, y)

    def _coordinates(self, what: str) -> None:
        self._exact(what)
        if not self.coordinatewise:
            raise IntractableLikelihood(f"{self!r}.{what}: no per-coordinate likelihood")

    def coordinate_log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        self._coordinates("coordinate_log_prob")
        return self.step.coordinate_log_prob(self.inner, y, s)

    def coordinate_log_cdf(self, y: Tensor, s: Tensor) -> Tensor:
        self._coordinates("coordinate_log_cdf")
        return self.step.coordinate_log_cdf(self.inner, y, s)

    def coordinate_log_sf(self, y: Tensor, s: Tensor) -> Tensor:
        self._coordinates("coordinate_log_sf")
        return self.step.coordinate_log_sf(self.inner, y, s)

    def coordinate_max_log_prob(self, y: Tensor) -> Tensor:
        self._coordinates("coordinate_max_log_prob")
        return self.step.coordinate_max_log_prob(self.inner, y)

    def with_epsilon(self, epsilon: float | Tensor) -> PostProcessed:
        """The same post-processing of the inner mechanism re-calibrated at ``epsilon`` (a number, or one per row
        where the inner mechanism takes them: amortized fits over a range, :func:`~dpsbi.mechanisms.epsilon.at_epsilons`)."""
        if torch.is_tensor(epsilon):  # a batched inner states a tensor epsilon, which __init__ would refuse
            return at_epsilons(self, epsilon)
        return PostProcessed(self.inner.with_epsilon(epsilon), self.step)

    def __repr__(self) -> str:
        return f"PostProcessed({self.inner!r}, {self.step.name})"
