"""The Gaussian mechanism with classic, analytic and Gaussian-DP calibration."""

from __future__ import annotations

import math

import torch
from scipy.optimize import brentq
from scipy.stats import norm
from torch import Tensor

from .base import (
    AdditiveNoise,
    Mechanism,
    check_coordinates,
    check_positive,
    check_scale,
    coordinate_tensor,
    log_sum,
    per_coordinate,
    show,
)
from .epsilon import batched_copy, epsilons, readable
from .tables import tabled


def classic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Dwork & Roth (Thm. A.1): ``sigma = Delta_2 sqrt(2 log(1.25 / delta)) / epsilon``, valid for epsilon < 1."""
    if epsilon >= 1:
        raise ValueError(
            f"classic Gaussian calibration needs epsilon < 1 (got {epsilon}); use calibration='analytic'"
        )
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def analytic_delta(mu: float, epsilon: float) -> float:
    """Exact delta(epsilon) of a Gaussian mechanism with ``mu = Delta_2 / sigma`` (Balle & Wang 2018)."""
    return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon + norm.logcdf(-epsilon / mu - mu / 2)))


#: The grid of :func:`analytic_mu`'s table of ``log mu``: ``log epsilon`` from -40 (below it ``mu`` no longer moves,
#: to double precision, for any delta >= 1e-12) to 18.75 (beyond every epsilon :func:`analytic_sigma` calibrates:
#: ``mu`` at most 1e4, epsilon about 5e7), in steps of 5/512.
_LOG_EPS = (-40.0, 18.75, 6017)
#: The largest epsilon the vectorized analytic calibration takes (:attr:`Gaussian.epsilon_limits`): the table's end.
EPSILON_MAX = math.exp(_LOG_EPS[1])
#: Where :func:`_bisected_mu` searches: wider than :data:`MU_RANGE` (the scalar calibration's), so that the table
#: holds roots to its ends (``mu`` about 1.7e4 at epsilon e^18.75; ``mu`` near ``delta sqrt(2 pi)`` as epsilon
#: goes to 0, above 1e-13 for delta >= 4e-14).
_TABLE_MU_RANGE = (1e-13, 1e5)


def _bisected_mu(eps: Tensor, delta: float) -> Tensor:
    """``mu`` with ``analytic_delta(mu, eps) = delta`` for every entry of ``eps`` (float64): bisection in ``log mu``
    on :data:`_TABLE_MU_RANGE`, 64 halvings, all entries at once: what :func:`analytic_mu`'s table is built by."""
    lo, hi = (torch.full_like(eps, math.log(bound)) for bound in _TABLE_MU_RANGE)
    for _ in range(64):
        mid = (lo + hi) / 2
        larger = _analytic_delta(torch.exp(mid), eps) > delta  # delta grows with mu: the root lies below
        lo, hi = torch.where(larger, lo, mid), torch.where(larger, mid, hi)
    return torch.exp((lo + hi) / 2)


def _analytic_delta(mu: Tensor, eps: Tensor) -> Tensor:
    """:func:`analytic_delta` on tensors."""
    return torch.special.ndtr(-eps / mu + mu / 2) - torch.exp(
        eps + torch.special.log_ndtr(-eps / mu - mu / 2)
    )


def analytic_mu(epsilon: Tensor, delta: float) -> Tensor:
    """Vectorized :func:`analytic_sigma`: ``mu = Delta_2 / sigma`` (float64) of the exactly ``(epsilon, delta)``-DP
    Gaussian mechanism for every entry of the tensor ``epsilon``. Interpolated in a table of ``log mu`` over
    ``log epsilon`` (:data:`_LOG_EPS`, built once per ``delta`` by bisection: :func:`~dpsbi.mechanisms.tables.
    tabled`), then polished by three Newton steps on ``delta(mu) = delta``, whose derivative is
    ``phi(-epsilon / mu + mu / 2)``: agrees with ``brentq`` wherever it has a root, and solves ``delta(mu) = delta``
    to rounding up to :data:`EPSILON_MAX` (beyond ``brentq``'s range). The same few kernels on every device, eager
    or compiled: a training step neither waits for the host nor breaks its graph. Epsilons above :data:`EPSILON_MAX`
    are refused in one line where :func:`~dpsbi.mechanisms.epsilon.readable` (elsewhere the fit's range is checked
    against it first: :attr:`Gaussian.epsilon_limits`)."""
    eps = epsilon.double()
    x = torch.log(eps)
    if readable(eps) and bool((x > _LOG_EPS[1]).any()):
        raise ValueError(
            f"the analytic Gaussian calibration covers epsilon up to {EPSILON_MAX:.3g}, got "
            f"{float(eps.max()):.3g}; choose smaller epsilons"
        )
    mu = torch.exp(
        tabled("analytic_mu", delta, _LOG_EPS, lambda g: torch.log(_bisected_mu(torch.exp(g), delta)), x)
    )
    for _ in range(3):
        a = -eps / mu + mu / 2
        slope = torch.exp(-0.5 * a**2) / math.sqrt(2 * math.pi)
        mu = (mu - (_analytic_delta(mu, eps) - delta) / slope).clamp_min(1e-12)
    return mu


#: The range of ``mu = sensitivity / sigma`` the analytic calibration searches.
MU_RANGE = (1e-8, 1e4)


def analytic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest sigma whose Gaussian mechanism is exactly (epsilon, delta)-DP; a ``ValueError`` naming the
    range when ``epsilon`` needs a ``mu = sensitivity / sigma`` outside :data:`MU_RANGE`."""
    low, high = (analytic_delta(m, epsilon) - delta for m in MU_RANGE)
    if not low < 0 < high:  # delta(mu) grows with mu: the root must lie inside the range
        raise ValueError(
            f"epsilon={epsilon:g} at delta={delta:g} needs a noise sigma outside [sensitivity/{MU_RANGE[1]:g}, "
            f"sensitivity*{1 / MU_RANGE[0]:g}], the range the analytic Gaussian calibration covers; choose an "
            "epsilon nearer 1 (at most 1e7), or give the noise directly (Gaussian.from_sigma)"
        )
    mu = brentq(lambda m: analytic_delta(m, epsilon) - delta, *MU_RANGE, xtol=1e-14)
    return sensitivity / mu


def gdp_epsilon(mu: float, delta: float) -> float:
    """The exact ``epsilon`` at ``delta`` of a ``mu``-GDP mechanism (the root of :func:`analytic_delta`)."""
    if analytic_delta(mu, 1e-12) <= delta:
        raise ValueError(f"a {mu}-GDP mechanism is already (0, {delta})-DP; choose a smaller delta")
    upper = 1.0
    while analytic_delta(mu, upper) > delta:  # delta(epsilon) decreases; bracket the root
        upper *= 2
    return brentq(lambda e: analytic_delta(mu, e) - delta, 1e-12, upper, xtol=1e-14)


class Gaussian(AdditiveNoise, Mechanism):
    """``y_j = s_j + sigma_j * N(0, 1)`` independently on every coordinate ``j``.

    With one ``sensitivity``: the L2 sensitivity of the whole statistic and one ``sigma`` for every coordinate,
    calibrated from ``(epsilon, delta)`` with ``calibration='classic'`` (Dwork & Roth, epsilon < 1) or
    ``'analytic'`` (exact, any epsilon); :meth:`gdp` builds the ``mu``-Gaussian-DP form ``sigma = sensitivity / mu``.

    With a vector of sensitivities ``(Delta_1, ..., Delta_d)`` (e.g. a DP mean's sum and count): ``Delta_j`` bounds
    coordinate ``j``'s change between neighbouring data sets, all coordinates changing at once. Dividing
    coordinate ``j`` by ``sigma_j`` makes the noise isotropic and the statistic's L2 sensitivity ``mu = sqrt(sum_j
    (Delta_j / sigma_j)^2)``: the release is exactly ``mu``-GDP (``rho = mu^2 / 2``-zCDP), its ``epsilon`` at
    ``delta`` the analytic one of ``mu``. ``Gaussian(epsilon, delta, sensitivities)`` splits ``mu^2`` evenly,
    ``sigma_j = sqrt(d) Delta_j / mu`` (``mu`` by the chosen calibration); :meth:`from_sigma` with a vector of
    sigmas takes any split. ``sensitivity`` and ``sigma`` are then tuples of ``d`` floats.
    """

    #: :meth:`with_epsilon` also takes a tensor of epsilons (see :mod:`dpsbi.mechanisms.epsilon`).
    batched_epsilon = True

    def __init__(
        self,
        epsilon: float,
        delta: float,
        sensitivity: float | tuple[float, ...],
        dim: int | None = None,
        calibration: str = "analytic",
    ) -> None:
        sensitivity, dim = check_coordinates("sensitivity", sensitivity, dim)
        super().__init__(dim, epsilon, delta)
        if not 0 < delta < 1:
            raise ValueError(f"the Gaussian mechanism needs 0 < delta < 1, got {delta}")
        self.sensitivity = sensitivity
        calibrators = {"classic": classic_sigma, "analytic": analytic_sigma}
        if calibration not in calibrators:
            raise ValueError(f"unknown calibration {calibration!r}; choose one of {sorted(calibrators)}")
        self._calibration = calibration  # private: not part of a task's identity (saved files predate it)
        source = f"epsilon={self.epsilon:g}, delta={self.delta:g}"
        if isinstance(sensitivity, tuple):  # both calibrations are linear in the sensitivity
            unit = calibrators[calibration](self.epsilon, self.delta, 1.0)
            self.sigma = tuple(check_scale("sigma", math.sqrt(dim) * d * unit, source) for d in sensitivity)
            self.mu = 1.0 / unit
        else:
            self.sigma = check_scale(
                "sigma",
                calibrators[calibration](self.epsilon, self.delta, self.sensitivity),
                f"{source}, sensitivity={self.sensitivity:g}",
            )
            self.mu = self.sensitivity / self.sigma

    @classmethod
    def gdp(
        cls, mu: float, sensitivity: float | tuple[float, ...], dim: int | None = None, delta: float = 1e-6
    ) -> Gaussian:
        """The ``mu``-GDP mechanism ``sigma = sensitivity / mu`` (per coordinate ``sigma_j = sqrt(d) Delta_j / mu``);
        ``epsilon`` is its exact value at ``delta``."""
        mu = check_positive("mu", mu)
        mech = cls(gdp_epsilon(mu, delta), delta, sensitivity, dim, calibration="analytic")
        mech.mu = mu
        if isinstance(mech.sensitivity, tuple):
            mech.sigma = tuple(math.sqrt(mech.dim) * d / mu for d in mech.sensitivity)
        else:
            mech.sigma = mech.sensitivity / mu
        return mech

    @classmethod
    def from_sigma(
        cls,
        sigma: float | tuple[float, ...],
        sensitivity: float | tuple[float, ...],
        dim: int | None = None,
        delta: float = 1e-6,
    ) -> Gaussian:
        """The mechanism with noise standard deviation ``sigma`` exactly (``mu = sensitivity / sigma``-GDP,
        ``rho = mu^2 / 2``-zCDP; per coordinate ``mu = sqrt(sum_j (sensitivity_j / sigma_j)^2)``); ``epsilon`` is
        its exact value at ``delta``."""
        sigma, _ = check_coordinates("sigma", sigma, dim)
        sensitivity, _ = check_coordinates("sensitivity", sensitivity, dim)
        if not isinstance(sigma, tuple) and not isinstance(sensitivity, tuple):
            sigma = check_scale("sigma", sigma)
            mech = cls.gdp(sensitivity / sigma, sensitivity, dim, delta)
            mech.sigma = sigma
            return mech
        sigma, sensitivity = per_coordinate(sigma, sensitivity)
        mech = cls.gdp(
            math.sqrt(sum((d / s) ** 2 for d, s in zip(sensitivity, sigma))), sensitivity, None, delta
        )
        mech.sigma = tuple(check_scale("sigma", s) for s in sigma)
        return mech

    def with_epsilon(self, epsilon: float | Tensor) -> Gaussian:
        """The same mechanism (sensitivity, dim, delta) at another ``epsilon``, by the same calibration:
        classic or analytic. A Gaussian-DP mechanism (:meth:`gdp`, :meth:`from_sigma`) is re-calibrated
        analytically, which is exactly its own family: its epsilon at ``delta`` is the analytic one, so the
        result is the ``mu``-GDP mechanism whose epsilon at ``delta`` is ``epsilon``. Per-coordinate sigmas are
        all multiplied by ``mu / mu'`` (the same split of ``mu^2``). A tensor of epsilons broadcasting with the
        summaries gives one mechanism drawing each row at its own epsilon (its ``sigma`` a tensor,
        :func:`analytic_mu` vectorized; :mod:`dpsbi.mechanisms.epsilon`)."""
        calibration = getattr(self, "_calibration", "analytic")
        vector = isinstance(self.sigma, tuple)
        if not torch.is_tensor(epsilon):
            if not vector:
                return type(self)(epsilon, self.delta, self.sensitivity, self.dim, calibration)
            mu = 1.0 / {"classic": classic_sigma, "analytic": analytic_sigma}[calibration](
                check_positive("epsilon", epsilon), self.delta, 1.0
            )
            sigma = tuple(s * self.mu / mu for s in self.sigma)
            return batched_copy(
                self, float(epsilon), sigma=tuple(check_scale("sigma", s) for s in sigma), mu=mu
            )
        epsilon = epsilons(epsilon)
        if calibration == "classic":
            if readable(epsilon) and bool((epsilon >= 1).any()):
                raise ValueError(
                    f"classic Gaussian calibration needs epsilon < 1 (got up to {float(epsilon.max()):g}); "
                    "use calibration='analytic'"
                )
            mu = epsilon / math.sqrt(2 * math.log(1.25 / self.delta))
        else:
            mu = analytic_mu(epsilon, self.delta).to(epsilon.dtype)
        if vector:
            return batched_copy(
                self, epsilon, sigma=coordinate_tensor(self, self.sigma, epsilon) * (self.mu / mu), mu=mu
            )
        sigma = self.sensitivity / mu
        return batched_copy(self, epsilon, sigma=sigma, mu=self.sensitivity / sigma)

    @property
    def epsilon_limits(self) -> tuple[float, float] | None:
        """The epsilons an amortized fit may train over: up to :data:`EPSILON_MAX` (analytic calibration), below 1
        (classic), which a training step cannot check without waiting for the device."""
        return (0.0, 1.0) if getattr(self, "_calibration", "analytic") == "classic" else (0.0, EPSILON_MAX)

    @property
    def rho(self) -> float:
        """Its zero-concentrated DP parameter ``rho = sensitivity^2 / (2 sigma^2)`` (Bun & Steinke 2016); per
        coordinate ``mu^2 / 2``, ``mu^2 = sum_j (sensitivity_j / sigma_j)^2``."""
        if isinstance(self.sigma, tuple):
            return sum((d / s) ** 2 for d, s in zip(self.sensitivity, self.sigma)) / 2
        return self.sensitivity**2 / (2 * self.sigma**2)

    def _sd(self, like: Tensor):
        """The noise standard deviation ready to combine with ``like (..., dim)``: a float or a tensor."""
        return coordinate_tensor(self, self.sigma, like)

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        # ndtri stays finite for every u in (0, 1); sqrt(2) erfinv(2u - 1) is -inf in float32 below u = 2^-25.
        return s + self._sd(u) * torch.special.ndtri(u)

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        self._check_shapes(y, s)
        return self.noise_log_prob(y - s).sum(-1)

    def max_log_prob(self, y: Tensor) -> Tensor:
        value = -log_sum(self.sigma, self.dim) - self.dim * 0.5 * math.log(2 * math.pi)
        return torch.full(y.shape[:-1], value, dtype=y.dtype, device=y.device)

    def noise_log_prob(self, x: Tensor) -> Tensor:
        sd = self._sd(x)
        log_sd = math.log(sd) if isinstance(sd, float) else torch.log(sd)
        return -0.5 * (x / sd) ** 2 - log_sd - 0.5 * math.log(2 * math.pi)

    def noise_log_cdf(self, x: Tensor) -> Tensor:
        return torch.special.log_ndtr(x / self._sd(x))

    def __repr__(self) -> str:
        return (
            f"Gaussian(dim={self.dim}, epsilon={show(self.epsilon)}, delta={show(self.delta)}, "
            f"sensitivity={show(self.sensitivity)}, sigma={show(self.sigma)}, mu={show(self.mu)})"
        )
