"""The Gaussian mechanism with classic, analytic and Gaussian-DP calibration."""

from __future__ import annotations

import math

import torch
from scipy.optimize import brentq
from scipy.stats import norm
from torch import Tensor

from .base import AdditiveNoise, Mechanism, check_positive, check_scale
from .epsilon import batched_copy, epsilons


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


#: ``log mu`` of the analytic calibration on a grid of ``log epsilon`` in [-10, 10], per delta (:func:`analytic_mu`).
_MU_TABLES: dict[float, Tensor] = {}
_LOG_EPS = (-10.0, 10.0, 2049)


def _bisected_mu(eps: Tensor, delta: float) -> Tensor:
    """``mu`` with ``analytic_delta(mu, eps) = delta`` for every entry of ``eps`` (float64): bisection in ``log mu``
    on ``[1e-8, 1e4]`` (where :func:`analytic_sigma`'s ``brentq`` looks), 64 halvings, all entries at once."""
    lo, hi = torch.full_like(eps, math.log(1e-8)), torch.full_like(eps, math.log(1e4))
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
    ``log epsilon`` (built once per ``delta`` by bisection), then polished by three Newton steps on
    ``delta(mu) = delta``, whose derivative is ``phi(-epsilon / mu + mu / 2)``: agrees with ``brentq`` to ~1e-12.
    Epsilons off the table (outside ``[e^-10, e^10]``) are bisected directly."""
    eps = epsilon.double()
    low, high, points = _LOG_EPS
    if delta not in _MU_TABLES:
        grid = torch.linspace(low, high, points, dtype=torch.float64)
        _MU_TABLES[delta] = torch.log(_bisected_mu(torch.exp(grid), delta))
    x = torch.log(eps)
    if not bool(((x >= low) & (x <= high)).all()):
        return _bisected_mu(eps, delta)
    table = _MU_TABLES[delta].to(eps.device)
    position = (x - low) / (high - low) * (points - 1)
    index = position.floor().clamp(0, points - 2)
    weight = position - index
    index = index.long()
    mu = torch.exp(table[index] * (1 - weight) + table[index + 1] * weight)
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


class Gaussian(AdditiveNoise, Mechanism):
    """``y = s + sigma * N(0, I)``.

    Calibrated from ``(epsilon, delta)`` and the L2 ``sensitivity`` with ``calibration='classic'``
    (Dwork & Roth, epsilon < 1) or ``'analytic'`` (exact, any epsilon); :meth:`gdp` builds the
    ``mu``-Gaussian-DP form ``sigma = sensitivity / mu``.
    """

    #: :meth:`with_epsilon` also takes a tensor of epsilons (see :mod:`dpsbi.mechanisms.epsilon`).
    batched_epsilon = True

    def __init__(
        self,
        epsilon: float,
        delta: float,
        sensitivity: float,
        dim: int = 1,
        calibration: str = "analytic",
    ) -> None:
        super().__init__(dim, epsilon, delta)
        if not 0 < delta < 1:
            raise ValueError(f"the Gaussian mechanism needs 0 < delta < 1, got {delta}")
        self.sensitivity = check_positive("sensitivity", sensitivity)
        calibrators = {"classic": classic_sigma, "analytic": analytic_sigma}
        if calibration not in calibrators:
            raise ValueError(f"unknown calibration {calibration!r}; choose one of {sorted(calibrators)}")
        self._calibration = calibration  # private: not part of a task's identity (saved files predate it)
        self.sigma = check_scale(
            "sigma",
            calibrators[calibration](self.epsilon, self.delta, self.sensitivity),
            f"epsilon={self.epsilon:g}, delta={self.delta:g}, sensitivity={self.sensitivity:g}",
        )
        self.mu = self.sensitivity / self.sigma

    @classmethod
    def gdp(cls, mu: float, sensitivity: float, dim: int = 1, delta: float = 1e-6) -> Gaussian:
        """The ``mu``-GDP mechanism ``sigma = sensitivity / mu``; ``epsilon`` is its exact value at ``delta``."""
        mu = check_positive("mu", mu)
        if analytic_delta(mu, 1e-12) <= delta:
            raise ValueError(f"a {mu}-GDP mechanism is already (0, {delta})-DP; choose a smaller delta")
        upper = 1.0
        while analytic_delta(mu, upper) > delta:  # delta(epsilon) decreases; bracket the root
            upper *= 2
        epsilon = brentq(lambda e: analytic_delta(mu, e) - delta, 1e-12, upper, xtol=1e-14)
        mech = cls(epsilon, delta, sensitivity, dim, calibration="analytic")
        mech.mu, mech.sigma = mu, mech.sensitivity / mu
        return mech

    @classmethod
    def from_sigma(cls, sigma: float, sensitivity: float, dim: int = 1, delta: float = 1e-6) -> Gaussian:
        """The mechanism with noise standard deviation ``sigma`` exactly (``mu = sensitivity / sigma``-GDP,
        ``rho = mu^2 / 2``-zCDP); ``epsilon`` is its exact value at ``delta``."""
        sigma = check_positive("sigma", sigma)
        mech = cls.gdp(check_positive("sensitivity", sensitivity) / sigma, sensitivity, dim, delta)
        mech.sigma = sigma
        return mech

    def with_epsilon(self, epsilon: float | Tensor) -> Gaussian:
        """The same mechanism (sensitivity, dim, delta) at another ``epsilon``, by the same calibration:
        classic or analytic. A Gaussian-DP mechanism (:meth:`gdp`, :meth:`from_sigma`) is re-calibrated
        analytically, which is exactly its own family: its epsilon at ``delta`` is the analytic one, so the
        result is the ``mu``-GDP mechanism whose epsilon at ``delta`` is ``epsilon``. A tensor of epsilons
        broadcasting with the summaries gives one mechanism drawing each row at its own epsilon (its
        ``sigma`` a tensor, :func:`analytic_mu` vectorized; :mod:`dpsbi.mechanisms.epsilon`)."""
        calibration = getattr(self, "_calibration", "analytic")
        if not torch.is_tensor(epsilon):
            return type(self)(epsilon, self.delta, self.sensitivity, self.dim, calibration)
        epsilon = epsilons(epsilon)
        if calibration == "classic":
            if bool((epsilon >= 1).any()):
                raise ValueError(
                    f"classic Gaussian calibration needs epsilon < 1 (got up to {float(epsilon.max()):g}); "
                    "use calibration='analytic'"
                )
            sigma = self.sensitivity * math.sqrt(2 * math.log(1.25 / self.delta)) / epsilon
        else:
            sigma = (self.sensitivity / analytic_mu(epsilon, self.delta)).to(epsilon.dtype)
        return batched_copy(self, epsilon, sigma=sigma, mu=self.sensitivity / sigma)

    @property
    def rho(self) -> float:
        """Its zero-concentrated DP parameter ``rho = sensitivity^2 / (2 sigma^2)`` (Bun & Steinke 2016)."""
        return self.sensitivity**2 / (2 * self.sigma**2)

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        # ndtri stays finite for every u in (0, 1); sqrt(2) erfinv(2u - 1) is -inf in float32 below u = 2^-25.
        return s + self.sigma * torch.special.ndtri(u)

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        z = (y - s) / self.sigma
        return (-0.5 * z**2 - math.log(self.sigma) - 0.5 * math.log(2 * math.pi)).sum(-1)

    def max_log_prob(self, y: Tensor) -> Tensor:
        value = -self.dim * (math.log(self.sigma) + 0.5 * math.log(2 * math.pi))
        return torch.full(y.shape[:-1], value, dtype=y.dtype, device=y.device)

    def noise_log_prob(self, x: Tensor) -> Tensor:
        return -0.5 * (x / self.sigma) ** 2 - math.log(self.sigma) - 0.5 * math.log(2 * math.pi)

    def noise_log_cdf(self, x: Tensor) -> Tensor:
        return torch.special.log_ndtr(x / self.sigma)

    def __repr__(self) -> str:
        return (
            f"Gaussian(dim={self.dim}, epsilon={self.epsilon:g}, delta={self.delta:g}, "
            f"sensitivity={self.sensitivity:g}, sigma={self.sigma:g}, mu={self.mu:g})"
        )
