"""Truncated-prior proposals (TSNPE, Deistler et al. 2022): the prior restricted to the highest-density region
of the current posterior at the observed release, sampled by rejection."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..seeds import seeded_global_streams
from ..tasks import Task
from .posterior import FlowPosterior
from .seeding import derive_seed

#: The most prior draws screened per batch.
BATCH = 100_000
#: The first batch, and the fewest a later batch screens.
FIRST_BATCH = 10_000
#: A later batch screens this many times the prior draws that the rate so far says the draws still missing need.
MARGIN = 1.2


def density_threshold(posterior: FlowPosterior, mass: float, draws: int, seed: int) -> Tensor:
    """The ``mass``-quantile of ``log q(theta | y_obs)`` over ``draws`` posterior draws (their densities from the
    pass that drew them): its super-level set holds ``1 - mass`` of the posterior (a 0-d tensor)."""
    _, log_q = posterior.sample_and_log_prob((draws,), seed=seed)
    return torch.quantile(log_q.double(), mass)


def truncated_prior_draws(
    task: Task, posterior: FlowPosterior, n: int, mass: float, draws: int, max_prior_draws: int, seed: int
) -> Tensor:
    """``n`` draws ``(n, dim_theta)`` of the prior restricted to the region where the posterior's density at
    ``task.y_obs`` is at least :func:`density_threshold`, screened from prior draws in batches sized by
    :func:`next_batch` (each seeded by its index; at most ``max_prior_draws`` in all). Raises ``RuntimeError`` when
    ``max_prior_draws`` prior draws do not give ``n`` (the region holds too little prior mass: use atomic
    proposals)."""
    threshold = density_threshold(posterior, mass, draws, derive_seed(seed, "threshold"))
    kept, found, screened = [], 0, 0
    while found < n:
        if screened >= max_prior_draws:
            raise RuntimeError(
                f"truncated prior: {found} of {n} draws in {screened} prior draws (the posterior's region holds about "
                f"{found / screened:.2e} of the prior mass); raise max_prior_draws or use atomic proposals (truncate=None)"
            )
        size = min(
            next_batch(n - found, found / screened) if kept else FIRST_BATCH, max_prior_draws - screened
        )
        with seeded_global_streams(derive_seed(seed, "truncated", len(kept))):
            theta = task.prior.sample((size,))
        inside = posterior.log_prob(theta).double() >= threshold  # on the flow's device
        kept.append(theta[inside.to(theta.device)])
        found, screened = found + kept[-1].shape[0], screened + size
    return torch.cat(kept)[:n]


def next_batch(missing: int, rate: float) -> int:
    """How many prior draws to screen next for ``missing`` draws at the share ``rate`` of prior draws kept so far:
    :data:`MARGIN` times ``missing / rate``, at least :data:`FIRST_BATCH`, at most :data:`BATCH` (also where
    none was kept yet)."""
    if rate == 0:
        return BATCH
    return min(BATCH, max(FIRST_BATCH, math.ceil(MARGIN * missing / rate)))
