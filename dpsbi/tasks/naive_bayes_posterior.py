"""The exact private posterior of the naive Bayes task with 2 classes and binary features.

Given a Laplace release ``y`` of the counts ``n_ikj / n``, the latent counts take finitely many values: the class
count ``n_1 = 0..n`` (``n_2 = n - n_1``) and, per class ``i`` and feature ``k``, ``a = n_ik1 = 0..n_i``
(``n_ik2 = n_i - a``). Under Dirichlet priors the counts' marginal law is Dirichlet-multinomial and, given the
counts, the parameters are Dirichlet, so the posterior is a finite Dirichlet mixture whose weights are

    w(n_1, a) ∝ DirMult(n_1, n_2 | alpha_pi) prod_ik DirMult(a_ik, n_i - a_ik | alpha_ik) Lap(y | counts / n).

Given ``n_1`` the blocks are independent, so the weights factor into a ``(n + 1)`` class table and
``(n + 1) x (n + 1)`` tables per block: exact draws and moments cost ``O(n^2 I K)``.
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import Tensor
from torch.distributions import Categorical, Dirichlet, Distribution

from .simplex import ProductSimplex


def log_dirichlet_multinomial(counts: Tensor, alpha: Tensor) -> Tensor:
    """``log DirMult(counts | alpha)`` over the last dim (the total is ``counts.sum(-1)``)."""
    total, lg = counts.sum(-1), torch.lgamma
    return (
        lg(total + 1)
        - lg(counts + 1).sum(-1)
        + lg(alpha + counts).sum(-1)
        - lg(total + alpha.sum(-1))
        + lg(alpha.sum(-1))
        - lg(alpha).sum(-1)
    )


class NaiveBayesPosterior(Distribution):
    """Exact posterior of ``theta = (p_ik (order i, k), pi)`` given a release ``y (I*K*2,)`` of ``n_ikj / n``
    with Laplace noise of scale ``scale`` (in units of ``y``); ``cond_concentration (2, K, 2)`` and
    ``class_concentration (2,)`` are the Dirichlet priors' concentrations."""

    arg_constraints: dict = {}

    def __init__(
        self, y: Tensor, cond_concentration: Tensor, class_concentration: Tensor, n: int, scale: float
    ) -> None:
        classes, features, values = cond_concentration.shape
        if (classes, values) != (2, 2) or class_concentration.shape != (2,):
            raise ValueError(
                f"the exact naive Bayes posterior needs 2 classes and binary features, got {(classes, features, values)}"
            )
        if y.numel() != classes * features * values:
            raise ValueError(f"release has {y.numel()} entries, expected {classes * features * values}")
        self.n, self.dtype = n, y.dtype
        opts = dict(dtype=torch.float64, device=y.device)
        self.alpha, self.alpha_pi = cond_concentration.to(**opts), class_concentration.to(**opts)
        grid = torch.arange(n + 1, **opts)
        self.n_class = torch.stack([grid, n - grid], -1)  # (n+1, 2): row n_1
        a, n_i = grid[:, None, None, None], self.n_class[None, :, :, None]  # a against n_i: (a, n_1, I, K)
        self.table = torch.stack(
            [a.expand(-1, n + 1, classes, features), (n_i - a).expand(-1, -1, -1, features)], -1
        )
        y_counts = y.to(**opts).reshape(classes, features, values) * n
        log_w = log_dirichlet_multinomial(self.table.clamp(min=0), self.alpha) - (
            self.table - y_counts
        ).abs().sum(-1) / (scale * n)
        log_w = torch.where((a <= n_i).expand_as(log_w), log_w, -torch.inf)
        log_class = log_dirichlet_multinomial(self.n_class, self.alpha_pi) + torch.logsumexp(log_w, 0).sum(
            (-1, -2)
        )
        self.class_weights = torch.softmax(log_class, 0)  # (n+1,): P(n_1 | y)
        self.block_weights = torch.softmax(log_w, 0)  # (a, n_1, I, K): P(a_ik | n_1, y)
        super().__init__(
            torch.Size(), torch.Size([classes * features * values + classes]), validate_args=False
        )

    @property
    def support(self) -> ProductSimplex:
        return ProductSimplex([2] * (self.alpha.shape[0] * self.alpha.shape[1]) + [2])

    def sample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        """Exact draws ``(*sample_shape, 4K + 2)``: ``n_1``, then each block's count, then the Dirichlets."""
        shape = torch.Size(sample_shape)
        count = shape.numel()
        n1 = Categorical(probs=self.class_weights).sample((count,))  # (count,)
        a = Categorical(probs=self.block_weights[:, n1].movedim(0, -1)).sample()  # (count, I, K)
        tables = torch.gather(self.table[:, n1], 0, a[None, ..., None].expand(1, -1, -1, -1, 2))[
            0
        ]  # (count, I, K, 2)
        cond = Dirichlet(self.alpha + tables).sample()
        pi = Dirichlet(self.alpha_pi + self.n_class[n1]).sample()
        return torch.cat([cond.reshape(count, -1), pi], -1).to(self.dtype).reshape(shape + self.event_shape)

    @cached_property
    def _moments(self) -> tuple[Tensor, Tensor]:
        """Exact posterior mean and variance ``(4K + 2,)`` from the mixture's Dirichlet moments (computed once)."""

        def beta_moments(first: Tensor, total: Tensor, weights: Tensor, dims) -> tuple[Tensor, Tensor]:
            m1 = (weights * first / total).sum(dims)
            m2 = (weights * first * (first + 1) / (total * (total + 1))).sum(dims)
            return m1, m2 - m1**2

        weight_cell = self.block_weights * self.class_weights[:, None, None]  # joint P(a_ik, n_1 | y)
        first = self.alpha[..., 0] + self.table[..., 0]
        total = self.alpha.sum(-1) + self.n_class[None, :, :, None]
        mean_p, var_p = beta_moments(first, total, weight_cell, (0, 1))  # (I, K)
        mean_pi, var_pi = beta_moments(
            self.alpha_pi + self.n_class, self.alpha_pi.sum() + self.n, self.class_weights[:, None], 0
        )
        mean = torch.cat([torch.stack([mean_p, 1 - mean_p], -1).flatten(), mean_pi])
        var = torch.cat([torch.stack([var_p, var_p], -1).flatten(), var_pi])
        return mean.to(self.dtype), var.to(self.dtype)

    @property
    def mean(self) -> Tensor:
        return self._moments[0]

    @property
    def variance(self) -> Tensor:
        return self._moments[1]


def naive_bayes_log_likelihood(theta: Tensor, y: Tensor, mechanism, n: int, chunk: int = 128) -> Tensor:
    """The exact ``log p(y | theta)`` ``(b,)`` (float64) of the naive Bayes task with 2 classes and binary
    features, for ``theta (b, 4K + 2)`` (all ``p_ik`` in order i, k, then ``pi``) and a release ``y (4K,)`` of
    ``n_ikj / n`` through ``mechanism`` (any whose noise is independent across cells): the latent counts summed
    out as in :class:`NaiveBayesPosterior`, ``sum_{n_1} Bin(n_1; n, pi_1) prod_ik sum_a Bin(a; n_i, p_ik1)
    eta(y_ik1 | a / n) eta(y_ik2 | (n_i - a) / n)``: ``O(n^2 K)`` a theta, in chunks of ``chunk`` rows."""
    opts = dict(dtype=torch.float64, device=theta.device)
    theta = theta.to(**opts).reshape(theta.shape[0], -1)
    features = (theta.shape[1] - 2) // 4
    grid = torch.arange(n + 1, **opts)
    cells = torch.as_tensor(y, **opts).reshape(1, -1).expand(n + 1, -1)
    log_eta = mechanism.coordinate_log_prob(cells, (grid / n)[:, None].expand_as(cells)).to(**opts)
    log_eta = log_eta.T.reshape(2, features, 2, n + 1)  # (i, k, j, count)
    m, a = grid[:, None], grid[None, :]  # a class's records m, and a of them with the feature's first value
    below = a <= m
    pairs = log_eta[:, :, 0, None, :] + log_eta[:, :, 1][..., (m - a).clamp(min=0).long()]  # (i, k, m, a)
    choose = torch.lgamma(m + 1) - torch.lgamma(a + 1) - torch.lgamma((m - a).clamp(min=0) + 1)
    fixed = torch.where(below, pairs + choose, -torch.inf)
    choose_class = choose[n]  # log C(n, n_1) for n_1 = 0..n
    out = []
    for rows in theta.split(chunk):
        p = rows[:, : 4 * features].reshape(-1, 2, features, 2, 1, 1)  # (b, i, k, j, m, a)
        log_bin = torch.xlogy(a, p[:, :, :, 0]) + torch.xlogy(torch.where(below, m - a, 0.0), p[:, :, :, 1])
        blocks = torch.logsumexp(log_bin + fixed, -1).sum(2)  # (b, i, m): each class's features given n_i = m
        pi = rows[:, 4 * features :]
        classes = choose_class + torch.xlogy(grid, pi[:, :1]) + torch.xlogy(n - grid, pi[:, 1:])
        out.append(torch.logsumexp(classes + blocks[:, 0] + blocks[:, 1].flip(-1), -1))
    return torch.cat(out)
