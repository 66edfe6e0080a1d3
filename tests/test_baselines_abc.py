"""Exact ABC (rejection, importance sampling) and SMC-ABC against closed-form private posteriors.

Every statistical check uses a fixed seed and a tolerance from the Monte Carlo error: a KS test whose
sample size is the (Kish) effective sample size, means within 4 sd / sqrt(ESS), standard deviations within
4 sd / sqrt(2 ESS), log evidences within 4 standard errors.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from scipy.stats import kstwo, nbinom
from torch.distributions import Gamma, Independent, MultivariateNormal, Normal

import dpsbi
from dpsbi.baselines import BaselineResult, SimulationBudgetExceeded, abc_is, rejection_abc, smc_abc
from dpsbi.baselines.smc_abc import Perturbation

P_MIN = 1e-3


@pytest.fixture(scope="module")
def poisson():
    return dpsbi.tasks.load("poisson_counts", epsilon=0.2)


def weighted_ks_pvalue(samples: torch.Tensor, weights: torch.Tensor | None, cdf) -> float:
    """KS p-value of (weighted) 1-d draws against ``cdf``, with the Kish ESS as the sample size."""
    x, order = samples.double().sort()
    w = torch.full_like(x, 1 / len(x)) if weights is None else weights.double()[order]
    upper = w.cumsum(0)
    f = cdf(x).double()
    distance = max(float((upper - f).max()), float((f - (upper - w)).max()))
    return float(kstwo.sf(distance, round(float(1 / (w**2).sum()))))


def poisson_cdf(posterior, x: torch.Tensor) -> torch.Tensor:
    """CDF of the exact Poisson-count posterior (a Gamma mixture) at points ``x (n,)``."""
    gamma = posterior.component_distribution.base_dist
    probs = posterior.mixture_distribution.probs
    x = x.to(probs).clamp(min=torch.finfo(probs.dtype).tiny)  # the CDF is 0 below the support
    return (gamma.cdf(x.reshape(-1, 1, 1)).squeeze(-1) * probs).sum(-1)


def poisson_log_evidence(y: float, epsilon: float = 0.2, shape: float = 25.0, rate: float = 1.0) -> float:
    """Exact ``log p(y)``: negative-binomial prior predictive of the count convolved with Laplace noise."""
    s = torch.arange(2000, dtype=torch.float64)
    log_pred = torch.as_tensor(nbinom.logpmf(s.numpy(), shape, rate / (1 + rate)))
    log_lap = -(y - s).abs() * epsilon + math.log(epsilon / 2)
    return float(torch.logsumexp(log_pred + log_lap, 0))


def assert_moments(result: BaselineResult, mean: torch.Tensor, sd: torch.Tensor) -> None:
    """Weighted mean and sd of every coordinate within 4 Monte Carlo standard errors of the exact ones."""
    n = result.samples.shape[0]
    w = result.weights if result.weights is not None else torch.full((n,), 1 / n)
    m = w @ result.samples
    s = (w @ (result.samples - m) ** 2).sqrt()
    ess = result.ess
    assert torch.all((m - mean).abs() < 4 * sd / math.sqrt(ess)), (m, mean, ess)
    assert torch.all((s - sd).abs() < 4 * sd / math.sqrt(2 * ess)), (s, sd, ess)


def check_exact_poisson(result: BaselineResult, task) -> None:
    posterior = task.exact_posterior(task.y_obs)
    cdf = lambda x: poisson_cdf(posterior, x)  # noqa: E731
    assert weighted_ks_pvalue(result.samples[:, 0], result.weights, cdf) > P_MIN
    assert_moments(result, posterior.mean, posterior.stddev)


def test_rejection_abc_poisson_is_exact(poisson):
    result = rejection_abc(poisson, 20_000, batch_size=20_000, seed=0, progress=False)
    assert result.samples.shape == (20_000, 1) and result.weights is None
    check_exact_poisson(result, poisson)
    # Power: the same test rejects the naive posterior that treats the release as the confidential count.
    naive = Gamma(torch.tensor(25 + 37.4), torch.tensor(2.0))
    assert weighted_ks_pvalue(result.samples[:, 0], None, naive.cdf) < P_MIN
    # The acceptance rate estimates p(y) / sup eta: a binomial proportion.
    rate = result.info["acceptance_rate"]
    se = math.sqrt((1 - rate) / (rate * result.num_simulations))
    assert abs(result.info["log_evidence"] - poisson_log_evidence(37.4)) < 4 * se


def test_abc_is_poisson_with_proposal_outside_support(poisson):
    proposal = Independent(Normal(torch.tensor([30.0]), torch.tensor([12.0])), 1)  # 0.6 % of its mass below 0
    result = abc_is(poisson, 40_000, proposal=proposal, batch_size=15_000, seed=0, progress=False)
    negative = result.samples[:, 0] <= 0
    assert negative.any() and torch.all(result.weights[negative] == 0)
    assert result.num_simulations == 40_000 - int(negative.sum())  # no simulation for impossible draws
    assert result.info["ess"] == pytest.approx(result.ess)
    check_exact_poisson(result, poisson)
    se = math.sqrt(1 / result.ess - 1 / 40_000)  # relative sd of the mean weight
    assert abs(result.info["log_evidence"] - poisson_log_evidence(37.4)) < 4 * se


def test_smc_abc_mechanism_kernel_poisson_is_exact(poisson):
    result = smc_abc(poisson, num_particles=4000, kernel="mechanism", seed=0, progress=False)
    info = result.info
    assert info["tolerances"] == pytest.approx([1.0, 0.7, 0.49, 0.343, 0.2401, 0.2])
    assert info["powers"][-1] == 1.0 and info["powers"][0] == pytest.approx(0.2)
    assert result.num_simulations == 6 * 4000 == sum(info["simulations"])
    assert result.weights.sum().item() == pytest.approx(1.0, abs=1e-5)
    check_exact_poisson(result, poisson)


def test_rejection_abc_conjugate_gaussian_is_exact():
    task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
    posterior = task.exact_posterior(task.y_obs)
    result = rejection_abc(task, 10_000, seed=1, progress=False)
    mean, sd = posterior.mean, posterior.stddev
    assert_moments(result, mean, sd)
    for j in range(task.dim_theta):
        marginal = Normal(mean[j], sd[j])
        assert weighted_ks_pvalue(result.samples[:, j], None, marginal.cdf) > P_MIN
    correlation = torch.corrcoef(result.samples.T)[0, 1]
    assert abs(correlation) < 4 / math.sqrt(10_000)  # the exact posterior has independent coordinates


def test_simulation_cap_raises_with_progress(poisson):
    with pytest.raises(
        SimulationBudgetExceeded, match=r"max_simulations=5000 .* accepted \(acceptance rate 0\.1"
    ):
        rejection_abc(poisson, 100_000, batch_size=1000, max_simulations=5000, seed=0, progress=False)
    with pytest.raises(
        SimulationBudgetExceeded,
        match=r"max_simulations=20000 after 2\d{4} simulations in all: the generation at tolerance",
    ):
        smc_abc(
            poisson, num_particles=500, tolerance_end=0.01, max_simulations=20_000, seed=0, progress=False
        )
    with pytest.raises(SimulationBudgetExceeded, match="above max_simulations"):
        smc_abc(poisson, num_particles=500, kernel="mechanism", max_simulations=1000, progress=False)


def test_bad_input_is_named(poisson):
    # a count that is not whole is refused before any simulation (2.5 draws ran the loop, then failed slicing)
    with pytest.raises(ValueError, match=r"^num_samples must be an integer >= 1, got 2.5$"):
        rejection_abc(poisson, 2.5, progress=False)
    with pytest.raises(ValueError, match=r"^num_particles must be an integer >= 2, got 100.5$"):
        smc_abc(poisson, num_particles=100.5, progress=False)
    with pytest.raises(ValueError, match="shape"):
        rejection_abc(poisson, 10, y=torch.zeros(1, 3), progress=False)
    with pytest.raises(ValueError, match="single release"):
        abc_is(poisson, 10, y=torch.tensor([[30.0], [31.0]]), progress=False)
    with pytest.raises(ValueError, match="event shape"):
        abc_is(poisson, 10, proposal=Normal(torch.tensor(30.0), 1.0), progress=False)
    with pytest.raises(ValueError, match="kernel"):
        smc_abc(poisson, kernel="gaussian", progress=False)
    with pytest.raises(ValueError, match="tolerance_end <= tolerance_start"):
        smc_abc(poisson, tolerance_start=0.1, tolerance_end=0.2, progress=False)
    real = dataclasses.replace(poisson, release_from_mechanism=False)
    for method in (rejection_abc, abc_is):
        with pytest.raises(ValueError, match="not a release of its mechanism"):
            method(real, 10, progress=False)
    with pytest.raises(ValueError, match="not a release of its mechanism"):
        smc_abc(real, kernel="mechanism", progress=False)


def test_smc_abc_euclidean_regression_runs_and_counts():
    task = dpsbi.tasks.load("regression", epsilon=10.0)
    run = lambda: smc_abc(task, num_particles=200, tolerance_end=0.3, seed=3, progress=False)  # noqa: E731
    result = run()
    info = result.info
    assert result.samples.shape == (200, 3) and torch.isfinite(result.samples).all()
    assert result.weights.sum().item() == pytest.approx(1.0, abs=1e-5)
    assert info["tolerances"] == pytest.approx([1.0, 0.7, 0.49, 0.343, 0.3])
    assert result.num_simulations == sum(info["simulations"])
    assert all(n >= 200 for n in info["simulations"]) and info["distance_scale"] > 0
    assert all(0 < a <= 1 for a in info["acceptance_rates"])
    torch.testing.assert_close(run().samples, result.samples)  # the seed fixes the run


def test_perturbation_is_the_weighted_gaussian_mixture():
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(50, 3, generator=generator) * torch.tensor([1.0, 2.0, 0.5]) + torch.tensor(
        [3.0, -2.0, 10.0]
    )
    weights = torch.softmax(torch.randn(50, generator=generator), 0)
    proposal = Perturbation(z, weights, scale=2.0)
    centered = z - weights @ z
    covariance = 2.0 * (centered.T * weights) @ centered
    jitter = 1e-5 * covariance.diagonal().max() * torch.eye(3)  # keeps degenerate populations proposable
    torch.testing.assert_close(proposal.chol @ proposal.chol.T, covariance + jitter)
    torch.manual_seed(0)
    x = proposal.sample(2000)
    components = (
        MultivariateNormal(torch.zeros(3), covariance + jitter).log_prob(x[:, None] - z) + weights.log()
    )
    torch.testing.assert_close(proposal.log_prob(x), torch.logsumexp(components, -1), rtol=1e-5, atol=1e-4)
    # Draws follow the mixture: mean weights @ z, covariance (1 + scale) x population covariance.
    se = (3 * covariance / 2).diagonal().sqrt() / math.sqrt(2000)
    assert torch.all((x.mean(0) - weights @ z).abs() < 4 * se)


@pytest.mark.parametrize("seed", [-1, True, 2.0])
def test_a_seed_that_is_not_a_non_negative_integer_is_refused_before_any_simulation(seed):
    """torch wraps a negative seed silently; numpy's message (in the estimators) did not say what to fix."""
    task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
    for baseline, budget in ((rejection_abc, dict(num_samples=10)), (smc_abc, dict(num_particles=10))):
        with pytest.raises(
            ValueError, match=r"^seed must be an integer from 0 to 2\*\*63 - 1, got .*; pass e\.g\. seed=0$"
        ):
            baseline(task, **budget, seed=seed, progress=False)


def test_unweighted_resampling_spans_every_draw_and_refuses_bad_counts():
    """An MCMC result's draws are chain after chain: n of them are a random subset of all, not the first n
    (one chain's); a count that is not a whole number >= 1 is refused (-3 returned all but the last 3)."""
    chains = torch.arange(1000.0).reshape(2, 500, 1)  # two chains of 500 draws
    result = BaselineResult(chains.reshape(-1, 1), num_simulations=1000)
    draws = result.resample(100, torch.Generator().manual_seed(0)).flatten()
    assert draws.unique().numel() == 100 and 30 <= int((draws >= 500).sum()) <= 70  # both chains, no repeats
    assert torch.equal(draws, result.resample(100, torch.Generator().manual_seed(0)).flatten())
    assert torch.equal(result.resample(1000).sort(0).values, result.samples)
    for count in (-3, 0, 2.5):
        with pytest.raises(ValueError, match=rf"^num_samples must be an integer >= 1, got {count}$"):
            result.resample(count)
    with pytest.raises(ValueError, match="asked for 1001 draws but the result holds 1000"):
        result.resample(1001)
