"""MCMC on an unnormalized log density: many chains moving in lockstep in torch, seeded and device-agnostic.

The default sampler, ``method="elliptical_slice"``, is a population-adapted *generalized elliptical slice
sampler* (Nishihara, Murray & Adams 2014): a multivariate t approximation ``T(x; mu, Sigma, nu)`` of the
target is fitted to the chains' states during warm-up (then frozen), and each update of a chain

1. draws the t's latent scale ``s | x ~ InvGamma((nu + d) / 2, (nu + |x - mu|^2_Sigma) / 2)``;
2. makes an elliptical slice sampling step (Murray, Adams & MacKay 2010) on the ellipse through ``x`` and
   ``mu + sqrt(s) L v`` (``v ~ N(0, I)``, ``L L' = Sigma``), with the "likelihood" ``target / T``.

Both steps leave the target invariant, whatever the fit; a good fit makes consecutive draws nearly
independent (an exact one makes the first proposal on the ellipse always accepted). The shrinkage of the
angle bracket is evaluated in batches: a round evaluates ``k`` angles drawn uniformly in each still-active
chain's bracket in one call of the log density, then walks through them in order, skipping those that a
previous rejection cut out of the bracket; this is exactly the sequential shrinkage procedure (a uniform
draw in a bracket that falls in the shrunk bracket is uniform there), so ``k`` only trades wasted
evaluations against sequential calls. Later rounds evaluate only the chains still shrinking, with more
angles each (about :func:`rows_per_round` rows a call), so an update takes 2-4 calls.

``method="slice_np_vectorized"`` is sbi's numpy vectorized slice sampler (per-coordinate stepping-out and
shrinkage, about 13 sequential calls per step): the sampler of posterior files written before the torch
sampler became the default, kept so that they sample as they did.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from ..diagnostics import ess, rhat
from ..mechanisms.base import check_integer
from .settings import Settings

METHODS = ("elliptical_slice", "slice_np_vectorized")
#: Degrees of freedom of the t approximation (an integer: the latent scale is drawn as a chi-square).
DOF = 5
#: Rows a shrinkage round aims at on a CPU (:func:`rows_per_round`): when few chains are still shrinking, each
#: evaluates several angles, since a flow call costs about as much as a few hundred rows there.
MIN_ROWS = 256
#: Most angles a chain evaluates in one round.
MAX_ANGLES = 64
#: Most shrinkage rounds of one update; a chain still shrinking after them (never seen: the bracket halves
#: about every rejection) stays where it is.
MAX_ROUNDS = 60


@dataclass(frozen=True)
class MCMCSettings(Settings):
    """MCMC settings: ``num_chains`` chains started by resampling ``init_candidates`` prior draws in proportion
    to the target density (sbi's "resample" strategy); ``warmup`` steps per chain are discarded, then every
    ``thin``-th step is kept, ``ceil(num_samples / num_chains)`` per chain.

    ``method="elliptical_slice"`` (default): the torch sampler of this module; its t approximation is
    refitted to the chains' states at every warm-up step. The defaults draw 2000 samples in 52 steps of 500
    chains (about 165 sequential calls of the density): chains are cheap, since a flow call costs about as
    much as a few hundred rows; 40 warm-up steps let a resampled start settle (a banana's tails take that
    long); ``thin=3`` because an update whose first proposal is rejected moves little, and such close pairs
    of draws of one chain would lift C2ST accuracies (by ~0.01-0.03 at ``thin=1`` on 2000 draws).
    ``method="slice_np_vectorized"``: sbi's numpy slice sampler (about 13 calls a step), whose ``warmup``
    steps come after sbi's own 50 steps of bracket tuning; the old default, with 100 chains, ``thin=2``
    and ``warmup=50``, made about 2600 calls for 2000 draws.
    """

    label: ClassVar[str] = "mcmc"
    method: str = "elliptical_slice"
    num_chains: int = 500
    thin: int = 3
    warmup: int = 40
    init_candidates: int = 1000

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown MCMC method {self.method!r}; available: {list(METHODS)}")
        for name in ("num_chains", "thin", "init_candidates"):  # a count that is not whole is no count
            check_integer(f"mcmc {name}", getattr(self, name))
        check_integer("mcmc warmup", self.warmup, minimum=0)


def resample_init(
    candidates: Tensor, log_density: Tensor, num_chains: int, generator: torch.Generator | None
) -> Tensor:
    """``num_chains`` rows of ``candidates (K, d)`` drawn with probabilities ``softmax(log_density)``:
    ``(num_chains, d)`` for ``log_density (K,)``, ``(G, num_chains, d)`` for one density per group, ``(G, K)``."""
    finite = torch.where(torch.isfinite(log_density), log_density, -math.inf)
    hopeless = ~torch.isfinite(finite).any(-1)
    if hopeless.any():  # once per run
        which = "" if finite.ndim == 1 else f" of group {int(hopeless.nonzero()[0])}"
        raise RuntimeError(f"the target density{which} is zero or not finite at every initial candidate")
    probs = torch.softmax(finite.double(), -1).to(candidates.device)
    return candidates[torch.multinomial(probs, num_chains, replacement=True, generator=generator)]


def slice_sample(
    log_density: Callable[[Tensor], Tensor],
    init: Tensor,
    num_samples: int,
    config: MCMCSettings,
    seed: int,
    width: Tensor | float = 1.0,
    progress: bool = False,
    info: dict | None = None,
) -> Tensor:
    """``(num_samples, d)`` draws from the unnormalized ``log_density`` (``(C, d) -> (C,)`` torch function,
    called without gradients on batches of any size) by ``config.method`` on the ``C`` chains started at
    ``init (C, d)``; draws of the chains are interleaved (row ``i`` belongs to chain ``i % C``). ``width``
    (scalar or ``(d,)``, the prior's spread, wider than the posterior) sets the initial bracket of
    ``slice_np_vectorized`` and a floor on the torch sampler's fitted covariance. ``seed`` alone fixes the
    draws (torch's and numpy's global streams are neither used nor touched); the torch sampler runs on
    ``init``'s device.

    ``info``, if a dict, receives diagnostics: ``calls`` (sequential calls of ``log_density``, the
    initial one included), ``evaluations`` (rows evaluated), ``draws`` (the kept draws ``(S, C, d)``,
    ``S = ceil(num_samples / C)``), ``ess`` and ``rhat`` (per coordinate: ArviZ's bulk effective sample size
    and rank-normalized split R-hat of the ``C`` chains, :func:`dpsbi.diagnostics.ess` and
    :func:`dpsbi.diagnostics.rhat`; NaN for chains too short to tell: ``S < 10`` for the ESS, ``S < 4`` for
    R-hat); the torch sampler adds ``evaluations_per_update``, ``first_accept`` (the fraction of kept-phase
    updates accepted at their first proposal, its acceptance rate in Metropolis terms) and ``host_reads``
    (values the sampler read back from ``init``'s device: one per shrinkage round, plus the final count).
    """
    if init.ndim != 2 or init.shape[0] < 1:
        raise ValueError(f"init must have shape (num_chains, d), got {tuple(init.shape)}")
    dim = init.shape[1]

    def grouped(x: Tensor, group: Tensor) -> Tensor:
        return log_density(x.reshape(-1, dim)).reshape(x.shape[:-1])

    draws = slice_sample_groups(grouped, init[None], num_samples, config, seed, width, progress, info)
    if info is not None and num_samples > 0:
        info.update(draws=info["draws"][:, 0], ess=info["ess"][0], rhat=info["rhat"][0])
    return draws[:, 0]


def slice_sample_groups(
    log_density: Callable[[Tensor, Tensor], Tensor],
    init: Tensor,
    num_samples: int,
    config: MCMCSettings,
    seed: int,
    width: Tensor | float = 1.0,
    progress: bool = False,
    info: dict | None = None,
) -> Tensor:
    """``(num_samples, G, d)`` draws from ``G`` unnormalized densities at once, group ``g`` by the ``C`` chains
    started at ``init[g]`` (``init (G, C, d)``): ``log_density(x (n, k, d), group (n,))`` is ``(n, k)``, row
    ``i``'s points under group ``group[i]``'s density (e.g. one posterior per release, all releases' chains
    evaluated in one call). The torch sampler updates every group's chains in lockstep (a t approximation per
    group), so a call's size grows with ``G`` and the number of sequential calls does not; sbi's numpy
    sampler (``slice_np_vectorized``) runs one group only. Otherwise as :func:`slice_sample` (``info["draws"]``
    is ``(S, G, C, d)``, ``ess`` and ``rhat`` are ``(G, d)``)."""
    if init.ndim != 3 or init.shape[1] < 1:
        raise ValueError(f"init must have shape (groups, num_chains, d), got {tuple(init.shape)}")
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    groups, chains, dim = init.shape
    if num_samples == 0:
        return init.new_zeros(0, groups, dim)
    if config.method == "elliptical_slice":
        draws, details = _elliptical_slice(log_density, init, num_samples, config, seed, width, progress)
    elif groups == 1:
        draws, details = _slice_numpy(log_density, init[0], num_samples, config, seed, width, progress)
    else:
        raise ValueError(f"the {config.method} sampler runs one group at a time, got {groups}")
    if info is not None:
        info.clear()
        by_chain = draws.permute(1, 2, 0, 3)  # (G, C, S, d): ArviZ's layout per group
        info.update(
            method=config.method,
            num_chains=chains,
            draws=draws,
            ess=torch.stack([ess(g) for g in by_chain]),
            rhat=torch.stack([rhat(g) for g in by_chain]),
            **details,
        )
    return draws.transpose(1, 2).reshape(-1, groups, dim)[:num_samples]  # row i: step i // C, chain i % C


# ---- the torch sampler ----------------------------------------------------------------------------------


def _elliptical_slice(log_density, init, num_samples, config, seed, width, progress):
    groups, chains, dim = init.shape
    dtype, device = init.dtype, init.device
    generator = torch.Generator(device=device).manual_seed(int(seed) % 2**63)
    per_chain = math.ceil(num_samples / chains)
    warmup, thin = int(config.warmup), int(config.thin)
    steps = warmup + per_chain * thin
    spread = torch.as_tensor(width, dtype=dtype, device=device).expand(dim) ** 2
    floor = 1e-6 * spread
    counter = _Counter(log_density)
    rows = rows_per_round(device, groups * chains)

    x = init.clone()
    with torch.no_grad():
        logp = counter(x, torch.arange(groups, device=device))  # (G, C): group g's C chains in one row
    history = [x]  # warm-up states the fit is drawn from: the later half, once it holds 10 (d + 1) states
    # The first fit is widened by the prior's spread: the chains may start at a few distinct points (a
    # resampled init of a narrow posterior), whose covariance would keep them together.
    fit = _TFit.of(x, floor + spread)
    kept, first, updates = (
        [],
        torch.zeros((), dtype=torch.long, device=device),
        0,
    )  # first: read once, at the end
    for step in _steps(steps, progress):
        window = history[len(history) // 2 :]
        if 0 < step < warmup and len(window) * chains >= 10 * (dim + 1):
            fit = _TFit.of(torch.cat(window, 1), floor)
        with torch.no_grad():
            x, logp, accepted_first = _gess_update(counter, x, logp, fit, generator, rows)
        if step < warmup:
            history.append(x)
        else:
            first = first + accepted_first.sum()
            updates += groups * chains
            if (step - warmup + 1) % thin == 0:
                kept.append(x)
    draws = torch.stack(kept) if kept else init.new_zeros(0, groups, chains, dim)
    details = dict(
        calls=counter.calls,
        evaluations=counter.rows,
        evaluations_per_update=(counter.rows - groups * chains) / max(groups * chains * steps, 1),
        first_accept=int(first) / updates if updates else math.nan,
        host_reads=counter.reads + 1,
    )
    return draws, details


class _Counter:
    """``log_density`` with NaN read as ``-inf``, counting calls, rows and the shrinkage's host reads."""

    def __init__(self, log_density: Callable[[Tensor, Tensor], Tensor]) -> None:
        self.log_density, self.calls, self.rows, self.reads = log_density, 0, 0, 0

    def __call__(self, x: Tensor, group: Tensor) -> Tensor:
        self.calls += 1
        self.rows += x.shape[0] * x.shape[1]
        value = self.log_density(x, group)
        if value.shape != x.shape[:-1]:
            raise ValueError(
                f"log_density must map (n, k, d) to (n, k), got {tuple(value.shape)} for {tuple(x.shape)}"
            )
        return torch.where(torch.isnan(value), -math.inf, value)


@dataclass
class _TFit:
    """Per group ``g``, a multivariate t ``T(mu_g, L_g L_g', DOF)`` with the mean and covariance of the group's
    states (the covariance plus 0.1% of its diagonal and a floor, so that a population of few distinct points
    still spans R^d): ``mu (G, d)``, ``chol (G, d, d)``."""

    mu: Tensor
    chol: Tensor

    @classmethod
    def of(cls, states: Tensor, floor: Tensor) -> _TFit:
        """The fit to ``states (G, n, d)``."""
        mu = states.mean(1)
        centred = states - mu[:, None]
        cov = centred.mT @ centred / max(states.shape[1] - 1, 1)
        cov = cov + torch.diag_embed(1e-3 * cov.diagonal(dim1=-2, dim2=-1) + floor)
        chol, error = torch.linalg.cholesky_ex(cov.double())
        # not positive definite in float round-off: keep the diagonal (chosen on the device, no host read)
        diagonal = torch.diag_embed(cov.diagonal(dim1=-2, dim2=-1).double().sqrt())
        chol = torch.where((error == 0)[:, None, None], chol, diagonal)
        return cls(mu, chol.to(states.dtype))

    def whiten(self, x: Tensor) -> Tensor:
        """``L_g^-1 (x - mu_g)`` for each group's rows ``x (G, C, d)``."""
        return torch.linalg.solve_triangular(self.chol, (x - self.mu[:, None]).mT, upper=False).mT

    def colour(self, w: Tensor, group: Tensor) -> Tensor:
        """``mu_g + L_g w`` for whitened points ``w (n, k, d)`` of the groups ``group (n,)``."""
        return self.mu[group, None] + w @ self.chol[group].mT


def _log_t(q: Tensor, dim: int) -> Tensor:
    """Log density of the t approximation up to a constant, at squared whitened radius ``q``."""
    return -0.5 * (DOF + dim) * torch.log1p(q / DOF)


def rows_per_round(device: torch.device, chains: int) -> int:
    """Rows a shrinkage round of ``chains`` chains (every group's) aims at on ``device``: :data:`MIN_ROWS` on a CPU,
    where a call's cost grows with its rows beyond a few hundred; elsewhere (a GPU) the first round's, one row a
    chain, since a call of up to ~10^5 rows costs about as much as a small one and each round ends in a host
    read: the chains still shrinking share as many rows again."""
    return MIN_ROWS if device.type == "cpu" else max(MIN_ROWS, chains)


def _gess_update(
    counter: _Counter, x: Tensor, logp: Tensor, fit: _TFit, generator: torch.Generator, rows: int
):
    """One generalized elliptical slice update of every chain of every group: new states ``(G, C, d)``, their
    log densities ``(G, C)``, and which chains accepted their first proposal ``(G, C)``; a later round gives each
    of the ``n`` chains still shrinking ``rows / n`` angles (at most :data:`MAX_ANGLES`). The chains still
    shrinking are compacted after each round, by one read of how many they are (no boolean-mask indexing)."""
    groups, chains, dim = x.shape
    shape, flat = x.shape, groups * chains
    dtype, device = x.dtype, x.device

    def uniform(*size):
        return torch.rand(*size, generator=generator, dtype=dtype, device=device)

    def normal(*size):
        return torch.randn(*size, generator=generator, dtype=dtype, device=device)

    a = fit.whiten(x).reshape(flat, dim)  # current points, whitened and centred
    group = torch.arange(groups, device=device).repeat_interleave(chains)
    q = (a * a).sum(-1)
    scale = ((DOF + q) / normal(flat, DOF + dim).square().sum(-1)).sqrt()  # sqrt(s), s ~ InvGamma
    b = scale[:, None] * normal(flat, dim)  # the auxiliary points, whitened and centred
    level = logp.reshape(flat) - _log_t(q, dim) + torch.log(uniform(flat))  # slice under target / T
    angle = 2 * math.pi * uniform(flat)
    lo, hi = angle - 2 * math.pi, angle.clone()

    new_x, new_logp = x.reshape(flat, dim).clone(), logp.reshape(flat).clone()
    active, n = torch.arange(flat, device=device), flat
    accepted_first = torch.zeros(flat, dtype=torch.bool, device=device)  # set by the first round
    for round_index in range(MAX_ROUNDS):
        if n == 0:
            break
        k = min(MAX_ANGLES, max(1, -(-rows // n)))
        lo_a, hi_a, group_a = lo[active], hi[active], group[active]
        angles = lo_a[:, None] + (hi_a - lo_a)[:, None] * uniform(n, k)
        if round_index == 0:
            angles[:, 0] = angle  # the first proposal: the bracket's end (the same point as its start)
        w = a[active, None, :] * angles.cos()[..., None] + b[active, None, :] * angles.sin()[..., None]
        proposals = fit.colour(w, group_a)  # (n, k, d)
        logp_prop = counter(proposals, group_a)
        ratio = logp_prop - _log_t(w.square().sum(-1), dim)
        level_a = level[active]
        done = torch.zeros(n, dtype=torch.bool, device=device)
        choice = torch.zeros(n, dtype=torch.long, device=device)
        for j in range(k):  # the sequential shrinkage, through the evaluated angles in order
            t = angles[:, j]
            inside = ~done & (t >= lo_a) & (t <= hi_a)
            ok = inside & (ratio[:, j] > level_a)
            rejected = inside & ~ok
            lo_a = torch.where(rejected & (t < 0), t, lo_a)
            hi_a = torch.where(rejected & (t >= 0), t, hi_a)
            choice = torch.where(ok, j, choice)
            done |= ok
        if round_index == 0:
            accepted_first = done & (choice == 0)
        lo[active], hi[active] = lo_a, hi_a
        chosen = proposals.gather(1, choice[:, None, None].expand(n, 1, dim))[:, 0]
        new_x[active] = torch.where(done[:, None], chosen, new_x[active])
        new_logp[active] = torch.where(done, logp_prop.gather(1, choice[:, None])[:, 0], new_logp[active])
        n = int((~done).sum())  # the round's one host read
        counter.reads += 1
        active = active[
            torch.argsort(done.to(torch.uint8), stable=True)[:n]
        ]  # those still shrinking, in order
    return new_x.reshape(shape), new_logp.reshape(shape[:2]), accepted_first.reshape(shape[:2])


def _steps(steps: int, progress: bool):
    if not progress:
        return range(steps)
    from tqdm.auto import tqdm

    return tqdm(range(steps), desc="elliptical slice sampling", leave=False)


# ---- sbi's numpy sampler --------------------------------------------------------------------------------


def _slice_numpy(log_density, init, num_samples, config, seed, width, progress):
    """sbi's sampler on the one group of a grouped ``log_density``: draws ``(S, 1, C, d)`` and details."""
    from sbi.samplers.mcmc.slice_numpy import SliceSamplerVectorized

    dtype, device = init.dtype, init.device
    counter = _Counter(log_density)

    def numpy_log_density(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            points = torch.as_tensor(x, dtype=dtype).to(device)[:, None]
            values = counter(points, torch.zeros(len(points), dtype=torch.long, device=device))[:, 0]
        return values.double().cpu().numpy()

    chains, dim = init.shape
    per_chain = math.ceil(num_samples / chains)
    sampler = SliceSamplerVectorized(
        log_prob_fn=numpy_log_density,
        init_params=init.double().cpu().numpy(),
        num_chains=chains,
        thin=1,
        verbose=progress,
        init_width=torch.as_tensor(width, dtype=torch.float64).expand(dim).cpu().numpy(),
    )
    sampler.rng = np.random.RandomState(seed % 2**32)
    draws = sampler.run(config.warmup + per_chain * config.thin)  # (C, steps, d)
    kept = torch.as_tensor(draws[:, config.warmup :: config.thin][:, :per_chain], dtype=dtype)
    return kept.transpose(0, 1)[:, None].to(device), dict(calls=counter.calls, evaluations=counter.rows)
