"""Record-level models of the tasks whose confidential data are ``n`` i.i.d. records (for DA-MCMC).

A record model draws records ``x_i ~ f(x | theta)``, maps each record to its contribution ``t(x_i)``
to the task's statistic (``s = sum_i t(x_i)``), and draws ``theta`` from the complete-data posterior
``p(theta | x_1..x_n)`` (conjugate for both models here).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributions import Independent, Normal

from ..tasks import Task
from ..tasks.regression import statistic_sums
from ..tasks.simplex import ProductDirichlet


class RecordModel(abc.ABC):
    """``n`` i.i.d. records given ``theta``, a statistic that sums over records, a conjugate prior.

    Shapes: parameters ``(C, dim_theta)``, records ``(C, m, record_dim)`` (``C`` chains), contributions
    ``(C, m, dim_s)``.
    """

    n: int

    @abc.abstractmethod
    def sample(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``n`` fresh records per row of ``theta (C, dim_theta)``: ``(C, n, record_dim)``."""

    @abc.abstractmethod
    def contribution(self, records: Tensor) -> Tensor:
        """Each record's share ``t(x_i) (C, m, dim_s)`` of the statistic, which is their sum over ``m``."""

    @abc.abstractmethod
    def posterior_sample(self, records: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One draw ``(C, dim_theta)`` from ``p(theta | records)``; with ``m = 0`` records, a prior draw."""

    def prior_sample(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Prior draws, one per row of ``theta (C, dim_theta)``: the complete-data posterior given no records
        (records of ``theta`` cut to length 0, which fixes their dtype and width)."""
        return self.posterior_sample(self.sample(theta, generator)[:, :0], generator)

    def statistic(self, records: Tensor) -> Tensor:
        """The task's statistic ``(C, dim_s)`` of records ``(C, n, record_dim)``."""
        return self.contribution(records).sum(-2)


@dataclass
class RegressionRecords(RecordModel):
    """Records ``(x_1..x_p, y)``, unclamped: ``x ~ N(x_mean, I)``, ``y | x ~ N(beta_0 + x beta, noise_var)``.

    The statistic clamps and rescales them (``dpsbi.tasks.regression.sufficient_statistic``); keeping the
    unclamped records as the latent state makes ``beta | records`` Gaussian under the Gaussian prior
    ``N(prior_loc, diag(prior_scale^2))``.
    """

    prior_loc: Tensor
    prior_scale: Tensor
    n: int = 100
    x_mean: tuple[float, ...] = (0.9, -1.17)
    noise_var: float = 2.0
    bound: float = 10.0

    @classmethod
    def from_task(cls, task: Task, **constants) -> RegressionRecords:
        """The record model of a ``regression`` task: prior and ``n`` (from the Laplace sensitivity
        ``(p^2 + 3p + 3) / n``) are read off the task; ``x_mean``, ``noise_var``, ``bound`` default to the
        paper's and can be overridden. Raises unless the model reproduces ``task.simulate`` exactly."""
        prior = task.prior
        if not (isinstance(prior, Independent) and isinstance(prior.base_dist, Normal)):
            raise ValueError(f"regression records need a Gaussian prior on beta, got {prior!r}")
        p = task.dim_theta - 1
        n = round((p * p + 3 * p + 3) / task.mechanism.sensitivity)
        model = cls(prior.base_dist.loc, prior.base_dist.scale, **{"n": n, **constants})
        if len(model.x_mean) != p:
            raise ValueError(f"x_mean must have {p} entries for this task, got {model.x_mean}")
        model.check_reproduces(task)
        return model

    def check_reproduces(self, task: Task, seed: int = 0) -> None:
        """Raise ``ValueError`` unless the records' statistic equals ``task.simulate`` under shared randomness,
        i.e. unless this model has the task's constants (``n``, ``x_mean``, ``noise_var``, ``bound``)."""
        theta = torch.stack([self.prior_loc, self.prior_loc + self.prior_scale])
        s_task = task.simulate(theta, torch.Generator(theta.device).manual_seed(seed))
        s_records = self.statistic(self.sample(theta, torch.Generator(theta.device).manual_seed(seed)))
        if not torch.allclose(s_task, s_records, rtol=1e-4, atol=1e-6):
            raise ValueError(
                f"the record model {self!r} does not reproduce task.simulate of {task!r}; pass "
                "records=RegressionRecords.from_task(task, x_mean=..., noise_var=...) with the task's constants"
            )

    def sample(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        opts = dict(generator=generator, device=theta.device, dtype=theta.dtype)
        c, p = theta.shape[0], len(self.x_mean)
        x = torch.tensor(self.x_mean, device=theta.device, dtype=theta.dtype) + torch.randn(
            c, self.n, p, **opts
        )
        mean = theta[:, None, 0] + torch.einsum("cnj,cj->cn", x, theta[:, 1:])
        y = mean + math.sqrt(self.noise_var) * torch.randn(c, self.n, **opts)
        return torch.cat([x, y[..., None]], -1)

    def statistic(self, records: Tensor) -> Tensor:
        """The statistic ``(C, 9)`` of records ``(C, n, p + 1)``: their shares' sum as one batched product over
        the records (:func:`~dpsbi.tasks.regression.statistic_sums`), not record by record (14x faster at
        100 000 x 442 records)."""
        return statistic_sums(records[..., :-1], records[..., -1], self.bound) / self.n

    def contribution(self, records: Tensor) -> Tensor:
        c, m, width = records.shape
        single = records.reshape(c * m, 1, width)
        return statistic_sums(single[..., :-1], single[..., -1], self.bound).reshape(c, m, -1) / self.n

    def posterior_sample(self, records: Tensor, generator: torch.Generator | None = None) -> Tensor:
        design = torch.cat([torch.ones_like(records[..., :1]), records[..., :-1]], -1)  # (C, m, p+1)
        prior_precision = self.prior_scale.to(records).pow(-2)
        precision = torch.diag_embed(prior_precision.expand(records.shape[0], -1)) + (
            design.mT @ design / self.noise_var
        )
        shift = (
            prior_precision * self.prior_loc.to(records)
            + torch.einsum("cmj,cm->cj", design, records[..., -1]) / self.noise_var
        )
        chol = torch.linalg.cholesky(precision)
        mean = torch.cholesky_solve(shift[..., None], chol)
        z = torch.randn(mean.shape, generator=generator, device=records.device, dtype=records.dtype)
        return (mean + torch.linalg.solve_triangular(chol.mT, z, upper=True)).squeeze(-1)


@dataclass
class NaiveBayesRecords(RecordModel):
    """Records ``(class, value of feature 1..K)``: ``class ~ Cat(pi)``, ``value_k | class = i ~ Cat(p_ik)``.

    The statistic is the counts ``n_ikj / n`` (order i, k, j); with Dirichlet priors (concentrations
    ``cond_concentration (I, K, J)`` and ``class_concentration (I,)``) the complete-data posterior is Dirichlet.
    Parameters are laid out as in the ``naive_bayes`` task: all ``p_ik`` (order i, k), then ``pi``.
    """

    cond_concentration: Tensor
    class_concentration: Tensor
    n: int = 100

    @classmethod
    def from_task(cls, task: Task) -> NaiveBayesRecords:
        """The record model of a ``naive_bayes`` task: the numbers of classes, features and values and the
        Dirichlet concentrations come from its prior, ``n`` from the Laplace sensitivity ``2K / n``."""
        prior = task.prior
        if not isinstance(prior, ProductDirichlet):
            raise ValueError(f"naive Bayes records need a product-Dirichlet prior, got {prior!r}")
        classes, values = prior.sizes[-1], prior.sizes[0]
        features = (len(prior.sizes) - 1) // classes
        if prior.sizes[:-1] != [values] * (classes * features):
            raise ValueError(
                f"prior blocks {prior.sizes} are not I*K blocks of J values followed by I classes"
            )
        blocks = [b.concentration for b in prior.blocks]
        cond = torch.stack(blocks[:-1]).reshape(classes, features, values)
        return cls(cond, blocks[-1], n=round(2 * features / task.mechanism.sensitivity))

    def sample(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        classes, features, values = self.cond_concentration.shape
        c = theta.shape[0]
        cond = theta[:, : classes * features * values].reshape(c, classes, features, values)
        pi = theta[:, classes * features * values :]
        u = torch.rand(c, self.n, 1 + features, generator=generator, device=theta.device, dtype=theta.dtype)
        label = _categorical(pi[:, None, :], u[..., 0])  # (C, n)
        probs = cond[torch.arange(c, device=theta.device)[:, None], label]  # (C, n, K, J)
        return torch.cat([label[..., None], _categorical(probs, u[..., 1:])], -1)

    def contribution(self, records: Tensor) -> Tensor:
        classes, features, values = self.cond_concentration.shape
        k = torch.arange(features, device=records.device)
        cell = (records[..., :1] * features + k) * values + records[..., 1:]  # (C, m, K)
        counts = torch.zeros(records.shape[:-1] + (classes * features * values,), device=records.device)
        return counts.scatter_(-1, cell, 1.0) / self.n

    def posterior_sample(self, records: Tensor, generator: torch.Generator | None = None) -> Tensor:
        counts = (self.contribution(records).sum(-2) * self.n).round()
        counts = counts.reshape(-1, *self.cond_concentration.shape)  # (C, I, K, J)
        cond = torch._sample_dirichlet(self.cond_concentration.to(counts) + counts, generator=generator)
        pi = torch._sample_dirichlet(
            self.class_concentration.to(counts) + counts[:, :, 0].sum(-1), generator=generator
        )
        return torch.cat([cond.flatten(1), pi], -1)


def _categorical(probs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draws ``(...)`` (long) from categorical ``probs (..., J)`` with uniforms ``u (...)``."""
    return (u[..., None] > probs.cumsum(-1)[..., :-1]).sum(-1)


def record_model(task: Task) -> RecordModel:
    """The record model of ``task`` (``regression`` or ``naive_bayes``); ``ValueError`` for other tasks."""
    builders = {"regression": RegressionRecords.from_task, "naive_bayes": NaiveBayesRecords.from_task}
    if task.name not in builders:
        raise ValueError(
            f"data-augmentation MCMC needs a record-level model of the confidential data; task {task.name!r} has "
            f"none (supported: {', '.join(builders)}), or pass records=<a RecordModel>"
        )
    return builders[task.name](task)
