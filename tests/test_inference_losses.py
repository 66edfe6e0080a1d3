"""SPPE/SPLE losses against closed-form expectations, the atomic APT loss, and RQMC's variance reduction."""

import math

import numpy as np
import pytest
import torch
from torch.distributions import Normal

import dpsbi
from dpsbi.inference.flows import ConditionalFlow, FlowSettings
from dpsbi.inference.losses import (
    atom_indices,
    inner_releases,
    loss_estimates,
    posterior_loss,
    sple_loss,
    sppe_loss,
)
from dpsbi.mechanisms import Gaussian, Laplace


class LinearGaussian:
    """``q(x | c) = N(x; a c, v I)``, with ``log_prob`` broadcasting like a ConditionalFlow."""

    def __init__(self, a: float, v: float) -> None:
        self.a, self.v = a, v

    def log_prob(self, x, c):
        return Normal(self.a * c, math.sqrt(self.v)).log_prob(x).sum(-1)


def _pairs(n=40, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(n, d, generator=g, dtype=torch.float64)
    return theta, theta + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64)


def _mc_standard_error(terms: torch.Tensor) -> float:
    """Standard error of the mean of i.i.d. ``terms``: the tolerance scale for both MC and RQMC (whose
    variance is smaller for these smooth integrands)."""
    return float(terms.std() / math.sqrt(terms.numel()))


@pytest.mark.parametrize("qmc", [True, False])
def test_sple_loss_is_unbiased_for_the_expected_negative_log_likelihood(qmc):
    theta, s = _pairs()
    mech, v = Laplace(epsilon=2.0, sensitivity=1.0, dim=3), 0.7
    q = LinearGaussian(1.0, v)
    g = torch.Generator().manual_seed(1)
    loss = sple_loss(q, theta, s, mech, inner_samples=64, qmc=qmc, generator=g)
    # E_y|s[-log N(y; theta, v)] with y = s + Laplace(b): E(y - theta)^2 = (s - theta)^2 + 2 b^2 per coordinate.
    exact = (
        (0.5 * math.log(2 * math.pi * v) + ((s - theta) ** 2 + 2 * mech.scale**2) / (2 * v)).sum(-1).mean()
    )
    terms = -q.log_prob(mech.sample(s.unsqueeze(1).expand(-1, 64, -1), generator=g), theta.unsqueeze(1))
    assert abs(float(loss) - float(exact)) < 4 * _mc_standard_error(terms)


@pytest.mark.parametrize("qmc", [True, False])
def test_sppe_loss_is_unbiased_for_the_expected_negative_log_posterior(qmc):
    theta, s = _pairs()
    mech, a, v = Gaussian(epsilon=1.0, delta=1e-5, sensitivity=0.5, dim=3), 0.6, 0.4
    q = LinearGaussian(a, v)
    g = torch.Generator().manual_seed(2)
    loss = sppe_loss(q, theta, s, mech, inner_samples=32, qmc=qmc, generator=g)
    # -log N(theta; a y, v) with y = s + sigma eps: E(theta - a y)^2 = (theta - a s)^2 + a^2 sigma^2.
    exact = (
        (0.5 * math.log(2 * math.pi * v) + ((theta - a * s) ** 2 + a**2 * mech.sigma**2) / (2 * v))
        .sum(-1)
        .mean()
    )
    terms = -q.log_prob(theta.unsqueeze(1), mech.sample(s.unsqueeze(1).expand(-1, 32, -1), generator=g))
    assert abs(float(loss) - float(exact)) < 4 * _mc_standard_error(terms)


def test_inner_releases_are_fresh_per_row_and_call():
    s = torch.zeros(5, 2)
    mech = Laplace(epsilon=1.0, sensitivity=1.0, dim=2)
    g = torch.Generator().manual_seed(0)
    y = inner_releases(s, mech, 8, qmc=True, generator=g)
    assert y.shape == (5, 8, 2)
    assert not torch.equal(y[0], y[1])  # each row its own scramble
    assert not torch.equal(y, inner_releases(s, mech, 8, qmc=True, generator=g))  # fresh noise every call


def test_atom_indices_put_the_row_first_and_draw_distinct_others():
    idx = atom_indices(50, 10, torch.Generator().manual_seed(0))
    assert idx.shape == (50, 10)
    assert torch.equal(idx[:, 0], torch.arange(50))
    assert all(len(set(row.tolist())) == 10 for row in idx)  # distinct, so no other atom repeats row i
    with pytest.raises(ValueError, match="atoms"):
        atom_indices(5, 6)


def test_atom_indices_draw_every_subset_of_other_rows_equally_often():
    """Batch 5, 3 atoms: each row's 2 others are one of C(4, 2) = 6 subsets; over 20 000 draws of the 5 rows
    every (row, subset) count is within 5 sd of its binomial mean, and a chi-square over all 30 cells is below
    its 0.9999 quantile."""
    from itertools import combinations

    from scipy import stats

    draws = torch.cat([atom_indices(5, 3, torch.Generator().manual_seed(s)) for s in range(4000)])
    counts = {}
    for row in draws.tolist():
        key = (row[0], tuple(sorted(row[1:])))
        counts[key] = counts.get(key, 0) + 1
    cells = [(i, c) for i in range(5) for c in combinations([j for j in range(5) if j != i], 2)]
    assert set(counts) == set(cells)
    observed = np.array([counts[c] for c in cells])
    expected, sd = 4000 / 6, math.sqrt(4000 * (1 / 6) * (5 / 6))
    assert np.abs(observed - expected).max() < 5 * sd
    assert ((observed - expected) ** 2 / expected).sum() < stats.chi2.ppf(0.9999, len(cells) - 5)


def test_atomic_loss_is_log_atoms_for_the_prior_and_lower_for_the_true_posterior():
    """With q = prior every atom is equally likely: the loss is exactly log A. The exact posterior of a
    conjugate Gaussian model must beat that by a clear margin."""
    g = torch.Generator().manual_seed(3)
    n, d, noise = 200, 2, 0.25
    theta = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = (theta + math.sqrt(noise) * torch.randn(n, d, generator=g, dtype=torch.float64)).unsqueeze(
        1
    )  # (n, 1, d)
    prior = Normal(0.0, 1.0)
    log_prior = prior.log_prob(theta).sum(-1)

    class PriorFlow:
        def log_prob(self, x, c):
            return prior.log_prob(x).sum(-1).expand(torch.broadcast_shapes(x.shape[:-1], c.shape[:-1]))

    assert float(
        posterior_loss(PriorFlow(), theta, y, atoms=10, log_prior=log_prior, generator=g)
    ) == pytest.approx(math.log(10), abs=1e-12)
    exact = LinearGaussian(
        1 / (1 + noise), noise / (1 + noise)
    )  # theta | y ~ N(y / (1 + noise), noise / (1 + noise))
    assert (
        float(posterior_loss(exact, theta, y, atoms=10, log_prior=log_prior, generator=g))
        < math.log(10) - 0.5
    )
    with pytest.raises(ValueError, match="log_prior"):
        posterior_loss(exact, theta, y, atoms=10)


def test_rqmc_loss_variance_is_lower_and_falls_faster_than_mc_on_regression():
    """Fixed (perturbed, randomly initialised) flow and 8 stored pairs; variance of the SPLE loss estimate
    over 60 randomizations at M = 2..128. Measured: MC slope -1.04, RQMC -1.45 and below MC from M = 8 (the
    default flow perturbed by 0.3 is rougher: RQMC's slope there is -1.26, its gain smaller)."""
    task = dpsbi.tasks.load("regression", epsilon=1.0)
    torch.manual_seed(0)
    theta = task.prior.sample((8,))
    s = task.simulate(theta, torch.Generator().manual_seed(0))
    flow = ConditionalFlow(
        FlowSettings(transforms=2, hidden=16), task.release(s.repeat(20, 1)), theta.repeat(20, 1)
    )
    with torch.no_grad():  # a fixed, non-trivial flow: perturb the near-identity initialisation
        for p in flow.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    ms = np.array([2, 8, 32, 128])
    g = torch.Generator().manual_seed(5)
    var = {
        qmc: np.array(
            [
                float(loss_estimates(sple_loss, flow, theta, s, task.mechanism, m, qmc, 60, g).var())
                for m in ms
            ]
        )
        for qmc in (False, True)
    }
    slope = {qmc: np.polyfit(np.log(ms), np.log(v), 1)[0] for qmc, v in var.items()}
    assert -1.3 < slope[False] < -0.7, slope  # MC: variance ~ 1/M
    assert slope[True] < slope[False] - 0.25, slope  # RQMC falls faster
    assert (var[True][1:] < var[False][1:]).all(), var  # and is lower from M = 8 on


def test_the_combined_loss_adds_the_plain_term_on_the_prior_rows_only():
    """sbi's combined loss: rows marked as prior draws add ``-log q(theta_i | y_ij)`` to their atomic term (the
    same atoms), the others keep the atomic term alone; a q twice as wide as the exact posterior scores clearly
    worse than it (the plain term's expected excess is the KL divergence, ~0.44 per dimension)."""
    g = torch.Generator().manual_seed(5)
    n, d, noise = 200, 2, 0.25
    theta = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = (theta + math.sqrt(noise) * torch.randn(n, d, generator=g, dtype=torch.float64)).unsqueeze(1)
    log_prior = Normal(0.0, 1.0).log_prob(theta).sum(-1)
    exact = LinearGaussian(1 / (1 + noise), noise / (1 + noise))
    index = atom_indices(n, 10, g)
    mask = (torch.arange(n) % 2 == 0).to(theta.dtype)

    def terms(prior_rows=None, flow=exact):
        return posterior_loss(
            flow, theta, y, 10, log_prior, reduction="none", index=index, prior_rows=prior_rows
        )

    plain = posterior_loss(exact, theta, y, reduction="none")
    torch.testing.assert_close(terms(mask), terms() + mask * plain)
    assert float(terms(torch.zeros(n, dtype=theta.dtype)).mean()) == float(terms().mean())
    wide = LinearGaussian(1 / (1 + noise), 4 * noise / (1 + noise))  # twice the posterior sd
    ones = torch.ones(n, dtype=theta.dtype)
    assert float(terms(ones, wide).mean() - terms(ones).mean()) > 0.3  # KL per dimension ~0.44 x 2
