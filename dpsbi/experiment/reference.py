"""Reference posteriors that runs are scored against, cached on disk per (task, epsilon, release).

``auto`` picks, in order: the task's closed-form posterior (drawn directly, never cached); a reference stored
in the repository for exactly this model and release (``stored``: see :mod:`.stored_references`); importance
sampling with the task's exact likelihood where it carries one (``likelihood``: ``task.exact_log_likelihood``,
e.g. ``census_table``, see :func:`likelihood_importance`); exact rejection ABC
with the mechanism as kernel (Gong, Alg. 1) when a pilot says it fits in ``max_simulations``; otherwise
importance sampling of the exact private posterior (mechanism as kernel) from a defensive mixture fitted to
the last generation of ``smc_abc(kernel="mechanism")``: consistent but not exact, so the reference is flagged
approximate with its effective sample size. Data that are not a release of the mechanism (real outbreaks) get no reference.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch.distributions import MultivariateNormal

from ..baselines.fitted_proposal import fitted_proposal
from ..baselines.resampling import smoothed_resample
from ..files import CorruptFileError, atomic_write_text, exclusive, load_sealed, save_sealed
from ..seeds import seeded_global_streams
from ..tasks import Task
from ..tasks.identity import model_key
from . import stored_references
from .methods import baseline_draws

KINDS = ("auto", "closed_form", "stored", "likelihood", "rejection", "importance", "none")
#: The sampling settings of :func:`reference_posterior` a call leaves out (configs/config.yaml's ``reference``
#: block holds the same values; tests/test_experiments.py checks that they agree).
SETTINGS = {
    "pilot_simulations": 1000,
    "max_simulations": 20_000_000,
    "importance_particles": 5000,
    "importance_draws": 1_000_000,
}


@dataclass
class Reference:
    """Reference draws ``samples (n, dim_theta)`` (``None`` when there is none) and how they were made."""

    samples: Tensor | None
    kind: str
    exact: bool
    note: str
    num_simulations: int = 0

    def describe(self) -> dict:
        """Provenance as a JSON-able dict (no draws)."""
        return {k: v for k, v in asdict(self).items() if k != "samples"}


def acceptance_rate(task: Task, num_simulations: int, seed: int = 0) -> float:
    """Rao-Blackwellised acceptance rate of exact rejection ABC at ``task.y_obs``: the mean over
    ``num_simulations`` prior draws of ``eta(y | s) / sup eta``."""
    with seeded_global_streams(seed):
        theta = task.prior.sample((num_simulations,))
        s = task.simulate(theta, torch.Generator(device=theta.device).manual_seed(seed))
    log_accept = task.mechanism.log_prob(task.y_obs.to(s), s) - task.mechanism.max_log_prob(task.y_obs.to(s))
    return float(torch.logsumexp(log_accept.double(), 0).exp() / num_simulations)


def _rejection(task: Task, num_samples: int, settings: dict, seed: int, progress: bool) -> Reference | None:
    """Exact rejection ABC, or ``None`` when a pilot predicts more than ``max_simulations`` simulations."""
    from ..baselines import SimulationBudgetExceeded, rejection_abc

    rate = acceptance_rate(task, int(settings["pilot_simulations"]), seed)
    if rate * int(settings["max_simulations"]) < 1.2 * num_samples:
        return None
    try:
        result = rejection_abc(
            task, num_samples, max_simulations=int(settings["max_simulations"]), seed=seed, progress=progress
        )
    except SimulationBudgetExceeded:
        return None
    note = f"exact rejection ABC with the mechanism as kernel (acceptance rate {result.info['acceptance_rate']:.3g})"
    return Reference(result.samples, "rejection", True, note, result.num_simulations)


def _importance(task: Task, num_samples: int, settings: dict, seed: int, progress: bool) -> Reference:
    """Importance sampling of the exact posterior (mechanism as kernel): a defensive proposal fitted to
    SMC-ABC's last generation, refitted once to ``importance_draws / 10`` weighted draws (a poor pilot costs
    ESS, not correctness), then ``importance_draws`` simulations."""
    from ..baselines import abc_is, smc_abc

    particles, draws = int(settings["importance_particles"]), int(settings["importance_draws"])
    with warnings.catch_warnings():  # a degenerate pilot only makes the first proposal worse
        warnings.simplefilter("ignore", RuntimeWarning)
        pilot = smc_abc(task, num_particles=particles, kernel="mechanism", seed=seed, progress=progress)
    refit = abc_is(
        task,
        max(draws // 10, particles),
        fitted_proposal(task, pilot.samples, pilot.weights),
        seed=seed + 1,
        progress=progress,
    )
    result = abc_is(
        task,
        draws,
        proposal=fitted_proposal(task, refit.samples, refit.weights),
        seed=seed + 2,
        progress=progress,
    )
    samples = baseline_draws(result, num_samples, torch.Generator().manual_seed(seed))
    note = (
        f"APPROXIMATE: self-normalised importance sampling of the exact private posterior (mechanism as kernel), "
        f"{draws} draws from a defensive Gaussian mixture fitted to SMC-ABC ({particles} particles) and refitted "
        f"once; ESS {result.ess:.0f}; consistent, not exact"
    )
    simulations = pilot.num_simulations + refit.num_simulations + result.num_simulations
    return Reference(samples, "importance", False, note, simulations)


def _mode_and_curvature(log_post: Callable[[Tensor], Tensor], start: Tensor) -> tuple[Tensor, Tensor]:
    """The maximum of ``log_post`` (Nelder-Mead, then Powell, from ``start (dim,)``, float64) and the inverse of
    its negative Hessian there (central differences, step 1e-3; the diagonal of the inverse curvature if it is
    not positive definite)."""
    from scipy.optimize import minimize

    def loss(z):
        value = float(log_post(torch.as_tensor(z, dtype=torch.float64)[None])[0])
        return -value if math.isfinite(value) else 1e300

    z = start.double().numpy()
    z = minimize(loss, z, method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-8, "maxiter": 20_000}).x
    z = minimize(loss, z, method="Powell", options={"xtol": 1e-6, "ftol": 1e-10}).x
    mode, dim, h = torch.as_tensor(z), len(z), 1e-3
    steps = torch.eye(dim, dtype=torch.float64) * h
    # f(mode +- h e_i +- h e_j) for all (i, j): the four corners, each (dim, dim, dim)
    points = [mode + a * steps[:, None] + b * steps[None] for a in (1, -1) for b in (1, -1)]
    corners = log_post(torch.stack(points).reshape(-1, dim)).reshape(4, dim, dim)
    hessian = (corners[0] - corners[1] - corners[2] + corners[3]) / (4 * h * h)
    hessian = (hessian + hessian.T) / 2
    try:
        cov = torch.linalg.inv(-hessian)
        torch.linalg.cholesky(cov)
    except RuntimeError:
        cov = torch.diag(1 / (-hessian.diagonal()).clamp(min=1e-6))
    return mode, cov


def likelihood_importance(task: Task, draws: int, num_samples: int, seed: int = 0) -> tuple[Tensor, dict]:
    """Reference draws from the task's exact likelihood ``task.exact_log_likelihood(theta)`` (at ``task.y_obs``):
    self-normalised importance sampling in the unconstrained space from a defensive Gaussian mixture
    (``0.8 N(m, 1.5^2 C) + 0.2 N(m, 3^2 C)``, :func:`~dpsbi.baselines.fitted_proposal.fitted_proposal`) fitted to ``draws / 10`` pilot draws
    around the Laplace approximation (the posterior mode and inverse curvature), then ``draws`` draws.
    ``num_samples`` unweighted draws ``(num_samples, dim_theta)`` in random order come from systematic
    resampling when no draw would be repeated (``num_samples x`` the largest weight ``<= 1``: the draws are
    then distinct proposal points), else from :func:`smoothed_resample`. Returns them and the weighted
    statistics (mode, ESS, weighted mean and sd, resampling)."""
    space = task.transform

    def log_post(z: Tensor) -> Tensor:
        theta = space(z.to(torch.get_default_dtype())).double()
        log_det = space.log_abs_det_jacobian(z, space(z)).double()
        log_det = log_det.sum(-1) if log_det.ndim > 1 else log_det
        prior = task.prior.log_prob(theta.to(torch.get_default_dtype())).double()
        return prior + log_det + task.exact_log_likelihood(theta).double()

    generator = torch.Generator().manual_seed(seed)
    with seeded_global_streams(seed):
        mode, cov = _mode_and_curvature(log_post, space.inv(task.prior.mean).double())
        # pilot: N(mode, 2^2 cov), weighted, then the defensive mixture fitted to it
        noise = torch.randn(max(draws // 10, 200), len(mode), generator=generator, dtype=torch.float64)
        pilot = mode + 2 * noise @ torch.linalg.cholesky(cov).T
        gaussian = MultivariateNormal(mode, 4 * cov)
        log_w = log_post(pilot) - gaussian.log_prob(pilot)
        theta_pilot = space(pilot.to(torch.get_default_dtype()))
        proposal = fitted_proposal(task, theta_pilot, torch.softmax(log_w, 0).to(theta_pilot))
        theta = proposal.sample((draws,))
        z = space.inv(theta).double()
        # both densities in z: the proposal's mixture itself (its log_prob at theta would divide by the Jacobian
        # that log_post already multiplies by, counting it twice where the transform is not the identity)
        log_w = log_post(z) - proposal.base_dist.log_prob(z.to(theta.dtype)).double()
    weights = torch.softmax(log_w, 0)
    ess = float(1 / (weights**2).sum())
    if num_samples * float(weights.max()) <= 1:  # systematic resampling: each point at most once
        positions = (
            torch.rand((), generator=generator, dtype=torch.float64) + torch.arange(num_samples)
        ) / num_samples
        index = torch.searchsorted(torch.cumsum(weights, 0), positions).clamp(max=draws - 1)
        samples = theta[index[torch.randperm(num_samples, generator=generator)]]
        resampling = "systematic (no repeats)"
    else:
        samples, bandwidth = smoothed_resample(task, theta, weights.to(theta), num_samples, generator)
        resampling = f"Liu-West shrunk kernel, bandwidth {bandwidth:.3f}"
    mean = (weights[:, None] * theta.double()).sum(0)
    sd = (weights[:, None] * (theta.double() - mean) ** 2).sum(0).sqrt()
    info = {
        "importance_draws": int(draws),
        "ess": ess,
        "mode": space(mode.to(torch.get_default_dtype())).tolist(),
        "laplace_sd": cov.diagonal().sqrt().tolist(),
        "weighted_mean": mean.tolist(),
        "weighted_sd": sd.tolist(),
        "monte_carlo_se_of_mean": (sd / math.sqrt(ess)).tolist(),
        "resampling": resampling,
    }
    return samples, info


def _likelihood(task: Task, num_samples: int, settings: dict, seed: int) -> Reference:
    """Importance sampling with the task's exact likelihood (:func:`likelihood_importance`), ``likelihood_draws``
    draws (default ``max(20 000, 20 num_samples)``)."""
    draws = int(settings.get("likelihood_draws") or max(20_000, 20 * num_samples))
    samples, info = likelihood_importance(task, draws, num_samples, seed)
    note = (
        f"APPROXIMATE: importance sampling with the task's exact likelihood: {draws} draws from a defensive "
        f"Gaussian mixture at the Laplace approximation, ESS {info['ess']:.0f}, resampling {info['resampling']}; "
        "consistent, exact up to Monte Carlo error"
    )
    return Reference(samples, "likelihood", False, note, 0)


def _closed_form(task: Task, num_samples: int, seed: int) -> Reference:
    with seeded_global_streams(seed):
        samples = task.exact_posterior(task.y_obs).sample((num_samples,))
    return Reference(samples, "closed_form", True, "exact draws from the task's closed-form posterior")


def _stored(task: Task, num_samples: int) -> Reference | None:
    """The first ``num_samples`` draws (stored in random order) of the repository's reference for ``task``, else ``None``."""
    found = stored_references.find(task)
    if found is None:
        return None
    draws, provenance = found
    if draws.shape[0] < num_samples:
        warnings.warn(
            f"the stored reference for {task.name} holds {draws.shape[0]} draws, fewer than the {num_samples} asked for; using them all",
            stacklevel=3,
        )
    note = f"APPROXIMATE: stored reference ({provenance['method']}; ESS {provenance['ess']:.0f} of {provenance['importance_draws']} draws; made by: {provenance['command']})"
    return Reference(draws[:num_samples], "stored", False, note, int(provenance["importance_draws"]))


def _cache_path(cache_dir: Path, task: Task, task_config: dict, key: dict) -> Path:
    digest = hashlib.sha256(
        json.dumps({**key, "task": task_config}, sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    epsilon = "none" if task.epsilon is None else f"{task.epsilon:g}"
    return cache_dir / task.name / f"eps{epsilon}" / f"{digest}.pt"


def _sampled(
    task: Task, method: str, num_samples: int, settings: dict, seed: int, progress: bool
) -> Reference:
    """A simulated reference: exact rejection ABC (``auto`` when it fits, ``rejection``), else importance sampling."""
    reference = (
        _rejection(task, num_samples, settings, seed, progress) if method in ("auto", "rejection") else None
    )
    if reference is None and method == "rejection":
        raise ValueError(
            f"exact rejection ABC at this release needs more than reference.max_simulations={settings['max_simulations']}"
        )
    if reference is None:
        reference = _importance(task, num_samples, settings, seed, progress)
    return reference


def _load(path: Path) -> Reference | None:
    """The reference cached at ``path``; ``None`` when there is none, or when the file is damaged (with a
    warning naming it: the caller recomputes and replaces it)."""
    try:
        stored = load_sealed(path, "reference cache entry", map_location="cpu")
    except FileNotFoundError:
        return None
    except CorruptFileError as error:
        warnings.warn(f"{error}; recomputing and replacing it", stacklevel=3)
        return None
    return Reference(stored["samples"], **json.loads(stored["provenance"]))


def _store(path: Path, key: dict, reference: Reference) -> None:
    """Cache ``reference`` at ``path`` (sealed: checksummed, written atomically) with its readable key and
    provenance in ``path.json``."""
    save_sealed({"samples": reference.samples.cpu(), "provenance": json.dumps(reference.describe())}, path)
    atomic_write_text(
        path.with_suffix(".json"), json.dumps({**key, **reference.describe()}, indent=2, default=str)
    )


def _os_error(action: Callable[[], object]) -> OSError | None:
    """Run ``action``; the ``OSError`` it raised (say, a read-only cache directory), else ``None``."""
    try:
        action()
    except OSError as error:
        return error
    return None


def _cached(path: Path, key: dict, compute: Callable[[], Reference]) -> Reference:
    """The reference cached at ``path``, else ``compute()`` stored there. The entry's lock is held from the
    check to the write, so concurrent runs sharing the cache compute it once (the others wait, then load it).
    A damaged entry is recomputed and replaced; a cache that cannot be written (no lock, no write) gives the
    computed reference with a warning naming its directory."""
    with contextlib.ExitStack() as stack:
        problem = _os_error(
            lambda: stack.enter_context(exclusive(path.with_suffix(".lock"), f"reference cache entry {path}"))
        )
        stored = _load(path)
        if stored is not None:
            return stored
        reference = compute()
        problem = problem or _os_error(lambda: _store(path, key, reference))
        if problem is not None:
            warnings.warn(
                f"reference cache {path.parent} is not writable ({problem}); this reference was not cached",
                stacklevel=3,
            )
        return reference


def reference_posterior(
    task: Task,
    task_config: dict,
    method: str = "auto",
    num_samples: int = 2000,
    cache_dir: str | Path | None = None,
    seed: int = 0,
    progress: bool = True,
    **settings,
) -> Reference:
    """Reference draws ``(num_samples, dim_theta)`` at ``task.y_obs`` by ``method`` (one of :data:`KINDS`).

    Sampled references are cached under ``cache_dir/<task>/eps<epsilon>/<hash>.pt``, the hash covering the
    task config, the prior and the simulator (:func:`~dpsbi.tasks.identity.model_key`: a changed model under the
    same name never reuses an old reference), the release, ``method``, ``num_samples``, ``seed`` and ``settings`` (``pilot_simulations``,
    ``max_simulations``, ``importance_particles``, ``importance_draws``; those left out take :data:`SETTINGS`; ``likelihood_draws`` optionally sizes the
    exact-likelihood importance sampler); a later call with the same key loads
    them, a concurrent one waits for them (see :func:`_cached` for damaged entries and unwritable caches).
    """
    if method not in KINDS:
        raise ValueError(f"reference.method must be one of {KINDS}, got {method!r}")
    unknown = sorted(set(settings) - {*SETTINGS, "likelihood_draws"})
    if unknown:
        raise ValueError(
            f"unknown reference settings {unknown}; known: {sorted({*SETTINGS, 'likelihood_draws'})}"
        )
    settings = {**SETTINGS, **settings}
    if method == "none" or (
        method == "auto"
        and (not task.release_from_mechanism or not task.mechanism.has_log_prob)
        and task.exact_posterior is None
    ):
        why = (
            "reference.method=none"
            if method == "none"
            else "the observed data are not a release of the mechanism"
            if not task.release_from_mechanism
            else "the mechanism's likelihood is intractable"
        )
        return Reference(
            None, "none", False, f"no reference posterior ({why}): C2ST and MMD are not computed"
        )
    if method in ("auto", "closed_form") and task.exact_posterior is not None:
        return _closed_form(task, num_samples, seed)
    if method == "closed_form":
        raise ValueError(f"task {task.name!r} has no closed-form posterior; use reference.method=auto")
    if method in ("auto", "stored"):
        stored = _stored(task, num_samples)
        if stored is not None:
            return stored
        if method == "stored":
            raise ValueError(
                f"no stored reference in {stored_references.STORE} matches task {task.name!r} (model, epsilon and release)"
            )
    task.require_mechanism_release(f"reference.method={method}")
    exact_likelihood = getattr(task, "exact_log_likelihood", None) is not None
    if method == "likelihood" and not exact_likelihood:
        raise ValueError(
            f"task {task.name!r} has no exact likelihood (exact_log_likelihood); use reference.method=auto"
        )

    def compute() -> Reference:
        if method == "likelihood" or (method == "auto" and exact_likelihood):
            return _likelihood(task, num_samples, settings, seed)
        return _sampled(task, method, num_samples, settings, seed, progress)

    if not cache_dir:
        return compute()
    key = {
        "model": model_key(task),
        "y_obs": [round(v, 12) for v in task.y_obs.reshape(-1).tolist()],
        "method": method,
        "num_samples": num_samples,
        "seed": seed,
        **settings,
    }
    path = _cache_path(Path(cache_dir).expanduser(), task, task_config, key)
    return _cached(path, {**key, "task": task_config}, compute)
