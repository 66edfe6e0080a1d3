"""A trained posterior flow's draws at one release corrected by importance sampling: the flow (mixed with the
prior) as the proposal, each draw weighted by the prior over the proposal times the private likelihood of the
release, so that the weighted draws are consistent for the exact private posterior whatever the flow's error,
and the effective sample size says how far the flow was. The likelihood is the task's exact one where it carries
one (``task.exact_log_likelihood``, e.g. census tables), else the mechanism's density averaged over simulations
(an unbiased estimate, as in exact ABC's importance form, :func:`~dpsbi.baselines.exact_abc.abc_is`).

Where the flow sits a posterior sd or more off at a release, its weights collapse onto a few draws. So the draws
come in two stages (adaptive multiple importance sampling, Cornuet et al. 2012): the first from the flow's
proposal, the second from a Gaussian in the task's unconstrained space fitted to the first stage's weighted draws;
every draw of both is weighted against the mixture of the two proposals in their shares (the balance heuristic,
Veach & Guibas 1995; Owen & Zhou 2000), which keeps the weights bounded by the flow's defensive prior share and the
estimate consistent."""

from __future__ import annotations

import inspect
import math
import warnings

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..mechanisms.base import check_integer
from ..tasks.base import Task, prior_device
from ..tasks.identity import differences, identity
from .exact_abc import _at_epsilon, kish_ess, mechanism_log_weights, normalize, seeded
from .fitted_proposal import covariance_supported, fitted_proposal
from .result import BaselineResult

#: Simulations averaged per proposal by default: at regression's worst epsilon-10 release, 4 gave 2.7x the
#: effective sample size of 1 for 1.3x the CPU time (docs/RESULTS.md, "Correcting the flow at a release").
SIMULATIONS_PER_DRAW = 4
#: The share of draws from the adapted second stage by default (docs/RESULTS.md, "The adapted second stage").
ADAPT = 0.5
#: ``likelihood``: the task's exact one where it has it, or simulated.
LIKELIHOODS = ("auto", "exact", "simulated")
#: Draws whose likelihood is evaluated at once (simulated: divided by ``simulations_per_draw``).
BATCH = 100_000


def _target(trained: Task, task: Task | None) -> Task:
    """``task`` (default ``trained``), refused where its prior, mechanism or epsilon differ from ``trained``'s."""
    if task is None:
        return trained
    changed = differences(identity(trained), identity(task))
    if changed:
        raise ValueError(
            f"corrected: task {task.name!r} is another model than the posterior's: {'; '.join(changed)}"
        )
    return task


def corrected(
    posterior,
    num_draws: int,
    y: Tensor | None = None,
    epsilon: float | None = None,
    simulations_per_draw: int = SIMULATIONS_PER_DRAW,
    defensive: float = 0.1,
    adapt: float = ADAPT,
    likelihood: str = "auto",
    seed: int | None = None,
    progress: bool = True,
    task: Task | None = None,
) -> BaselineResult:
    """``num_draws`` weighted draws ``(num_draws, dim_theta)`` of the exact private posterior at release
    ``y (dim_y,)`` (default: the posterior's ``default_x``) and privacy level ``epsilon`` (default: the task's).

    The first ``(1 - adapt) * num_draws`` come from ``posterior.proposal(y, epsilon=epsilon,
    defensive=defensive)`` (the flow mixed with the prior at weight ``defensive``), the rest from a Gaussian in the
    task's unconstrained space (``task.transform``) fitted to their weighted draws; all are weighted against the
    two proposals' mixture (``adapt=0`` is plain importance sampling from the flow's proposal). The adaptation is
    skipped (the second stage drawn from the first's proposal, ``info["adapted"]`` False) where the first stage's
    effective sample size is below twice the unconstrained dimension, too few to fit a covariance.

    ``likelihood``: ``"exact"`` weights by ``task.exact_log_likelihood(theta, y, mechanism=)`` (no simulation);
    ``"simulated"`` by the mechanism's density averaged over ``simulations_per_draw`` simulations (unbiased, but
    noisy where the simulator's own spread at a fixed parameter is large against the noise); ``"auto"``: exact
    where the task has it. ``result.ess`` (Kish) is the check: far below ``num_draws``, the flow missed the
    posterior or the likelihood estimate is too noisy, and ``result.resample`` repeats draws (where the ESS is below
    the draws wanted, :func:`~dpsbi.baselines.smoothed_resample` gives them without repeats); ``result.info`` holds
    ``likelihood`` (which was used), ``ess_first`` (the first stage's own) and ``adapted``. ``posterior``: a
    posterior flow (``task``, ``proposal``, ``default_x``: SPPE's and NaiveNPE's); a likelihood posterior is
    refused in one line. ``task``: the model whose private posterior the draws target (default: the posterior's
    own), e.g. ``load("sir")`` for SIR's default amortized flow, which is trained on its tau-leaping model; its
    prior, mechanism and epsilon must be the posterior's (refused in one line, naming what differs)."""
    if not hasattr(posterior, "proposal"):
        raise ValueError(
            f"corrected needs a posterior flow (SPPE, NaiveNPE), not a {getattr(posterior, 'method', '?')} "
            "likelihood posterior"
        )
    task = _target(posterior.task, task)
    exact = exact_likelihood(task)
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"corrected: likelihood={likelihood!r} is not one of {LIKELIHOODS}")
    if likelihood == "exact" and exact is None:
        raise ValueError(
            f"corrected: task {task.name!r} has no exact_log_likelihood(theta, y, mechanism=); use "
            "likelihood='simulated'"
        )
    if not 0 <= adapt < 1:
        raise ValueError(
            f"corrected: adapt must be in [0, 1): the second stage's share of draws, got {adapt}"
        )
    num_draws = check_integer("corrected: num_draws", num_draws, minimum=2)
    simulations_per_draw = check_integer("corrected: simulations_per_draw", simulations_per_draw)
    y = posterior.default_x if y is None else y
    first = posterior.proposal(y, epsilon=epsilon, defensive=defensive)
    mechanism = task.mechanism if epsilon is None else _at_epsilon(task, epsilon, "corrected")
    simulated = likelihood == "simulated" or exact is None
    repeats = int(simulations_per_draw) if simulated else 0
    y = torch.as_tensor(y).reshape(1, -1)
    n_second = round(adapt * int(num_draws))
    n_first = int(num_draws) - n_second
    simulations = 0
    with seeded(seed), tqdm(total=int(num_draws), desc="corrected", disable=not progress) as bar:

        def log_target(theta: Tensor) -> Tensor:
            """``log prior + log likelihood`` of ``theta (n, dim_theta)`` as float64 ``(n,)``, batch by batch."""
            nonlocal simulations
            parts = []
            for chunk in theta.split(max(BATCH // max(repeats, 1), 1)):
                lp = task.log_prior(chunk).double()
                inside = torch.isfinite(lp)
                if simulated:
                    simulations += int(inside.sum()) * repeats
                    lp = mechanism_log_weights(
                        task, chunk, lp, y.to(chunk), mechanism=mechanism, repeats=repeats
                    ).double()
                else:
                    lp[inside] += exact(chunk[inside], y, mechanism=mechanism).double()
                parts.append(lp)
                bar.update(chunk.shape[0])
            return torch.cat(parts)

        theta, log_q = first.sample_and_log_prob((n_first,))  # a flow on the GPU draws there
        theta = theta.to(prior_device(task.prior))
        log_p, log_q = log_target(theta), log_q.to(theta.device, torch.float64)
        first_weights = normalize(log_p - log_q, "corrected")
        ess_first = kish_ess(first_weights)
        second = (
            fitted_proposal(task, theta.double(), first_weights, ((1.0,), (1.0,)))
            if covariance_supported(ess_first, task.dim_unconstrained)
            else None
        )
        if n_second:
            extra = (first if second is None else second).sample((n_second,)).to(theta)
            theta, log_p = torch.cat([theta, extra]), torch.cat([log_p, log_target(extra)])
            log_q = torch.cat([log_q, first.log_prob(extra).to(theta.device, torch.float64)])
            if second is not None:  # the balance heuristic: every draw against both proposals in their shares
                share = n_first / int(num_draws)
                log_q = torch.logaddexp(
                    math.log(share) + log_q, math.log1p(-share) + second.log_prob(theta.double())
                )
    log_w = log_p - log_q
    log_w = torch.where(log_w.isnan(), -math.inf, log_w)
    weights = normalize(log_w, "corrected").to(theta.dtype)  # computed in float64
    ess = kish_ess(weights)
    if not covariance_supported(ess, task.dim_unconstrained):
        warnings.warn(
            f"corrected: the importance weights collapsed (effective sample size {ess:.1f} of {int(num_draws)} "
            "draws): resampling repeats a few draws; the flow is far from the posterior at this release, or the "
            "simulated likelihood too noisy (raise num_draws or simulations_per_draw)",
            stacklevel=2,
        )
    info = {
        "ess": ess,
        "ess_first": ess_first,
        "adapted": bool(n_second and second is not None),
        "log_evidence": float(torch.logsumexp(log_w, 0)) - math.log(log_w.numel()),
        "likelihood": "simulated" if simulated else "exact",
    }
    return BaselineResult(theta, simulations, weights=weights, info=info)


def exact_likelihood(task):
    """The task's ``exact_log_likelihood`` where it takes ``(theta, y, mechanism=)`` (any release, any privacy
    level of the mechanism: census tables'), else ``None`` (absent, or only at the task's own release)."""
    function = getattr(task, "exact_log_likelihood", None)
    if function is None:
        return None
    parameters = inspect.signature(function).parameters
    return function if {"y", "mechanism"} <= parameters.keys() else None
