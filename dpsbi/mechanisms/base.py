"""The interface every privacy mechanism implements."""

from __future__ import annotations

import abc
import math
import numbers

import numpy as np
import torch
from torch import Tensor


def open_unit(u: Tensor) -> Tensor:
    """Clamp uniforms into the open interval (0, 1) so that inverse CDFs stay finite."""
    tiny = torch.finfo(u.dtype).tiny
    return u.clamp(min=tiny, max=1.0 - torch.finfo(u.dtype).eps / 2)


def as_float(s: Tensor) -> Tensor:
    """Return ``s`` as a floating tensor (integer counts become the default float dtype)."""
    return s if s.is_floating_point() else s.to(torch.get_default_dtype())


#: Integers above this lose their last digits in float32 (its 24-bit significand): 16 777 216.
FLOAT32_EXACT = 2**24
#: float64 holds every integer up to 2^53 exactly.
FLOAT64_EXACT = 2**53


def check_exact_integers(name: str, x: Tensor) -> None:
    """Raise ``ValueError`` naming ``name`` where a floating ``x`` is too narrow to have held its integers exactly:
    float32 (or narrower) values beyond 2^24, or any values beyond 2^53."""
    if not x.is_floating_point() or x.numel() == 0:
        return
    limit = FLOAT64_EXACT if x.dtype == torch.float64 else FLOAT32_EXACT
    largest = float(x.abs().nan_to_num(0.0, 0.0, 0.0).max())
    if largest > limit:
        raise ValueError(
            f"{name}: {largest:.0f} in {x.dtype}, which holds integers exactly only up to {limit} "
            f"(2^{limit.bit_length() - 1}): the value may already be rounded; pass counts as int64 or float64 "
            f"(at most 2^53)"
        )


#: The largest noise scale (Laplace ``b``, Gaussian ``sigma``, discrete scales) a mechanism accepts: noise this
#: wide drowns any statistic, and its releases' squares overflow float32 (3.4e38) where flows z-score them.
MAX_SCALE = 1e15


def check_number(name: str, value) -> float:
    """``value`` as a float, or a ``TypeError`` naming ``name`` unless it is a real number (a Python or numpy
    number, or a one-element tensor; not a string or a bool)."""
    if torch.is_tensor(value) and value.numel() == 1 and not value.dtype == torch.bool:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def check_positive(name: str, value: float) -> float:
    """Raise a ``ValueError`` naming ``name`` unless ``value`` is a finite positive number (a ``TypeError``
    unless it is a number at all, :func:`check_number`)."""
    value = check_number(name, value)
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def check_flag(name: str, value) -> bool:
    """``value`` as a ``bool``, or a ``TypeError`` naming ``name`` unless it is one (a numpy bool too; not
    ``"no"``, which ``bool()`` reads as true, nor ``1``)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_integer(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int, or an error naming ``name`` unless it is a whole number ``>= minimum`` (``2.0`` is
    taken, ``2.7`` and ``"2"`` are not). An integer is taken as it is, not through a float (which rounds above
    2^53)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
    else:
        number = check_number(name, value)
        number = int(number) if math.isfinite(number) and number == math.floor(number) else None
    if number is None or number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return number


#: The least noise scale a mechanism accepts where it computes in float32 (the narrowest dtype its releases are
#: computed in): float32's smallest normal number. Below it the scale is subnormal or rounds to 0 there, so every
#: release equals its statistic and ``log_prob`` divides by 0 (NaN).
MIN_SCALE = torch.finfo(torch.float32).tiny


def check_scale(
    name: str,
    scale: float,
    source: str = "",
    limit: float = MAX_SCALE,
    why: str = "noise that wide drowns any statistic and overflows float32",
    least: float = MIN_SCALE,
    why_least: str = "it is subnormal or 0 in float32, so releases would equal the statistic and log_prob be NaN",
) -> float:
    """Raise a ``ValueError`` unless the noise ``scale`` is a number in ``[least, limit]`` (``why`` and
    ``why_least`` say what goes wrong beyond each end); ``source`` names what it was calibrated from (e.g.
    ``"epsilon=1e-40, sensitivity=1"``), which is what to change."""
    origin = f" (from {source})" if source else ""
    if not scale >= least:  # NaN too
        raise ValueError(
            f"noise {name}={scale:g}{origin} is below {least:g}: {why_least}; use a smaller epsilon (or a larger "
            "scale)"
        )
    if not scale <= limit:
        raise ValueError(
            f"noise {name}={scale:g}{origin} lies outside (0, {limit:g}]: {why}; use a larger epsilon (or a "
            "smaller scale)"
        )
    return scale


def check_coordinates(name: str, value, dim: int | None) -> tuple[float | tuple[float, ...], int]:
    """``(value, dim)`` for a parameter given as one number or as one per coordinate: a number stays a float
    (:func:`check_positive`, ``dim`` defaulting to 1); a sequence or 1-d tensor of positive numbers becomes a
    tuple of floats, ``dim`` its length (a ``ValueError`` if ``dim`` is given and differs)."""
    if isinstance(value, (list, tuple)) or (torch.is_tensor(value) and value.numel() != 1):
        values = torch.as_tensor(value).flatten().tolist() if torch.is_tensor(value) else list(value)
        if not values:
            raise ValueError(f"{name} needs at least one number, got {value!r}")
        values = tuple(check_positive(f"{name}[{j}]", v) for j, v in enumerate(values))
        if dim is not None and check_integer("dim", dim) != len(values):
            raise ValueError(f"{name} holds {len(values)} numbers, one per coordinate, but dim={dim}")
        return values, len(values)
    return check_positive(name, value), 1 if dim is None else check_integer("dim", dim)


def coordinate_tensor(mechanism: object, value, like: Tensor):
    """``value`` ready to combine with ``like (..., dim)``: a float or a tensor as it is, a tuple of per-coordinate
    floats as a ``(dim,)`` tensor on ``like``'s device and in its dtype, cached on ``mechanism`` so that a training
    step copies nothing to the device (built in place while ``torch.compile`` traces)."""
    if not isinstance(value, tuple):
        return value
    if torch.compiler.is_compiling():
        return torch.tensor(value, dtype=like.dtype, device=like.device)
    cache = mechanism.__dict__.setdefault("_coordinate_cache", {})
    key = (value, like.device, like.dtype)
    if key not in cache:
        cache[key] = torch.tensor(value, dtype=like.dtype, device=like.device)
    return cache[key]


def log_sum(value: float | tuple[float, ...], dim: int, factor: float = 1.0) -> float:
    """``sum_j log(factor value_j)`` over ``dim`` coordinates, for one value shared by all or a tuple of them."""
    if isinstance(value, tuple):
        return sum(math.log(factor * v) for v in value)
    return dim * math.log(factor * value)


def per_coordinate(*values) -> tuple[tuple[float, ...], ...]:
    """Parameters given as one number or one per coordinate (:func:`check_coordinates`), all as tuples of the
    same length; ``ValueError`` if two vectors differ in length."""
    dims = {len(v) for v in values if isinstance(v, tuple)} or {1}
    if len(dims) > 1:
        raise ValueError(f"per-coordinate parameters differ in length: {sorted(dims)}")
    (dim,) = dims
    return tuple(v if isinstance(v, tuple) else (v,) * dim for v in values)


def show(value: float | tuple[float, ...] | Tensor) -> str:
    """A number as ``%g``, a tuple of them as ``(a, b, ...)``, a tensor of one per row (a mechanism at a tensor of
    epsilons, :mod:`~dpsbi.mechanisms.epsilon`) as ``tensor(a, b, ...)`` up to six values, else ``tensor(n values in
    [low, high])`` (for ``__repr__``)."""
    if torch.is_tensor(value):
        values = value.detach().flatten().tolist()
        if len(values) <= 6:
            return f"tensor({', '.join(f'{v:g}' for v in values)})"
        return f"tensor({len(values)} values in [{min(values):g}, {max(values):g}])"
    return f"({', '.join(f'{v:g}' for v in value)})" if isinstance(value, tuple) else f"{value:g}"


def lattice_cells(mechanism: Mechanism) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The release coordinates on a lattice and their spacings (:attr:`Mechanism.lattices`); empty for a
    mechanism whose releases have a density."""
    pairs = [(j, h) for j, h in enumerate(mechanism.lattices) if h is not None]
    return tuple(j for j, _ in pairs), tuple(float(h) for _, h in pairs)


class IntractableLikelihood(ValueError):
    """A method needs the exact likelihood ``eta(y | s)`` of a mechanism that has none (e.g. a release
    post-processed by a step whose likelihood is intractable)."""


class Mechanism(abc.ABC):
    """A curator's privacy mechanism ``y ~ eta(. | s)`` on a ``dim``-dimensional statistic.

    Every mechanism is also a deterministic map ``y = G(s, u)`` of uniforms
    ``u in (0, 1)^noise_dim`` (its inverse CDF), which lets RQMC integrate over the noise.
    Batch shapes of ``s`` and ``u`` broadcast: ``s`` of shape ``(N, 1, dim)`` with ``u`` of shape
    ``(N, M, noise_dim)`` gives releases of shape ``(N, M, dim)``.
    """

    #: Spacing ``h`` of the lattice the releases lie on (every coordinate a multiple of ``h``), or ``None`` for
    #: releases with a density. A likelihood flow models a lattice release dequantized, ``y + h v``, ``v ~ U[0, 1)^dim``.
    lattice: float | None = None

    @property
    def lattices(self) -> tuple[float | None, ...]:
        """Each release coordinate's lattice spacing (``None`` where it has a density): ``dim`` entries, all
        :attr:`lattice` unless coordinates differ (a :class:`~dpsbi.mechanisms.Composition` of continuous and
        integer blocks)."""
        return (self.lattice,) * self.dim

    #: Whether a release coordinate below (above) every value its statistic can take says no more than one at
    #: that bound: true of noise whose log density is linear in ``|y - s|`` (Laplace, discrete Laplace), where
    #: ``eta(y | s)`` for ``y <= low <= s`` is ``eta(low | s)`` times a constant. The posterior flows then clamp
    #: such coordinates to the task's ``statistic_bounds`` (:meth:`~dpsbi.tasks.Task.release_bounds`).
    clamp_lossless: bool = False

    @property
    def clamps_lossless(self) -> tuple[bool, ...]:
        """:attr:`clamp_lossless` of each release coordinate: ``dim`` entries (a
        :class:`~dpsbi.mechanisms.Composition` gives each block's)."""
        return (self.clamp_lossless,) * self.dim

    #: The name of a map in :data:`~dpsbi.mechanisms.stabilizing.STABILIZING_MAPS` that takes a release coordinate
    #: one-to-one to a scale where the noise's spread is about the same at every statistic (the binomial's arcsine
    #: of the square root), or ``None``. Posterior flows conditioned on ``log epsilon`` see a release through it,
    #: before z-scoring (FlowSettings ``stabilize_release``); one-to-one, so the exact posterior is the same.
    stabilizing_map: str | None = None

    @property
    def stabilizing_maps(self) -> tuple[str | None, ...]:
        """:attr:`stabilizing_map` of each release coordinate: ``dim`` entries (a
        :class:`~dpsbi.mechanisms.Composition` gives each block's)."""
        return (self.stabilizing_map,) * self.dim

    def __init__(self, dim: int, epsilon: float, delta: float = 0.0) -> None:
        self.dim = check_integer("dim", dim)
        self.epsilon = check_positive("epsilon", epsilon)
        self.delta = check_number("delta", delta)
        if not 0.0 <= self.delta < 1.0:
            raise ValueError(f"delta must lie in [0, 1), got {delta}")

    @property
    def input_dim(self) -> int:
        """Width of the confidential summary ``s`` it consumes (``dim`` unless the noise depends on more than
        the released statistic, as with smooth sensitivity)."""
        return self.dim

    @property
    def noise_dim(self) -> int:
        """Number of uniforms that ``G`` consumes per release."""
        return self.dim

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype its statistics and releases are held and computed in: torch's default here;
        float64 for mechanisms on integer counts, which float32 holds exactly only up to 2^24."""
        return torch.get_default_dtype()

    def as_values(self, x: Tensor) -> Tensor:
        """Statistics or releases ``x`` (any numeric tensor) as the floating tensor this mechanism computes in:
        :attr:`dtype` when it is float64, else ``x``'s own floating dtype (integers become torch's default)."""
        return x.to(torch.float64) if self.dtype == torch.float64 else as_float(x)

    @abc.abstractmethod
    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        """``G(s, u)``: releases of shape ``broadcast(s, u)[:-1] + (dim,)`` from uniforms in (0, 1)."""

    @abc.abstractmethod
    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        """Exact ``log eta(y | s)`` of releases ``y (..., dim)`` given statistics ``s (..., input_dim)``, summed over
        coordinates; shape ``broadcast(y, s)[:-1]``. A ``ValueError`` for other widths (:meth:`_check_shapes`)."""

    @abc.abstractmethod
    def max_log_prob(self, y: Tensor) -> Tensor:
        """An upper bound of ``sup_s log eta(y | s)`` of shape ``y.shape[:-1]`` (for rejection ABC)."""

    def in_support(self, y: Tensor) -> Tensor:
        """Boolean tensor of shape ``y.shape[:-1]``: whether each release can be produced."""
        return torch.isfinite(y).all(-1)

    @property
    def has_log_prob(self) -> bool:
        """Whether :meth:`log_prob` is the exact likelihood (False for post-processing whose likelihood is
        intractable, see :class:`~dpsbi.mechanisms.PostProcessed`): the methods that evaluate ``eta(y | s)``
        (exact ABC, PMMH, MHAAR, DA-MCMC, MCEM, ...) refuse a mechanism without it."""
        return True

    def require_log_prob(self, method: str) -> None:
        """Raise :class:`IntractableLikelihood` (one line naming ``method``) unless :attr:`has_log_prob`."""
        if not self.has_log_prob:
            raise IntractableLikelihood(
                f"{method} evaluates the likelihood eta(y | s) of {self!r}, which is intractable; "
                "use a simulation-based method (SPPE; SPLE for lattice releases; smc_abc with kernel='euclidean')"
            )

    def require_likelihood_flow(self, method: str) -> None:
        """Raise ``ValueError`` (one line naming ``method``) unless a likelihood flow can model the releases:
        they have a density, or they lie on the :attr:`lattice` (dequantized). True of every mechanism that is
        not post-processed; :class:`~dpsbi.mechanisms.PostProcessed` refuses steps that break this (an atom at
        0 on top of a density)."""
        return None

    def check_input(self, s: Tensor) -> None:
        """Raise ``ValueError`` naming the problem if the confidential statistics ``s (..., input_dim)`` are not
        ones this mechanism takes (integer statistics for the discrete ones). Called where statistics enter
        (``Task.check_summary``, :meth:`sample` with fresh noise), not in the training loss: it waits for the
        device."""
        return None

    def sample(self, s: Tensor, u: Tensor | None = None, generator: torch.Generator | None = None) -> Tensor:
        """Releases for confidential statistics ``s`` of shape ``(..., input_dim)``.

        With ``u`` (shape ``(..., noise_dim)``, values in [0, 1)) the map is deterministic, which is
        what RQMC uses (on statistics already checked); without it, ``s`` is checked
        (:meth:`check_input`) and fresh uniforms come from ``generator``.
        """
        self._check_last_dim("s", s, self.input_dim)
        if u is None:
            self.check_input(s)
        s = self.as_values(s)
        if u is None:
            u = torch.rand(
                s.shape[:-1] + (self.noise_dim,), generator=generator, device=s.device, dtype=s.dtype
            )
        else:
            self._check_last_dim("u", u, self.noise_dim)
            u = u.to(device=s.device, dtype=s.dtype)
        return self.transform(s, open_unit(u))

    def validate_release(self, y: Tensor) -> Tensor:
        """Return ``y`` as a ``(n, dim)`` float tensor (:meth:`as_values`), or raise ``ValueError`` naming the
        problem."""
        if not torch.is_tensor(y):  # through float64, which keeps integers up to 2^53
            y = torch.as_tensor(y, dtype=torch.float64).to(self.dtype)
        if self.dtype == torch.float64:
            check_exact_integers("release", y)
        y = self.as_values(y)
        if y.ndim == 1:
            y = y.unsqueeze(0)
        if y.ndim != 2 or y.shape[-1] != self.dim:
            raise ValueError(
                f"release must have shape (n, {self.dim}) for {type(self).__name__}, got {tuple(y.shape)}"
            )
        bad = ~self.in_support(y)
        if bad.any():
            rows = bad.nonzero().flatten().tolist()[:5]
            raise ValueError(
                f"release rows {rows} lie outside the support of {self!r}: e.g. {y[rows[0]].tolist()}"
            )
        return y

    def _check_shapes(self, y: Tensor, s: Tensor) -> None:
        """Raise ``ValueError`` unless releases ``y`` end in ``dim`` coordinates and statistics ``s`` in
        ``input_dim`` (what :meth:`log_prob` takes). Shapes only, no tensor value: free in a compiled training step."""
        self._check_last_dim("y", y, self.dim)
        self._check_last_dim("s", s, self.input_dim)

    def _check_last_dim(self, name: str, x: Tensor, expected: int) -> None:
        if x.ndim == 0 or x.shape[-1] != expected:
            raise ValueError(
                f"{name} must have last dimension {expected} for {type(self).__name__}, got shape {tuple(x.shape)}"
            )

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_coordinate_cache"}  # device tensors: rebuilt

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dim={self.dim}, epsilon={show(self.epsilon)}, delta={show(self.delta)})"
        )


class AdditiveNoise:
    """Mixin of mechanisms ``y = s + n`` whose coordinates ``n_i`` are i.i.d., symmetric about 0 and unimodal,
    with a density (``lattice = None``) or on the integers (``lattice = 1``). Subclasses define the elementwise
    :meth:`noise_log_prob` and :meth:`noise_log_cdf`; the per-coordinate functions below are what exact
    post-processing likelihoods (clamping, rounding: :class:`~dpsbi.mechanisms.PostProcessed`) are built from.
    """

    lattice: float | None

    def noise_log_prob(self, x: Tensor) -> Tensor:
        """Elementwise log density (or pmf) of one noise coordinate at ``x``."""
        raise NotImplementedError

    def noise_log_cdf(self, x: Tensor) -> Tensor:
        """Elementwise ``log P(n_i <= x)``."""
        raise NotImplementedError

    def noise_of(self, y: Tensor, s: Tensor) -> Tensor:
        """``y - s`` computed in the mechanism's dtype (:meth:`Mechanism.as_values`: float64 for counts)."""
        return self.as_values(y) - self.as_values(s)

    def coordinate_log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        """Elementwise ``log eta_i(y_i | s_i)``, shape ``broadcast(y, s)``."""
        return self.noise_log_prob(self.noise_of(y, s))

    def coordinate_log_cdf(self, y: Tensor, s: Tensor) -> Tensor:
        """Elementwise ``log P(Y_i <= y_i | s_i)``."""
        return self.noise_log_cdf(self.noise_of(y, s))

    def coordinate_log_sf(self, y: Tensor, s: Tensor) -> Tensor:
        """Elementwise ``log P(Y_i > y_i | s_i)``, from the lower tail by symmetry (no cancellation)."""
        x = self.noise_of(y, s)
        return self.noise_log_cdf(-x if self.lattice is None else -torch.floor(x) - 1)

    def coordinate_max_log_prob(self, y: Tensor) -> Tensor:
        """Elementwise ``sup_s log eta_i(y_i | s_i)``: the noise's mode is 0."""
        return self.noise_log_prob(torch.zeros_like(y))
