"""SMC-ABC: population Monte Carlo ABC (Beaumont et al. 2009) as the main paper ran it, plus an exact variant
whose ABC kernel is the privacy mechanism's density.

Each generation draws particles from the previous weighted population perturbed by a Gaussian with
``kernel_scale`` (2, as Beaumont et al.) times the population's weighted covariance, and weighs them by
``prior / mixture proposal``. Particles move in the task's unconstrained space ``z = transform^-1(theta)``
(the identity for Gaussian priors; log for positive parameters, stick-breaking for simplices), so the
perturbation never leaves the prior's support; the prior density there includes the Jacobian.

Tolerances decrease ``tolerance_start, tolerance_start * decay, ...`` down to ``tolerance_end``.

* ``kernel="euclidean"``: particle accepted when ``||y_sim - y|| <= tolerance * distance_scale``, where
  ``distance_scale`` (default) is the median distance between ``y`` and releases simulated from the prior,
  so tolerance 1 accepts about half the prior predictive. The result is the ABC posterior at
  ``tolerance_end``: an approximation.
* ``kernel="mechanism"``: no rejection; a particle's weight is multiplied by ``eta(y | s)^power`` with
  ``power = tolerance_end / tolerance`` (tempering: for Laplace noise ``eta^power`` is a Laplace kernel
  ``1 / power`` times wider, so a tolerance is a bandwidth relative to the mechanism's own). The last
  generation has ``power = 1`` and is importance sampling of the exact private posterior
  ``p(theta | y) ∝ prior(theta) E[eta(y | s) | theta]`` from the adapted proposal (Gong, Sec. 3): its
  weighted draws are consistent, not approximate.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..mechanisms.base import check_integer
from ..tasks import Task
from .exact_abc import (
    SimulationBudgetExceeded,
    kish_ess,
    mechanism_log_weights,
    normalize,
    seeded,
    target_release,
)
from .result import BaselineResult

KERNELS = ("euclidean", "mechanism")
#: Below this ESS a generation is reported as degenerate.
MIN_ESS = 10
#: Entries of the (rows x particles) matrix that :meth:`Perturbation.log_prob` evaluates at once.
_CHUNK = 1 << 22


def tolerance_schedule(start: float, end: float, decay: float) -> list[float]:
    """``start, start * decay, start * decay^2, ...`` while above ``end``, then ``end`` itself."""
    if not 0 < end <= start:
        raise ValueError(
            f"tolerances must satisfy 0 < tolerance_end <= tolerance_start, got {start} and {end}"
        )
    if not 0 < decay < 1:
        raise ValueError(f"decay must lie in (0, 1), got {decay}")
    tolerances = [float(start)]
    while tolerances[-1] * decay > end * (1 + 1e-9):
        tolerances.append(tolerances[-1] * decay)
    return tolerances + [float(end)] if tolerances[-1] > end else tolerances


def unconstrained_log_prior(task: Task, z: Tensor) -> tuple[Tensor, Tensor]:
    """``theta = transform(z)`` and the prior's log density ``(n,)`` of ``z (n, dim_unconstrained)``, Jacobian
    included."""
    theta = task.transform(z)
    log_det = task.transform.log_abs_det_jacobian(z, theta)
    if log_det.ndim == z.ndim:  # elementwise transform: sum over coordinates
        log_det = log_det.sum(-1)
    return theta, task.log_prior(theta) + log_det


class Perturbation:
    """Beaumont et al.'s proposal: the mixture ``sum_j W_j N(z_j, Sigma)`` over a weighted population
    ``z (N, d)`` with weights ``W (N,)`` and ``Sigma = scale * (weighted covariance of z)``."""

    def __init__(self, z: Tensor, weights: Tensor, scale: float = 2.0) -> None:
        self.center = weights @ z
        centered = z - self.center
        cov = scale * (centered.T * weights) @ centered
        # Jitter keeps the covariance of a degenerate population (ESS near 1) positive definite.
        jitter = 1e-5 * cov.diagonal().max().clamp(min=1e-12)
        eye = torch.eye(z.shape[1], dtype=z.dtype, device=z.device)
        self.chol = torch.linalg.cholesky((cov + cov.T) / 2 + jitter * eye)
        self.z, self.weights = z, weights
        self.white = self._whiten(z)
        self.log_norm = -self.chol.diagonal().log().sum() - 0.5 * z.shape[1] * math.log(2 * math.pi)

    def _whiten(self, x: Tensor) -> Tensor:
        """``L^-1 (x - center)`` row by row, with ``Sigma = L L^T``."""
        return torch.linalg.solve_triangular(self.chol, (x - self.center).T, upper=False).T

    def sample(self, n: int) -> Tensor:
        """``n`` proposals ``(n, d)``: a particle drawn by weight, plus ``N(0, Sigma)`` noise."""
        idx = torch.multinomial(self.weights, n, replacement=True)
        return self.z[idx] + torch.randn_like(self.z[idx]) @ self.chol.T

    def log_prob(self, x: Tensor) -> Tensor:
        """Mixture log density of ``x (n, d)``, shape ``(n,)`` (chunked over rows to bound memory)."""
        log_w = self.weights.log()
        white_sq = (self.white**2).sum(-1)
        rows = max(1, _CHUNK // self.z.shape[0])
        parts = []
        for part in self._whiten(x).split(rows):
            sq = ((part**2).sum(-1, keepdim=True) + white_sq - 2 * part @ self.white.T).clamp(min=0)
            parts.append(torch.logsumexp(log_w - 0.5 * sq, -1))
        return torch.cat(parts) + self.log_norm


class _Sampler:
    """One SMC-ABC run: the task, the release, and the simulation count shared by its generations."""

    def __init__(
        self,
        task: Task,
        y: Tensor,
        num_particles: int,
        max_simulations: int,
        max_batch_size: int,
        distance_scale: float | None,
    ) -> None:
        self.task, self.y, self.n = task, y, num_particles
        self.max_simulations, self.max_batch_size = max_simulations, max_batch_size
        self.distance_scale = distance_scale
        self.simulations = 0
        self.acceptance = 1.0  # acceptance rate of the last Euclidean generation, sizes the next batches

    def propose(self, n: int, proposal: Perturbation | None) -> tuple[Tensor, Tensor, Tensor]:
        """``n`` particles from the prior (``proposal=None``) or the perturbation: ``z``, ``theta`` and
        ``log prior(z) - log proposal(z)`` (``-inf`` outside the prior's support)."""
        if proposal is None:
            z = self.task.transform.inv(self.task.prior.sample((n,)).to(self.y))
        else:
            z = proposal.sample(n)
        theta, lp = unconstrained_log_prior(self.task, z)
        log_q = lp if proposal is None else proposal.log_prob(z)
        return z, theta, torch.where(torch.isfinite(lp), lp - log_q, -math.inf)

    def mechanism(self, power: float, proposal: Perturbation | None) -> tuple[Tensor, Tensor]:
        """A generation weighted by ``eta(y | s)^power``: particles ``z (N, d)`` and log weights ``(N,)``."""
        z, theta, log_ratio = self.propose(self.n, proposal)
        log_w = mechanism_log_weights(self.task, theta, log_ratio, self.y, power)
        self.simulations += int(torch.isfinite(log_ratio).sum())
        return z, log_w

    def euclidean(self, tolerance: float, proposal: Perturbation | None) -> tuple[Tensor, Tensor]:
        """A generation of ``N`` particles with ``||y_sim - y|| <= tolerance * distance_scale``, simulated in
        batches sized by the last acceptance rate; particles ``z (N, d)`` and log weights ``(N,)``."""
        zs, log_ws = [], []
        accepted = simulations = 0
        while accepted < self.n:
            if self.simulations >= self.max_simulations:
                raise SimulationBudgetExceeded(
                    f"smc_abc hit max_simulations={self.max_simulations} after {self.simulations} simulations in all: the "
                    f"generation at tolerance {tolerance:.3g} had accepted {accepted} of {self.n} particles in its "
                    f"{simulations} simulations; raise max_simulations, or use kernel='mechanism' (no tolerance schedule)"
                )
            remaining = self.n - accepted
            size = min(
                self.max_batch_size, max(remaining, math.ceil(1.2 * remaining / max(self.acceptance, 1e-6)))
            )
            z, theta, log_ratio = self.propose(min(size, self.max_simulations - self.simulations), proposal)
            inside = torch.isfinite(log_ratio)
            distance = (self.task.simulate_release(theta[inside]) - self.y).norm(dim=-1)
            if self.distance_scale is None:
                self.distance_scale = self._median_scale(distance)
            keep = distance <= tolerance * self.distance_scale
            zs.append(z[inside][keep])
            log_ws.append(log_ratio[inside][keep])
            accepted += int(keep.sum())
            simulations += int(inside.sum())
            self.simulations += int(inside.sum())
            self.acceptance = accepted / max(simulations, 1)
        return torch.cat(zs)[: self.n], torch.cat(log_ws)[: self.n]

    @staticmethod
    def _median_scale(distance: Tensor) -> float:
        scale = float(distance.median())
        if not scale > 0:
            raise ValueError(
                "smc_abc: the median prior-predictive distance to y is 0; pass distance_scale=<float>"
            )
        return scale


def smc_abc(
    task: Task,
    num_particles: int = 2000,
    tolerance_start: float = 1.0,
    tolerance_end: float = 0.2,
    decay: float = 0.7,
    ess_min: float = 0.5,
    kernel: str = "euclidean",
    y: Tensor | None = None,
    distance_scale: float | None = None,
    kernel_scale: float = 2.0,
    max_batch_size: int = 100_000,
    max_simulations: int = 10_000_000,
    seed: int | None = None,
    progress: bool = True,
) -> BaselineResult:
    """Population Monte Carlo ABC; weighted particles ``(num_particles, dim_theta)`` of the last generation.

    ``kernel`` is ``"euclidean"`` (Beaumont et al.; tolerances in units of ``distance_scale``, by default the
    median prior-predictive distance to ``y``) or ``"mechanism"`` (tempered mechanism density, last generation
    exact; see the module docstring). The population is resampled when its ESS falls below
    ``ess_min * num_particles``. Raises :class:`SimulationBudgetExceeded` past ``max_simulations``. ``info``
    holds, per generation, the tolerance, ESS, simulations and acceptance rate (Euclidean) or power (mechanism).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "mechanism":
        task.require_mechanism_release("smc_abc(kernel='mechanism')")
    num_particles = check_integer("num_particles", num_particles, minimum=2)
    if not 0 < ess_min <= 1:
        raise ValueError(f"ess_min is a fraction of num_particles in (0, 1], got {ess_min}")
    if not kernel_scale > 0:
        raise ValueError(f"kernel_scale must be > 0, got {kernel_scale}")
    if distance_scale is not None and not distance_scale > 0:
        raise ValueError(f"distance_scale must be > 0 or None, got {distance_scale}")
    tolerances = tolerance_schedule(tolerance_start, tolerance_end, decay)
    if kernel == "mechanism" and num_particles * len(tolerances) > max_simulations:
        raise SimulationBudgetExceeded(
            f"smc_abc(kernel='mechanism') needs {num_particles} x {len(tolerances)} generations = "
            f"{num_particles * len(tolerances)} simulations, above max_simulations={max_simulations}"
        )
    y = target_release(task, y, "smc_abc")
    sampler = _Sampler(task, y, int(num_particles), int(max_simulations), int(max_batch_size), distance_scale)
    info: dict = {"kernel": kernel, "tolerances": tolerances, "ess": [], "simulations": [], "resampled": []}
    info["acceptance_rates" if kernel == "euclidean" else "powers"] = []
    proposal = None
    with seeded(seed):
        bar = tqdm(tolerances, desc=f"smc_abc ({kernel})", disable=not progress)
        for generation, tolerance in enumerate(bar):
            before = sampler.simulations
            if kernel == "euclidean":
                z, log_w = sampler.euclidean(tolerance, proposal)
                info["acceptance_rates"].append(sampler.acceptance)
            else:
                z, log_w = sampler.mechanism(tolerance_end / tolerance, proposal)
                info["powers"].append(tolerance_end / tolerance)
            weights = normalize(log_w, "smc_abc")
            ess = kish_ess(weights)
            info["ess"].append(ess)
            info["simulations"].append(sampler.simulations - before)
            bar.set_postfix(tolerance=f"{tolerance:.3g}", ess=f"{ess:.0f}", simulations=sampler.simulations)
            if generation == len(tolerances) - 1:
                break
            resample = ess < ess_min * num_particles
            info["resampled"].append(resample)
            if resample:
                z = z[torch.multinomial(weights, num_particles, replacement=True)]
                weights = torch.full_like(weights, 1.0 / num_particles)
            proposal = Perturbation(z, weights, kernel_scale)
    if kernel == "euclidean":
        info["distance_scale"] = sampler.distance_scale
    if min(info["ess"]) < MIN_ESS:
        warnings.warn(
            f"smc_abc: the population degenerated (ESS per generation {[round(e, 1) for e in info['ess']]}); "
            "the draws are unreliable: use more particles, or a longer schedule (larger tolerance_start, decay "
            "closer to 1)",
            RuntimeWarning,
            stacklevel=2,
        )
    return BaselineResult(task.transform(z), sampler.simulations, weights=weights, info=info)
