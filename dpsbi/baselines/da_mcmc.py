"""Data-augmentation MCMC for private releases (Ju, Awan, Gong & Rao 2022).

The state is ``(theta, x_1..x_n)``: the confidential records are latent. Each iteration
(1) sweeps over the records: record ``i`` is replaced by a fresh draw ``x_i* ~ f(x | theta)`` with probability
``min(1, eta(y | s - t(x_i) + t(x_i*)) / eta(y | s))`` (the record likelihood cancels with the proposal), one
record after the other since each acceptance moves ``s``; then (2) draws ``theta`` from the complete-data
posterior ``p(theta | x)``. Independent chains run side by side as a batch dimension.
"""

from __future__ import annotations

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..diagnostics import chain_diagnostics
from ..mechanisms import Mechanism
from ..seeds import check_seed
from ..tasks import Task
from .exact_abc import target_release
from .records import RecordModel, record_model
from .result import BaselineResult


def da_mcmc(
    task: Task,
    num_iterations: int,
    num_chains: int = 4,
    burn_in: int | None = None,
    thin: int = 1,
    y: Tensor | None = None,
    records: RecordModel | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    progress: bool = True,
) -> BaselineResult:
    """Draws from the private posterior ``p(theta | y)`` of a task with a record-level model.

    Runs ``num_chains`` chains for ``num_iterations`` Gibbs iterations (a record sweep, then ``theta``),
    drops the first ``burn_in`` (default: a quarter) and keeps every ``thin``-th. ``y`` defaults to
    ``task.y_obs``; ``records`` to :func:`record_model` ``(task)`` (``regression``, ``naive_bayes``).
    Returns the kept draws ``(num_chains * kept, dim_theta)``, chain after chain; ``num_simulations``
    counts proposed data sets of ``n`` records (one per chain and iteration). ``info`` holds
    ``chains (num_chains, kept, dim_theta)``, the record ``acceptance_rate`` (and ``acceptance_trace``,
    per iteration) and the chains' diagnostics per parameter (:func:`dpsbi.diagnostics.chain_diagnostics`:
    ArviZ's bulk ``ess`` and ``ess_tail``, rank-normalized split ``rhat``, and the implied ``iat``).
    Randomness comes from ``generator``, or else a fresh one seeded with ``seed``, or else torch's global RNG.

    Each sweep is ``n`` sequential steps of small tensor operations, so its cost hardly grows with
    ``num_chains``: prefer many chains to long ones (on a busy CPU, ``torch.set_num_threads(1)`` is faster).
    """
    task.require_mechanism_release("da_mcmc")
    y = target_release(task, y, "da_mcmc")
    burn_in = num_iterations // 4 if burn_in is None else burn_in
    if num_chains < 1 or thin < 1 or not 0 <= burn_in < num_iterations:
        raise ValueError(
            f"need num_chains >= 1, thin >= 1 and 0 <= burn_in < num_iterations, got num_chains={num_chains}, "
            f"thin={thin}, burn_in={burn_in}, num_iterations={num_iterations}"
        )
    model = record_model(task) if records is None else records
    if generator is None:
        generator = torch.Generator(y.device).manual_seed(check_seed(seed)) if seed is not None else None

    theta = model.prior_sample(task.prior.mean.expand(num_chains, -1).to(y), generator)
    state = model.sample(theta, generator)
    shares = model.contribution(state)
    draws, acceptance = [], []
    for _ in tqdm(range(num_iterations), desc="DA-MCMC", disable=not progress):
        proposal = model.sample(theta, generator)
        new_shares = model.contribution(proposal)
        accepted = record_sweep(task.mechanism, y, shares, new_shares, generator)  # (C, n)
        state = torch.where(accepted[..., None], proposal, state)
        shares = torch.where(accepted[..., None], new_shares, shares)
        theta = model.posterior_sample(state, generator)
        draws.append(theta)
        acceptance.append(accepted.float().mean())
    chains = torch.stack(draws, 1)[:, burn_in::thin]  # (C, kept, d)
    trace = torch.stack(acceptance)
    return BaselineResult(
        samples=chains.reshape(-1, chains.shape[-1]),
        num_simulations=num_chains * num_iterations,
        info=dict(
            chains=chains,
            acceptance_rate=float(trace.mean()),
            acceptance_trace=trace,
            **chain_diagnostics(chains),
            num_chains=num_chains,
            burn_in=burn_in,
            thin=thin,
        ),
    )


def record_sweep(
    mechanism: Mechanism,
    y: Tensor,
    shares: Tensor,
    new_shares: Tensor,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One Metropolis sweep over the records of ``C`` chains: record ``i`` (in order) moves from its share
    ``shares[:, i]`` of the statistic to ``new_shares[:, i]`` (both ``(C, n, dim_s)``) with probability
    ``min(1, eta(y | s') / eta(y | s))``. Returns the acceptances ``(C, n)`` (bool)."""
    s = shares.sum(1)
    log_eta = mechanism.log_prob(y, s)
    step = new_shares - shares
    log_u = torch.rand(shares.shape[:2], generator=generator, device=shares.device, dtype=shares.dtype).log()
    accepted = []
    for i in range(shares.shape[1]):
        s_new = s + step[:, i]
        log_eta_new = mechanism.log_prob(y, s_new)
        ok = log_u[:, i] < log_eta_new - log_eta
        s = torch.where(ok[:, None], s_new, s)
        log_eta = torch.where(ok, log_eta_new, log_eta)
        accepted.append(ok)
    return torch.stack(accepted, 1)
