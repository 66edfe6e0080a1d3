"""The torch elliptical slice sampler of dpsbi.inference.mcmc against exact targets (moments within 4 Monte
Carlo standard errors, from the draws' effective sample size), its seeding, its cost in sequential calls, and
SPLE end to end against the closed-form private posterior of the conjugate Gaussian toy."""

import math

import numpy as np
import pytest
import torch

import dpsbi
from dpsbi.diagnostics import ess
from dpsbi.inference import mcmc
from dpsbi.inference.mcmc import MCMCSettings, resample_init, slice_sample, slice_sample_groups
from dpsbi.metrics import c2st

D = torch.float64
TOLERANCE = 4.0  # Monte Carlo standard errors

# A correlated 3-d Gaussian (correlations 0.9, 0.3, 0.5; scales 1, 2, 3).
G_MEAN = torch.tensor([1.0, -2.0, 0.5], dtype=D)
G_COV = torch.tensor([[1.0, 1.8, 0.9], [1.8, 4.0, 3.0], [0.9, 3.0, 9.0]], dtype=D)
GAUSSIAN = torch.distributions.MultivariateNormal(G_MEAN, G_COV)

# A banana: x1 ~ N(0, 1), x2 | x1 ~ N(b (x1^2 - 1), 1), so E x = 0, Var x2 = 1 + 2 b^2, Cov(x1, x2) = 0.
B = 1.5


def banana(x):
    return -0.5 * x[:, 0] ** 2 - 0.5 * (x[:, 1] - B * (x[:, 0] ** 2 - 1)) ** 2


# Two overlapping Gaussians of weights 0.3 and 0.7 (bimodal but connected).
M_WEIGHTS = torch.tensor([0.3, 0.7], dtype=D)
M_MEANS = torch.tensor([[-1.5, -1.0], [1.5, 1.0]], dtype=D)
M_SD = 0.8


def mixture(x):
    return torch.logsumexp(M_WEIGHTS.log() - 0.5 * ((x[:, None, :] - M_MEANS) ** 2).sum(-1) / M_SD**2, -1)


M_MEAN = (M_WEIGHTS[:, None] * M_MEANS).sum(0)
M_COV = M_SD**2 * torch.eye(2, dtype=D) + torch.einsum(
    "k,ki,kj->ij", M_WEIGHTS, M_MEANS - M_MEAN, M_MEANS - M_MEAN
)

TARGETS = {
    "gaussian": (GAUSSIAN.log_prob, G_MEAN, G_COV),
    "banana": (banana, torch.zeros(2, dtype=D), torch.diag(torch.tensor([1.0, 1 + 2 * B**2], dtype=D))),
    "mixture": (mixture, M_MEAN, M_COV),
}


def start(log_density, dim: int, chains: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SPLE's start: ``chains`` of 1000 broad candidates resampled by density, and the candidates' spread."""
    generator = torch.Generator().manual_seed(seed)
    candidates = 4 * torch.randn(1000, dim, generator=generator, dtype=D)
    return resample_init(candidates, log_density(candidates), chains, generator), candidates.std(0)


def z_scores(draws: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> dict[str, float]:
    """(estimate - exact) / Monte Carlo standard error of every mean and covariance entry of ``draws (S, C, d)``;
    a standard error is ``sd / sqrt(ESS)`` of the quantity averaged (``x_i``, or ``(x_i - m_i)(x_j - m_j)``
    with the exact means), the ESS ArviZ's bulk one of the chains (``(C, S)``: ArviZ's layout)."""

    def z(values: torch.Tensor, exact: torch.Tensor) -> float:
        return float((values.mean() - exact) / (values.std() / ess(values.T).sqrt()))

    scores = {}
    dim = draws.shape[-1]
    for i in range(dim):
        scores[f"mean[{i}]"] = z(draws[..., i], mean[i])
        for j in range(i, dim):
            scores[f"cov[{i},{j}]"] = z((draws[..., i] - mean[i]) * (draws[..., j] - mean[j]), cov[i, j])
    return scores


@pytest.mark.parametrize("name", list(TARGETS))
def test_moments_match_the_exact_target_within_four_monte_carlo_errors(name):
    """Long chains (100 chains of 150 draws after 100 warm-up steps), so that the effective sample size, and
    with it the tolerance, is well estimated even for the banana's slowly mixing tail."""
    log_density, mean, cov = TARGETS[name]
    init, width = start(log_density, len(mean), 100, seed=1)
    info = {}
    draws = slice_sample(
        log_density,
        init,
        15_000,
        MCMCSettings(num_chains=100, warmup=100, thin=1),
        seed=2,
        width=width,
        info=info,
    )
    assert draws.shape == (15_000, len(mean)) and draws.dtype == D
    assert torch.equal(draws, info["draws"].reshape(-1, len(mean)))  # interleaved: row i from chain i % 100
    scores = z_scores(info["draws"], mean, cov)
    assert max(abs(v) for v in scores.values()) <= TOLERANCE, scores


def test_groups_sample_their_own_targets_in_the_sequential_calls_of_one():
    """Three Gaussians (the correlated one shifted by 3 g and scaled by g + 1) sampled as groups of one run:
    each group's moments within 4 Monte Carlo errors of its own target; the run makes at most twice the
    sequential calls of one group (1.46x here: with 300 chains a round evaluates one angle per chain, with 100
    three), with one host read per call (the count of chains still shrinking)."""
    shift = torch.arange(3, dtype=D)[:, None, None]
    means, trils = G_MEAN + 3 * shift[:, 0], (shift + 1) * torch.linalg.cholesky(G_COV)

    def log_density(x, group):  # x (n, k, 3) under group[i]'s Gaussian -> (n, k)
        gaussian = torch.distributions.MultivariateNormal(means[group, None], scale_tril=trils[group, None])
        return gaussian.log_prob(x)

    config = MCMCSettings(num_chains=100, warmup=100, thin=1)
    inits = [
        start(lambda x, g=g: log_density(x[:, None], torch.full((len(x),), g))[:, 0], 3, 100, seed=20 + g)
        for g in range(3)
    ]
    init, width = torch.stack([i for i, _ in inits]), inits[0][1]
    info, alone = {}, {}
    draws = slice_sample_groups(log_density, init, 15_000, config, seed=21, width=4 * width, info=info)
    assert draws.shape == (15_000, 3, 3) and info["draws"].shape == (150, 3, 100, 3)
    for g in range(3):
        assert torch.equal(draws[:, g], info["draws"][:, g].reshape(-1, 3))
        scores = z_scores(info["draws"][:, g], means[g], trils[g] @ trils[g].T)
        assert max(abs(v) for v in scores.values()) <= TOLERANCE, (g, scores)
    slice_sample_groups(log_density, init[:1], 15_000, config, seed=21, width=4 * width, info=alone)
    assert info["calls"] <= 2 * alone["calls"] and info["host_reads"] == info["calls"], (info, alone)


def test_on_a_gpu_a_shrinkage_round_gives_the_chains_left_the_first_rounds_rows(monkeypatch):
    """``rows_per_round``: a few hundred rows a round on a CPU, every chain's one row elsewhere (a GPU, where a
    call's cost hardly grows with its rows and each round is a host read). With that rule (forced here on the
    CPU), 20 groups of 100 chains sample their own targets (moments within 4 Monte Carlo errors) in a third fewer
    sequential calls and host reads than by the CPU rule (343 against 493; 220 against 647 at 200 groups of 500),
    for at most twice its evaluations."""
    assert mcmc.rows_per_round(torch.device("cpu"), 10_000) == mcmc.MIN_ROWS
    assert mcmc.rows_per_round(torch.device("cuda"), 10_000) == 10_000
    assert mcmc.rows_per_round(torch.device("cuda"), 100) == mcmc.MIN_ROWS
    shift = torch.arange(20, dtype=D)[:, None, None] / 4
    tril = torch.linalg.cholesky(G_COV)

    def log_density(x, group):
        return torch.distributions.MultivariateNormal(G_MEAN + shift[group], scale_tril=tril).log_prob(x)

    init = G_MEAN + 3 * torch.randn(20, 100, 3, dtype=D, generator=torch.Generator().manual_seed(3))
    config = MCMCSettings(num_chains=100, warmup=60, thin=1)
    cpu = {}
    slice_sample_groups(log_density, init, 5000, config, seed=4, width=4.0, info=cpu)
    monkeypatch.setattr(mcmc, "rows_per_round", lambda device, chains: max(mcmc.MIN_ROWS, chains))
    gpu = {}
    slice_sample_groups(log_density, init, 5000, config, seed=4, width=4.0, info=gpu)
    assert 3 * gpu["calls"] < 2.25 * cpu["calls"] and gpu["host_reads"] == gpu["calls"], (gpu, cpu)
    assert gpu["evaluations"] <= 2 * cpu["evaluations"], (gpu, cpu)
    for g in range(20):
        scores = z_scores(gpu["draws"][:, g], G_MEAN + shift[g, 0], G_COV)
        assert max(abs(v) for v in scores.values()) <= TOLERANCE, (g, scores)


def test_default_settings_give_nearly_independent_gaussian_draws_in_few_calls():
    """2000 draws with the defaults (4 per chain of 500): chains that agree (R-hat), most updates accepted at
    their first proposal, and ~165 sequential calls of the density (sbi's numpy slice sampler makes ~2600 for
    its default 100 chains). The same chains run on to 20 draws each (ArviZ's ESS needs 10 or more; the 2000
    draws are their first 4): moments within 4 MC errors and an effective sample size close to the number of
    draws."""
    init, width = start(GAUSSIAN.log_prob, 3, MCMCSettings().num_chains, seed=3)
    info, long = {}, {}
    draws = slice_sample(GAUSSIAN.log_prob, init, 2000, MCMCSettings(), seed=4, width=width, info=info)
    assert draws.shape == (2000, 3) and info["draws"].shape == (4, 500, 3)
    # Split R-hat on chains of 4 draws reads ~1.05-1.08 even for nearly independent draws; 1.01-1.02 at 20.
    assert (info["rhat"] < 1.1).all() and info["ess"].isnan().all(), info  # too short for an ESS
    assert info["first_accept"] >= 0.8
    assert info["calls"] <= 200 and info["evaluations_per_update"] <= 3
    slice_sample(GAUSSIAN.log_prob, init, 10_000, MCMCSettings(), seed=4, width=width, info=long)
    assert torch.equal(long["draws"][:4], info["draws"])
    scores = z_scores(long["draws"], G_MEAN, G_COV)
    assert max(abs(v) for v in scores.values()) <= TOLERANCE, scores
    assert (long["ess"] >= 0.5 * 10_000).all() and (long["rhat"] < 1.03).all(), (long["ess"], long["rhat"])


def test_chains_started_at_one_far_point_converge_during_warm_up():
    """A degenerate start (every chain at one point, 3 sd from the mean in two coordinates): the first,
    prior-wide fit spreads the chains, whose covariance then shapes the later fits."""
    init = torch.tensor([[4.0, 4.0, 4.0]], dtype=D).expand(500, 3)
    info = {}
    slice_sample(GAUSSIAN.log_prob, init, 10_000, MCMCSettings(), seed=5, width=4.0, info=info)
    scores = z_scores(info["draws"], G_MEAN, G_COV)
    assert max(abs(v) for v in scores.values()) <= TOLERANCE, scores
    assert (info["rhat"] < 1.03).all(), info["rhat"]


def test_draws_depend_on_the_seed_only():
    init, width = start(banana, 2, 50, seed=6)
    config = MCMCSettings(num_chains=50, warmup=10)
    torch.manual_seed(0)
    np.random.seed(0)
    first = slice_sample(banana, init, 200, config, seed=7, width=width)
    torch.manual_seed(1)
    torch.rand(100)
    np.random.seed(1)
    state = torch.get_rng_state()
    again = slice_sample(banana, init.clone(), 200, config, seed=7, width=width)
    assert torch.equal(first, again)
    assert torch.equal(state, torch.get_rng_state())  # torch's global stream is neither used nor moved
    assert not torch.equal(first, slice_sample(banana, init, 200, config, seed=8, width=width))


def test_effective_sample_size_of_independent_and_autocorrelated_chains():
    """ArviZ's bulk ESS (dpsbi.diagnostics.ess) on 50 chains of 400 draws, in ArviZ's (chain, draw) layout."""
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(50, 400, generator=generator, dtype=D)
    assert abs(float(ess(noise)) / noise.numel() - 1) < 0.15
    rho, ar = (
        0.8,
        torch.empty_like(noise),
    )  # AR(1) chains started at stationarity: ESS = n (1 - rho) / (1 + rho)
    ar[:, 0] = noise[:, 0]
    for t in range(1, noise.shape[1]):
        ar[:, t] = rho * ar[:, t - 1] + math.sqrt(1 - rho**2) * noise[:, t]
    assert abs(float(ess(ar)) / (noise.numel() * (1 - rho) / (1 + rho)) - 1) < 0.25
    # Chains stuck at different values: their disagreement counts as correlation.
    stuck = torch.randn(50, 1, generator=generator, dtype=D).expand(50, 400) + 0.01 * noise
    assert float(ess(stuck)) < 100
    assert ess(noise[:, :9, None]).isnan().all()  # too few draws per chain for ArviZ's estimator


def test_settings_of_older_posterior_files_still_load_and_sample_with_sbi():
    legacy = MCMCSettings.coerce(
        {"method": "slice_np_vectorized", "num_chains": 100, "thin": 2, "warmup": 50, "init_candidates": 1000}
    )
    assert legacy.to_dict() == {
        "method": "slice_np_vectorized",
        "num_chains": 100,
        "thin": 2,
        "warmup": 50,
        "init_candidates": 1000,
    }
    assert MCMCSettings().method == "elliptical_slice"
    init, width = start(GAUSSIAN.log_prob, 3, 10, seed=8)
    config = MCMCSettings(method="slice_np_vectorized", num_chains=10, warmup=5)
    info = {}
    draws = slice_sample(GAUSSIAN.log_prob, init, 40, config, seed=9, width=width, info=info)
    assert draws.shape == (40, 3) and torch.isfinite(draws).all() and info["draws"].shape == (4, 10, 3)
    assert torch.equal(draws, slice_sample(GAUSSIAN.log_prob, init, 40, config, seed=9, width=width))
    with pytest.raises(ValueError, match="unknown MCMC method"):
        MCMCSettings(method="hmc")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_chains_run_on_the_device_of_their_start():
    init, width = start(GAUSSIAN.log_prob, 3, 500, seed=10)
    info = {}
    target = torch.distributions.MultivariateNormal(G_MEAN.cuda(), G_COV.cuda())
    draws = slice_sample(
        target.log_prob, init.cuda(), 10_000, MCMCSettings(), seed=11, width=width.cuda(), info=info
    )  # 20 draws a chain: ArviZ's ESS, and so the z-scores, are NaN below 10
    assert draws.device.type == "cuda"
    scores = z_scores(info["draws"].cpu(), G_MEAN, G_COV)
    assert max(abs(v) for v in scores.values()) <= TOLERANCE, scores


def test_sple_matches_the_exact_private_posterior_in_one_round():
    task = dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0, noise_sd=0.3)
    posterior = dpsbi.SPLE(
        task,
        rounds=1,
        sims_per_round=400,
        inner_samples=8,
        flow=dict(transforms=2, hidden=32),
        training=dict(max_epochs=30, patience=5),
        progress=False,
    ).run()
    torch.manual_seed(0)
    exact = task.exact_posterior(task.y_obs).sample((1000,))
    assert c2st(posterior.sample((1000,), seed=0), exact) <= 0.6


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("num_chains", 2.7, ValueError),
        ("thin", 1.5, ValueError),
        ("warmup", 0.5, ValueError),
        ("num_chains", True, TypeError),
        ("num_chains", "5", TypeError),
        ("warmup", -1, ValueError),
    ],
)
def test_mcmc_counts_are_whole_numbers_named_at_construction(field, value, error):
    """num_chains=2.7 built an SPLE fit whose sampling failed after training; thin=1.5 and warmup=0.5 passed."""
    with pytest.raises(error, match=rf"^mcmc {field} must be "):
        MCMCSettings(**{field: value})
