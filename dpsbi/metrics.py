"""Scores of posterior draws: distances to a reference (C2ST, MMD), spreads against the reference's (sd and
central 95 % width ratios), NLOG, LMD, and calibration (SBC, TARP).

All functions take draws as ``(n, d)`` tensors on any device and return Python floats (or dicts of them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import torch
from sbi.diagnostics import check_tarp, run_sbc, run_tarp
from sbi.diagnostics.sbc import check_uniformity_frequentist
from sbi.utils.metrics import c2st as _sbi_c2st
from sbi.utils.metrics import unbiased_mmd_squared
from torch import Tensor
from torch.distributions import Transform
from tqdm.auto import tqdm

from .seeds import seeded_global_streams

if TYPE_CHECKING:
    from .tasks import Task


def _check_pair(
    a: Tensor, b: Tensor, metric: str, min_rows: int = 2, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """Draws ``a (n, d)`` and ``b (m, d)`` as CPU tensors of ``dtype``, or a ``ValueError`` naming ``metric``, the
    argument at fault and the problem: shapes, fewer than ``min_rows`` rows, rows with NaN/inf."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{metric}: a and b must be (n, d) and (m, d) with the same d, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    for name, draws in (("a", a), ("b", b)):
        if draws.shape[0] < min_rows:
            raise ValueError(f"{metric}: {name} has {draws.shape[0]} rows; it needs at least {min_rows}")
        bad = int((~torch.isfinite(draws).all(-1)).sum())
        if bad:
            raise ValueError(f"{metric}: {name} has {bad} of {draws.shape[0]} rows with NaN/inf")
    return a.detach().to(dtype).cpu(), b.detach().to(dtype).cpu()


def c2st(a: Tensor, b: Tensor, seed: int = 1, classifier: str = "rf", n_folds: int = 5) -> float:
    """Classifier two-sample test accuracy between draws ``a (n, d)`` and ``b (m, d)``: 0.5 means
    indistinguishable, 1.0 fully separable (sbi's z-scored cross-validated classifier). Each set needs at
    least ``n_folds`` finite rows."""
    a, b = _check_pair(a, b, "c2st", min_rows=n_folds)
    return float(_sbi_c2st(a, b, seed=seed, n_folds=n_folds, classifier=classifier))


def mmd(a: Tensor, b: Tensor, scale: float | None = None) -> float:
    """Unbiased squared MMD between ``a (n, d)`` and ``b (m, d)`` with a Gaussian kernel (median-heuristic
    length scale unless ``scale`` is given)."""
    a, b = _check_pair(a, b, "mmd")
    return float(unbiased_mmd_squared(a, b, scale=scale))


#: The spread measures of :func:`spread_ratios`, by the name of their ratio in the run tables.
SPREADS = ("sd_ratio", "width95_ratio")


def spread_ratios(draws: Tensor, reference: Tensor) -> dict[str, list[float]]:
    """Per-parameter spread of ``draws (n, d)`` over that of ``reference (m, d)``, as ratios (draws / reference):
    ``sd_ratio`` the standard deviations' (with Bessel's correction), ``width95_ratio`` the central 95 %
    intervals' widths (the 0.975 minus the 0.025 quantile, linearly interpolated). Above 1: too wide, e.g. far
    tail draws that a C2ST near 0.5 barely registers. Computed in float64."""
    a, b = _check_pair(draws, reference, "spread_ratios", dtype=torch.float64)
    levels = torch.tensor([0.025, 0.975], dtype=torch.float64)

    def width(x: Tensor) -> Tensor:
        low, high = torch.quantile(x, levels, dim=0)
        return high - low

    return {
        "sd_ratio": (a.std(0) / b.std(0)).tolist(),
        "width95_ratio": (width(a) / width(b)).tolist(),
    }


def mean_shift(draws: Tensor, reference: Tensor) -> list[float]:
    """Per-parameter error of the mean of ``draws (n, d)`` in the reference's sds:
    ``(mean(draws) - mean(reference)) / sd(reference)``. A posterior of the right shape in the wrong place (an
    amortized flow pulled towards the prior's bulk at a release in its tail) shows here while its spread ratios
    are near 1. Computed in float64."""
    a, b = _check_pair(draws, reference, "mean_shift", dtype=torch.float64)
    return ((a.mean(0) - b.mean(0)) / b.std(0)).tolist()


def kde_log_prob(samples: Tensor, points: Tensor, bandwidth: float | None = None) -> Tensor:
    """Log density at ``points (m, d)`` of a Gaussian KDE of ``samples (n, d)``, shape ``(m,)``.

    The kernel covariance is ``bandwidth^2`` times the sample covariance, with Scott's factor
    ``n^(-1/(d+4))`` by default (as :class:`scipy.stats.gaussian_kde`). Computed in float64.
    """
    samples = torch.as_tensor(samples).double()
    points = torch.as_tensor(points).to(samples)
    if samples.ndim != 2 or points.ndim != 2 or samples.shape[1] != points.shape[1]:
        raise ValueError(
            f"samples (n, d) and points (m, d) must share d, got {tuple(samples.shape)} and {tuple(points.shape)}"
        )
    n, d = samples.shape
    if n <= d:
        raise ValueError(f"a KDE in {d} dims needs more than {d} draws, got {n}")
    if not torch.isfinite(samples).all():
        raise ValueError("samples contain NaN or inf")
    factor = n ** (-1.0 / (d + 4)) if bandwidth is None else float(bandwidth)
    cov = torch.atleast_2d(torch.cov(samples.T)) * factor**2
    try:
        chol = torch.linalg.cholesky(cov)
    except torch.linalg.LinAlgError:
        raise ValueError("the draws' covariance is singular (constant or collinear draws): no KDE") from None
    diff = (points[:, None, :] - samples[None, :, :]).reshape(-1, d)  # (m n, d)
    z = torch.linalg.solve_triangular(chol, diff.T, upper=False).T.reshape(points.shape[0], n, d)
    log_kernel = (
        -0.5 * (z**2).sum(-1) - torch.log(torch.diagonal(chol)).sum() - 0.5 * d * math.log(2 * math.pi)
    )
    return torch.logsumexp(log_kernel, dim=1) - math.log(n)


def nlog(samples: Tensor, theta: Tensor, transform: Transform | None = None) -> float:
    """NLOG: minus the log density at the true parameter ``theta (1, d_theta)`` of a Gaussian KDE of the
    posterior draws ``samples (n, d_theta)``.

    With ``transform`` (a task's map from the unconstrained space onto the prior's support) the KDE is
    fitted to ``transform.inv(samples)`` and its density carried back with the log-Jacobian, so draws on a
    bounded support or a simplex get a proper density in the prior's parametrisation.
    """
    theta = torch.as_tensor(theta).reshape(1, -1).to(samples)
    if transform is None:
        return float(-kde_log_prob(samples, theta)[0])
    z, z_theta = transform.inv(samples), transform.inv(theta)
    log_det = transform.log_abs_det_jacobian(z_theta, theta).reshape(-1)[0]
    return float(-(kde_log_prob(z, z_theta)[0] - log_det.double()))


def lmd(
    task: Task, samples: Tensor, y: Tensor | None = None, generator: torch.Generator | None = None
) -> float:
    """LMD: log of the median Euclidean distance between ``y (1, d_s)`` (default ``task.y_obs``) and
    releases simulated from the posterior draws ``samples (n, d_theta)``, one release per draw."""
    y = task.y_obs if y is None else task.check_release(y)
    if y is None:
        raise ValueError(f"task {task.name!r} has no observed release; pass y")
    releases = task.simulate_release(samples, generator)
    return float(torch.log((releases - y.to(releases)).norm(dim=-1).median()))


class AmortizedPosterior(Protocol):
    """Any posterior that samples at a given release: ``sample((n,), y=(1, d_s)) -> (n, d_theta)``."""

    def sample(self, sample_shape: tuple[int, ...], y: Tensor | None = None) -> Tensor: ...


class BatchedPosterior(Protocol):
    """A posterior that samples at many releases in one call, as dpsbi's do:
    ``sample_batched((n,), y=(B, d_s), seed=...) -> (n, B, d_theta)``."""

    def sample_batched(self, sample_shape: tuple[int, ...], y: Tensor, seed: int | None = None) -> Tensor: ...


def _draws_at(
    posterior: AmortizedPosterior | BatchedPosterior,
    num_samples: int,
    ys: Tensor,
    seed: int,
    progress: bool = False,
) -> Tensor:
    """``num_samples`` posterior draws at each release of ``ys (B, d_s)``, as a CPU tensor ``(num_samples, B, d_theta)``:
    one ``sample_batched`` call (seeded with ``seed``) where the posterior has it, else a loop of ``sample``
    calls (seeded by torch's global stream)."""
    if hasattr(posterior, "sample_batched"):
        return posterior.sample_batched((num_samples,), y=ys, seed=seed).cpu()
    draws = [
        posterior.sample((num_samples,), y=ys[i : i + 1]).cpu()
        for i in tqdm(range(ys.shape[0]), disable=not progress, desc="calibration posteriors")
    ]
    return torch.stack(draws, dim=1)


class _SBIView:
    """sbi's ``sample_batched`` interface over an amortized dpsbi posterior, remembering the last call so
    that SBC and TARP rank the same draws (sbi hands each a filtered copy of the releases: compared by value)."""

    def __init__(self, posterior: AmortizedPosterior | BatchedPosterior, seed: int, progress: bool) -> None:
        self.posterior, self.seed, self.progress, self._cache = posterior, seed, progress, None

    def sample_batched(self, sample_shape, x: Tensor, show_progress_bars: bool = False) -> Tensor:
        if self._cache is None or not torch.equal(self._cache[0], x):
            (n,) = sample_shape
            self._cache = (x, _draws_at(self.posterior, n, x, self.seed, self.progress))
        return self._cache[1]


def calibration(
    posterior: AmortizedPosterior | BatchedPosterior,
    task: Task,
    num_runs: int = 200,
    num_posterior_samples: int = 1000,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, float | list[float]]:
    """Simulation-based calibration and TARP (sbi's implementations) of an amortized posterior.

    Draws ``num_runs`` pairs ``theta ~ prior``, ``y ~ task`` and ``num_posterior_samples`` draws at each ``y``
    (one ``sample_batched`` call for a dpsbi posterior, else one ``sample`` call per release; SBC and TARP
    share the draws), all fixed by ``seed``.
    Returns ``sbc_ks_pvalues`` (one KS p-value per parameter: uniformity of the SBC ranks), ``tarp_atc``
    (area between TARP's expected-coverage curve and the diagonal above 1/2: > 0 too wide, < 0 too narrow)
    and ``tarp_ks_pvalue``. A calibrated posterior has large p-values and an ATC near 0.
    """
    if num_runs < 10 or num_posterior_samples < 10:
        raise ValueError(
            f"calibration needs num_runs >= 10 and num_posterior_samples >= 10, got {num_runs}, {num_posterior_samples}"
        )
    with seeded_global_streams(seed):
        theta = task.prior.sample((num_runs,))
        ys = task.simulate_release(theta, torch.Generator(device=theta.device).manual_seed(seed))
        view = _SBIView(posterior, int(torch.randint(0, 2**63 - 1, ())), progress)  # the posterior's own seed
        theta, ys = theta.cpu(), ys.cpu()
        ranks, _ = run_sbc(theta, ys, view, num_posterior_samples, show_progress_bar=False)  # type: ignore[arg-type]
        ecp, alpha = run_tarp(
            theta,
            ys,
            view,
            num_posterior_samples=num_posterior_samples,
            show_progress_bar=False,
            num_bins=max(num_runs // 10, 2),
        )  # type: ignore[arg-type]
    atc, ks = check_tarp(ecp, alpha)
    return {
        "sbc_ks_pvalues": [float(p) for p in check_uniformity_frequentist(ranks, num_posterior_samples)],
        "tarp_atc": float(atc),
        "tarp_ks_pvalue": float(ks),
    }
