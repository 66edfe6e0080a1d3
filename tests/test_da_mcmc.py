"""Data-augmentation MCMC (Ju et al. 2022) against exact private posteriors: exact ABC importance sampling
on regression, exact enumeration of the latent counts on naive Bayes."""

import math

import pytest
import torch

import dpsbi
from dpsbi.baselines.da_mcmc import chain_diagnostics, da_mcmc, gelman_rubin, record_sweep
from dpsbi.baselines.exact_abc import abc_is, seeded
from dpsbi.baselines.records import NaiveBayesRecords, RegressionRecords, record_model
from dpsbi.metrics import c2st

GEN = lambda seed=0: torch.Generator().manual_seed(seed)  # noqa: E731


def log_dirichlet_multinomial(counts: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``log DirMult(counts | alpha)`` over the last dim (total = counts.sum(-1))."""
    total, lg = counts.sum(-1), torch.lgamma
    return (lg(total + 1) - lg(counts + 1).sum(-1) + lg(alpha + counts).sum(-1) - lg(total + alpha.sum(-1))
            + lg(alpha.sum(-1)) - lg(alpha).sum(-1))


def naive_bayes_exact_moments(task, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact posterior mean and sd ``(10,)`` of the 2-class, binary-feature naive Bayes task under Laplace noise:
    the latent counts are summed out exactly (class count ``n_1 = 0..n``, then each class-feature block's
    ``n_ik1 = 0..n_i`` independently), each count table contributing its Dirichlet moments."""
    model = NaiveBayesRecords.from_task(task)
    n, (classes, features, values) = model.n, model.cond_concentration.shape
    assert (classes, values) == (2, 2)
    opts = dict(dtype=torch.float64)
    yn = y.to(**opts).reshape(classes, features, values) * n
    scale = task.mechanism.scale * n
    grid = torch.arange(n + 1, **opts)
    n_class = torch.stack([grid, n - grid], -1)  # (n+1, 2): n_1, n_2 for every n_1
    a = grid[:, None, None, None]  # n_ik1, (n+1, 1, 1, 1) against n_i (1, n+1, I, 1)
    n_i = n_class[None, :, :, None]
    table = torch.stack([a.expand(-1, n + 1, classes, features), (n_i - a).expand(-1, -1, -1, features)], -1)
    alpha = model.cond_concentration.to(**opts)
    log_w = log_dirichlet_multinomial(table.clamp(min=0), alpha) - (table - yn).abs().sum(-1) / scale
    log_w = torch.where((a <= n_i).expand_as(log_w), log_w, -math.inf)  # (a, n_1, I, K)
    log_block = torch.logsumexp(log_w, 0)  # (n_1, I, K)
    alpha_pi = model.class_concentration.to(**opts)
    weight_class = torch.softmax(log_dirichlet_multinomial(n_class, alpha_pi) + log_block.sum((-1, -2)), 0)
    weight_cell = torch.softmax(log_w, 0) * weight_class[:, None, None]  # joint over (a, n_1) per block

    def dirichlet_moments(first, total, weights, dims):
        m1 = (weights * first / total).sum(dims)
        m2 = (weights * first * (first + 1) / (total * (total + 1))).sum(dims)
        return m1, (m2 - m1**2).sqrt()

    mean_p, sd_p = dirichlet_moments(alpha[..., 0] + a, alpha.sum(-1) + n_i, weight_cell, (0, 1))  # (I, K)
    mean_pi, sd_pi = dirichlet_moments(alpha_pi + n_class, alpha_pi.sum() + n, weight_class[:, None], 0)
    mean = torch.cat([torch.stack([mean_p, 1 - mean_p], -1).flatten(), mean_pi])
    sd = torch.cat([torch.stack([sd_p, sd_p], -1).flatten(), sd_pi])
    return mean, sd


def assert_matches(chains: torch.Tensor, mean: torch.Tensor, sd: torch.Tensor, ref_ess: float = math.inf, z: float = 4.0):
    """Mean and variance of independent ``chains (C, T, d)`` within ``z`` Monte Carlo errors of the reference's,
    the errors estimated from the spread between chains (plus the reference's own, from its ESS)."""
    chains, mean, sd = chains.double(), mean.double(), sd.double()
    per_chain = chains.mean(1)
    got_mean, se_mean = per_chain.mean(0), per_chain.std(0) / math.sqrt(chains.shape[0])
    per_chain_var = ((chains - got_mean) ** 2).mean(1)
    got_var, se_var = per_chain_var.mean(0), per_chain_var.std(0) / math.sqrt(chains.shape[0])
    assert ((got_mean - mean).abs() < z * (se_mean**2 + sd**2 / ref_ess).sqrt()).all(), (got_mean, mean, se_mean)
    assert ((got_var - sd**2).abs() < z * (se_var**2 + 2 * sd**4 / ref_ess).sqrt()).all(), (got_var, sd**2, se_var)


def test_regression_matches_exact_abc_importance_sampling():
    # The paper's instance (n = 100, epsilon = 1) needs ~1000 iterations to forget the prior (IAT ~300): its
    # check is scripts/validate_da_mcmc.py. Here n = 25 records at epsilon = 4 (the same Laplace scale on s, a
    # posterior as far from the prior: C2ST(prior, posterior) ~0.8), started from the prior.
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
    mean, sd = naive_bayes_exact_moments(task, task.y_obs)
    result = da_mcmc(task, 200, num_chains=64, burn_in=50, seed=0, progress=False)
    assert_matches(result.info["chains"], mean, sd)
    assert 0.1 < result.info["acceptance_rate"] < 0.6
    with seeded(1):
        prior_sd = task.prior.sample((4000,)).std(0).double()
    assert (sd < prior_sd / 2).all()  # the release is informative, so matching it is not matching the prior


def test_naive_bayes_exact_oracle_agrees_with_abc_importance_sampling():
    release = [0.5333, 0.3867, 0.6302, 0.2461, 0.1757, 0.0523, 0.1347, 0.084]  # simulated, seed 4
    task = dpsbi.tasks.load("naive_bayes", epsilon=1.0, y_obs=release)
    mean, sd = naive_bayes_exact_moments(task, task.y_obs)
    reference = abc_is(task, 300_000, seed=5, progress=False)
    ref_mean = (reference.weights[:, None] * reference.samples).sum(0).double()
    assert reference.ess > 300
    assert ((ref_mean - mean).abs() < 4 * sd / math.sqrt(reference.ess)).all(), (ref_mean, mean)


def test_record_models_reproduce_the_task_statistics():
    task = dpsbi.tasks.load("regression", epsilon=1.0)
    model = record_model(task)
    nb = dpsbi.tasks.load("naive_bayes", epsilon=10.0)
    nb_model = record_model(nb)
    with seeded(0):
        theta, theta_nb = task.prior.sample((3,)), nb.prior.sample((2,))
    assert torch.allclose(model.statistic(model.sample(theta, GEN(7))), task.simulate(theta, GEN(7)))
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


def test_gelman_rubin_flags_chains_that_disagree():
    chains = torch.randn(8, 2000, 2, generator=GEN(0))
    assert ((gelman_rubin(chains) - 1).abs() < 0.01).all()
    shifted = chains + torch.arange(8.0).reshape(8, 1, 1)
    assert (gelman_rubin(shifted) > 2).all()
    assert set(chain_diagnostics(chains)) == {"iat", "ess", "rhat"}


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
