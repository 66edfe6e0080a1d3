"""The Gaussian mechanism with classic, analytic and Gaussian-DP calibration."""

from __future__ import annotations

import math

import torch
from scipy.optimize import brentq
from scipy.stats import norm
from torch import Tensor

from .base import AdditiveNoise, Mechanism, check_positive


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


def analytic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest sigma whose Gaussian mechanism is exactly (epsilon, delta)-DP."""
    mu = brentq(lambda m: analytic_delta(m, epsilon) - delta, 1e-8, 1e4, xtol=1e-14)
    return sensitivity / mu


class Gaussian(AdditiveNoise, Mechanism):
    """``y = s + sigma * N(0, I)``.

    Calibrated from ``(epsilon, delta)`` and the L2 ``sensitivity`` with ``calibration='classic'``
    (Dwork & Roth, epsilon < 1) or ``'analytic'`` (exact, any epsilon); :meth:`gdp` builds the
    ``mu``-Gaussian-DP form ``sigma = sensitivity / mu``.
    """

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
        self.sigma = calibrators[calibration](self.epsilon, self.delta, self.sensitivity)
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
