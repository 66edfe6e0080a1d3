"""Data-augmentation MCMC (Ju et al. 2022) against exact private posteriors: exact ABC importance sampling
on regression, the exact posterior (latent counts enumerated) on naive Bayes."""

import math

import pytest
import torch

import dpsbi
from dpsbi.baselines.da_mcmc import da_mcmc, record_sweep
from dpsbi.baselines.exact_abc import abc_is, seeded
from dpsbi.baselines.records import RegressionRecords, record_model
from dpsbi.diagnostics import rhat
from dpsbi.metrics import c2st

GEN = lambda seed=0: torch.Generator().manual_seed(seed)  # noqa: E731


def assert_matches(
    chains: torch.Tensor, mean: torch.Tensor, sd: torch.Tensor, ref_ess: float = math.inf, z: float = 4.0
):
    """Mean and variance of independent ``chains (C, T, d)`` within ``z`` Monte Carlo errors of the reference's,
    the errors estimated from the spread between chains (plus the reference's own, from its ESS)."""
    chains, mean, sd = chains.double(), mean.double(), sd.double()
    per_chain = chains.mean(1)
    got_mean, se_mean = per_chain.mean(0), per_chain.std(0) / math.sqrt(chains.shape[0])
    per_chain_var = ((chains - got_mean) ** 2).mean(1)
    got_var, se_var = per_chain_var.mean(0), per_chain_var.std(0) / math.sqrt(chains.shape[0])
    assert ((got_mean - mean).abs() < z * (se_mean**2 + sd**2 / ref_ess).sqrt()).all(), (
        got_mean,
        mean,
        se_mean,
    )
    assert ((got_var - sd**2).abs() < z * (se_var**2 + 2 * sd**4 / ref_ess).sqrt()).all(), (
        got_var,
        sd**2,
        se_var,
    )


def test_regression_matches_exact_abc_importance_sampling():
    # The paper's instance (n = 100, epsilon = 1) needs ~1000 iterations to forget the prior (IAT ~300): its
    # check is scripts/archive/validate_da_mcmc.py. Here n = 25 records at epsilon = 4 (the same Laplace scale
    # on s, a posterior as far from the prior: C2ST(prior, posterior) ~0.8), started from the prior.
    release = [-0.542, -0.0718, 0.0438, 0.1658, 0.2266, -0.2487, 0.3294, 0.1406, -0.2102]  # simulated, seed 0
    task = dpsbi.tasks.load("regression", epsilon=4.0, n=25, y_obs=release)
    reference = abc_is(task, 200_000, seed=1, progress=False)
    result = da_mcmc(task, 600, num_chains=512, burn_in=200, seed=0, progress=False)
    ref_mean = (reference.weights[:, None] * reference.samples).sum(0)
    ref_sd = (reference.weights[:, None] * (reference.samples - ref_mean) ** 2).sum(0).sqrt()
    assert reference.ess > 5000, reference.ess
    assert_matches(result.info["chains"], ref_mean, ref_sd, ref_ess=reference.ess)
    assert 0.9 < result.info["acceptance_rate"] < 1.0 and (result.info["rhat"] < 1.1).all()
    draws = result.samples[torch.randperm(result.samples.shape[0], generator=GEN(3))[:2000]]
    ref = reference.resample(2000, GEN(2))
    assert c2st(draws, ref) <= 0.6
    with seeded(4):
        assert c2st(task.prior.sample((2000,)), ref) > 0.7  # the check has power: the prior fails it


def test_naive_bayes_matches_exact_posterior():
    task = dpsbi.tasks.load("naive_bayes", epsilon=10.0)
    exact = task.exact_posterior(task.y_obs)
    mean, sd = exact.mean, exact.stddev
    result = da_mcmc(task, 200, num_chains=64, burn_in=50, seed=0, progress=False)
    assert_matches(result.info["chains"], mean, sd)
    assert 0.1 < result.info["acceptance_rate"] < 0.6
    with seeded(1):
        prior_sd = task.prior.sample((4000,)).std(0).double()
    assert (sd < prior_sd / 2).all()  # the release is informative, so matching it is not matching the prior


def test_record_models_reproduce_the_task_statistics():
    task = dpsbi.tasks.load("regression", epsilon=1.0)
    model = record_model(task)
    nb = dpsbi.tasks.load("naive_bayes", epsilon=10.0)
    nb_model = record_model(nb)
    with seeded(0):
        theta, theta_nb = task.prior.sample((3,)), nb.prior.sample((2,))
    assert torch.allclose(model.statistic(model.sample(theta, GEN(7))), task.simulate(theta, GEN(7)))
    records = model.sample(theta, GEN(7))
    shares = model.contribution(records)  # what DA-MCMC sums and updates record by record
    for m in (100, 40, 0):
        assert torch.allclose(model.statistic(records[:, :m]), shares[:, :m].sum(-2), atol=1e-6)
    records = nb_model.sample(theta_nb.repeat_interleave(2000, 0), GEN(8))
    counts = nb_model.statistic(records).reshape(2, 2000, -1) * nb_model.n
    assert torch.allclose(counts.sum(-1), torch.full((2, 2000), 200.0))  # n records x K features
    cond, pi = theta_nb[:, :8].reshape(2, 2, 2, 2), theta_nb[:, 8:]
    expected = nb_model.n * pi[:, :, None, None] * cond  # E n_ikj = n pi_i p_ikj
    se = counts.std(1) / math.sqrt(2000)
    assert ((counts.mean(1) - expected.reshape(2, -1)).abs() < 4 * se).all()


def test_prior_draws_and_conjugate_update():
    task = dpsbi.tasks.load("regression", epsilon=1.0)
    model = record_model(task)
    empty = torch.zeros(5000, 0, 3)
    draws = model.posterior_sample(empty, GEN(0))
    assert (draws.mean(0).abs() < 4 / math.sqrt(5000)).all() and ((draws.std(0) - 1).abs() < 0.05).all()
    records = model.sample(torch.tensor([[-1.79, -2.89, -0.66]]), GEN(1))
    design = torch.cat([torch.ones(100, 1), records[0, :, :2]], -1)
    precision = torch.eye(3) + design.T @ design / 2
    exact_mean = torch.linalg.solve(precision, design.T @ records[0, :, 2] / 2)
    post = model.posterior_sample(records.expand(4000, -1, -1), GEN(2))
    white = (post - exact_mean) @ torch.linalg.cholesky(precision)  # N(0, I) if the covariance is right
    assert (white.mean(0).abs() < 4 / math.sqrt(4000)).all()
    assert torch.allclose(white.T @ white / 4000, torch.eye(3), atol=4 * math.sqrt(2 / 4000))


def test_record_sweep_accepts_by_the_mechanism_ratio():
    mechanism = dpsbi.mechanisms.Laplace(1.0, sensitivity=1.0, dim=1)
    y = torch.zeros(1, 1)
    shares = torch.zeros(20000, 1, 1)
    accepted = record_sweep(mechanism, y, shares, shares + 0.7, GEN(0))
    assert abs(accepted.float().mean() - math.exp(-0.7)) < 4 * 0.5 / math.sqrt(20000)
    assert record_sweep(mechanism, y, shares + 0.7, shares, GEN(0)).all()


def test_rhat_flags_chains_that_disagree():
    """DA-MCMC's ``rhat`` is ArviZ's rank-normalized split R-hat (dpsbi.diagnostics; Gelman-Rubin's before)."""
    chains = torch.randn(8, 2000, 2, generator=GEN(0))
    assert ((rhat(chains) - 1).abs() < 0.01).all()
    shifted = chains + torch.arange(8.0).reshape(8, 1, 1)
    assert (rhat(shifted) > 2).all()
    task = dpsbi.tasks.load("naive_bayes", epsilon=10.0)
    result = da_mcmc(task, 40, num_chains=4, burn_in=10, seed=0, progress=False)
    assert set(result.info) >= {"iat", "ess", "ess_tail", "rhat"}
    assert torch.equal(result.info["rhat"], rhat(result.info["chains"]))


def test_clear_errors():
    with pytest.raises(ValueError, match="record-level model.*'poisson_counts'.*regression, naive_bayes"):
        da_mcmc(dpsbi.tasks.load("poisson_counts"), 10, progress=False)
    with pytest.raises(ValueError, match="does not reproduce task.simulate"):
        record_model(dpsbi.tasks.load("regression", epsilon=1.0, noise_var=1.0, y_obs="simulate"))
    with pytest.raises(ValueError, match="burn_in"):
        da_mcmc(dpsbi.tasks.load("regression", epsilon=1.0), 10, burn_in=10, progress=False)
    with pytest.raises(ValueError, match="not a release of its mechanism"):
        da_mcmc(dpsbi.tasks.load("sir_influenza"), 10, progress=False)
    with pytest.raises(ValueError, match="shape"):
        da_mcmc(dpsbi.tasks.load("naive_bayes", epsilon=10.0), 10, y=torch.zeros(1, 9), progress=False)


def test_records_with_the_tasks_own_constants():
    task = dpsbi.tasks.load("regression", epsilon=1.0, noise_var=1.0, y_obs="simulate")
    records = RegressionRecords.from_task(task, noise_var=1.0)
    result = da_mcmc(task, 20, num_chains=2, records=records, seed=0, progress=False)
    assert result.samples.shape == (2 * 15, 3) and result.info["chains"].shape == (2, 15, 3)
    assert result.num_simulations == 2 * 20
