"""Fisher information of a noisy release and statistic selection (Alparslan & Yildirim, Sec. 3).

``F(theta) = E[gamma gamma^T]`` with the score ``gamma(theta; y) = d/dtheta log p(y | theta)``. By Fisher's
identity the score is a posterior expectation over the latent data, ``gamma = E[d/dtheta log f(latent | theta)
| y, theta]``, estimated by self-normalized importance sampling with the latent drawn from its model at theta
(weights ``eta(y | latent)``):

- :func:`clt_fisher_information`: closed form for an additive statistic under Gaussian noise (Sec. 3.1);
- :func:`fisher_summary_is` (Alg. 1): latent = the summary, with a tractable law (CLT or exact);
- :func:`fisher_records_is` (Alg. 2): latent = the ``n`` records (non-additive statistics, smooth sensitivity);
- :func:`fisher_sequential_is` (Alg. 3): one record per release (local DP), times ``n``;
- :func:`fisher_information` picks one of them for a task (Table 1) and :func:`rank_statistics` ranks
  candidate statistics at a given epsilon.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from ..mechanisms import Mechanism
from ..mechanisms.base import check_integer
from ..tasks import Task
from ..tasks.latent import (
    GaussianCLT,
    ReparameterizedRecords,
    SummaryModel,
    record_log_prob,
    record_model_of,
    summary_model_of,
)
from .mcmc_clt import clt_release_moments, is_clt, require_clt

METHODS = ("clt", "summary", "records", "sequential")
#: Records summarized at once by :func:`fisher_records_is`.
_CHUNK = 1 << 20


@dataclass
class FisherEstimate:
    """Fisher information ``(d, d)`` at one theta, its Monte Carlo standard error (zeros when exact) and the
    method that produced it."""

    information: Tensor
    stderr: Tensor
    method: str

    @property
    def trace(self) -> float:
        """``tr F``: the scalar used to rank statistics."""
        return float(self.information.diagonal().sum())


def gaussian_fisher_information(theta: Tensor, mean_cov: Callable[[Tensor], tuple[Tensor, Tensor]]) -> Tensor:
    """Fisher information ``(d, d)`` at ``theta (d,)`` of ``Y ~ N(m(theta), C(theta))``:
    ``F_ij = d_i m^T C^{-1} d_j m + tr(C^{-1} d_i C C^{-1} d_j C) / 2`` (derivatives by autograd)."""
    theta = theta.detach()
    mean, cov = mean_cov(theta)
    d_mean, d_cov = torch.autograd.functional.jacobian(mean_cov, theta)  # (k, d), (k, k, d)
    solve_mean = torch.linalg.solve(cov, d_mean)
    solve_cov = torch.linalg.solve(cov, d_cov.movedim(-1, 0))  # (d, k, k): C^{-1} d_i C
    trace = torch.einsum("iab,jba->ij", solve_cov, solve_cov)
    return d_mean.mT @ solve_mean + trace / 2


def clt_fisher_information(model: GaussianCLT, mechanism: Mechanism, theta: Tensor) -> FisherEstimate:
    """Sec. 3.1: Fisher information of the release ``N(mu(theta), Sigma(theta) / n + sigma^2 I)`` (CLT
    approximation of an additive statistic plus Gaussian noise), exact for that model."""
    require_clt(model, mechanism)
    info = gaussian_fisher_information(theta.reshape(-1), lambda t: clt_release_moments(model, mechanism, t))
    return FisherEstimate(info, torch.zeros_like(info), "clt")


def _fisher_identity(
    theta: Tensor,
    log_density: Callable[[Tensor], Tensor],
    log_w: Tensor,
    scale: float,
    debias: bool,
    method: str,
) -> FisherEstimate:
    """``scale * mean_i gamma_i gamma_i^T`` with the self-normalized score ``gamma_i = sum_j W_ij s_ij``,
    ``s_ij = d/dtheta log f(latent_ij | theta)``. ``log_density(theta (N, M, d)) -> (N, M)`` holds the latent draws
    fixed (each draw gets its own copy of theta, so one backward pass gives every ``s_ij``); ``log_w (N, M)`` are
    the log weights ``log eta(y_i | latent_ij)``. ``debias`` subtracts each score's importance-sampling variance
    ``sum_j W_ij^2 (s_ij - gamma_i)(s_ij - gamma_i)^T`` (delta method), which removes the O(1/M) excess of
    ``gamma gamma^T``; without it this is the paper's estimator."""
    theta_rep = theta.detach().reshape(1, 1, -1).expand(*log_w.shape, -1).clone().requires_grad_(True)
    weights = torch.softmax(log_w.detach(), -1)[..., None]  # (N, M, 1)
    with torch.enable_grad():
        (scores,) = torch.autograd.grad(log_density(theta_rep).sum(), theta_rep)  # (N, M, d)
    gamma = (weights * scores).sum(1)
    terms = gamma[:, :, None] * gamma[:, None, :]
    if debias:
        spread = weights * (scores - gamma[:, None])
        terms = terms - torch.einsum("nmi,nmj->nij", spread, spread)
    return FisherEstimate(scale * terms.mean(0), scale * terms.std(0) / math.sqrt(terms.shape[0]), method)


def _check_counts(num_releases: int, num_inner: int) -> None:
    check_integer("num_releases", num_releases, minimum=2)
    check_integer("num_inner", num_inner)


def fisher_summary_is(
    model: SummaryModel,
    mechanism: Mechanism,
    theta: Tensor,
    num_releases: int = 256,
    num_inner: int = 256,
    debias: bool = True,
    generator: torch.Generator | None = None,
) -> FisherEstimate:
    """Alg. 1: ``N = num_releases`` releases ``y_i = mechanism(u_i)``, ``u_i ~ f(. | theta)``; each score from
    ``M = num_inner`` summaries ``u_ij ~ f(. | theta)`` weighted by ``eta(y_i | u_ij)``. With the CLT model
    (:class:`~dpsbi.tasks.latent.GaussianCLT`) this is the information of the CLT-approximate release model."""
    _check_counts(num_releases, num_inner)
    theta = theta.detach().reshape(1, -1)
    y = mechanism.sample(
        model.sample(theta.expand(num_releases, -1).contiguous(), generator), generator=generator
    )
    u = model.sample(theta.expand(num_releases, num_inner, -1).contiguous(), generator).detach()
    log_w = mechanism.log_prob(y[:, None], u)
    return _fisher_identity(theta, lambda t: model.log_prob(u, t), log_w, 1.0, debias, "summary")


def fisher_records_is(
    records: ReparameterizedRecords,
    mechanism: Mechanism,
    theta: Tensor,
    num_releases: int = 256,
    num_inner: int = 256,
    debias: bool = True,
    generator: torch.Generator | None = None,
) -> FisherEstimate:
    """Alg. 2: releases of ``n``-record data sets; each score from ``num_inner`` fresh data sets weighted by
    ``eta(y_i | S(x_ij))``, with the record scores ``sum_t d/dtheta log p(x_ijt | theta)``. The records take
    ``num_releases * num_inner * n`` numbers; their summaries are computed in chunks."""
    _check_counts(num_releases, num_inner)
    theta = theta.detach().reshape(1, -1)
    y = mechanism.sample(records.simulate(theta.expand(num_releases, -1), generator), generator=generator)
    x = records.records(
        records.latent((num_releases, num_inner, records.n), theta, generator), theta
    ).detach()
    rows = max(
        1, _CHUNK // (num_inner * records.n)
    )  # releases per chunk: bounds the summaries' scratch memory
    log_w = torch.cat(
        [
            mechanism.log_prob(y_c[:, None], records.summary(x_c))
            for y_c, x_c in zip(y.split(rows), x.split(rows))
        ]
    )
    return _fisher_identity(theta, lambda t: records.log_prob(x, t).sum(-1), log_w, 1.0, debias, "records")


def fisher_sequential_is(
    records: ReparameterizedRecords,
    mechanism: Mechanism,
    theta: Tensor,
    num_releases: int = 256,
    num_inner: int = 256,
    debias: bool = True,
    generator: torch.Generator | None = None,
) -> FisherEstimate:
    """Alg. 3: ``n`` times the information of one record's release ``y = t(x) + noise``; ``num_releases``
    single-record releases, each score from ``num_inner`` single records weighted by ``eta(y | t(x_j))``."""
    _check_counts(num_releases, num_inner)
    if not records.sequential:
        raise ValueError(
            f"fisher_sequential_is needs a record model with a release per record, got {records!r}"
        )
    theta = theta.detach().reshape(1, -1)
    data_sets = -(-num_releases // records.n)
    y = mechanism.sample(records.simulate(theta.expand(data_sets, -1), generator), generator=generator)
    y = y.reshape(-1)[:num_releases]
    x = records.records(records.latent((num_releases, num_inner, 1), theta, generator), theta).detach()
    log_w = record_log_prob(mechanism, y[:, None], records.values(x)[..., 0])
    return _fisher_identity(
        theta, lambda t: records.log_prob(x, t)[..., 0], log_w, float(records.n), debias, "sequential"
    )


def _method(task: Task) -> str:
    """Table 1: the estimator that fits the task's release."""
    records = getattr(task, "record_model", None)
    if records is not None and records.sequential:
        return "sequential"
    summary = getattr(task, "summary_model", None)
    if summary is not None:
        return "clt" if is_clt(summary, task.mechanism) else "summary"
    return "records"


def fisher_information(
    task: Task,
    theta: Tensor | None = None,
    method: str = "auto",
    num_releases: int = 256,
    num_inner: int = 256,
    debias: bool = True,
    generator: torch.Generator | None = None,
) -> FisherEstimate:
    """Fisher information of ``task``'s release at ``theta (dim_theta,)`` (default ``task.true_theta``).

    ``method`` is one of ``clt`` (closed form), ``summary`` (Alg. 1), ``records`` (Alg. 2), ``sequential``
    (Alg. 3), or ``auto``: sequential for a release per record, ``clt`` for a CLT summary model under Gaussian
    noise, ``summary`` for another summary model, else ``records`` (Table 1).
    """
    if theta is None:
        if task.true_theta is None:
            raise ValueError(f"task {task.name!r} has no true_theta; pass theta")
        theta = task.true_theta[0]
    theta = task.check_theta(torch.as_tensor(theta, dtype=task.prior.mean.dtype).reshape(1, -1))[0]
    method = _method(task) if method == "auto" else method
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose 'auto' or one of {METHODS}")
    if method == "clt":
        return clt_fisher_information(
            summary_model_of(task, None, "the CLT Fisher information"), task.mechanism, theta
        )
    task.mechanism.require_log_prob(f"fisher_information(method={method!r})")
    options = dict(num_releases=num_releases, num_inner=num_inner, debias=debias, generator=generator)
    if method == "summary":
        return fisher_summary_is(
            summary_model_of(task, None, "fisher_summary_is"), task.mechanism, theta, **options
        )
    estimator = fisher_sequential_is if method == "sequential" else fisher_records_is
    return estimator(record_model_of(task, None, estimator.__name__), task.mechanism, theta, **options)


def rank_statistics(
    candidates: Mapping[str, Callable[[float], Task]], epsilon: float, theta: Tensor | None = None, **options
) -> list[tuple[str, FisherEstimate]]:
    """Statistic selection (Sec. 3): builds each candidate task ``factory(epsilon)`` and ranks them by the
    trace of the Fisher information of their noisy release at ``theta`` (default: each task's true theta),
    most informative first. ``options`` go to :func:`fisher_information` (``method``, ``num_releases``, ...).
    E.g. ``{"|x|": lambda e: load("normal_variance", epsilon=e, power=1), "x^2": ...}``."""
    if not candidates:
        raise ValueError("rank_statistics needs at least one candidate")
    scores = [
        (name, fisher_information(factory(epsilon), theta, **options)) for name, factory in candidates.items()
    ]
    return sorted(scores, key=lambda item: -item[1].trace)
