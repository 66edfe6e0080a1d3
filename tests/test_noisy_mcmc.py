"""MCMC for noisy statistics (Alparslan & Yildirim): exactness against closed-form posteriors, mixing,
integrated autocorrelation time, Fisher-information estimators, smooth sensitivity and the paper's tasks."""

import dataclasses
import math

import pytest
import torch
from scipy.signal import lfilter
from scipy.stats import ks_2samp

from dpsbi.baselines.fisher import (
    clt_fisher_information,
    fisher_information,
    fisher_records_is,
    fisher_sequential_is,
    fisher_summary_is,
    rank_statistics,
)
from dpsbi.baselines.mcmc_clt import mh_clt
from dpsbi.baselines.mhaar import mhaar
from dpsbi.baselines.pmmh import pmmh
from dpsbi.diagnostics import ess, integrated_autocorrelation_time
from dpsbi.mechanisms import Gaussian
from dpsbi.mechanisms.smooth_laplace import (
    SmoothSensitivityLaplace,
    smooth_sensitivity_max,
    smooth_sensitivity_median,
)
from dpsbi.tasks import load
from dpsbi.tasks.binary_responses import fisher_information_formula
from dpsbi.tasks.latent import GaussianCLT, PoissonCount, ReparameterizedRecords

GEN = lambda seed=0: torch.Generator().manual_seed(seed)  # noqa: E731


pytestmark = pytest.mark.usefixtures("float64")


def assert_matches_exact(result, exact, seed: int = 0) -> None:
    """Mean and sd within 4 Monte Carlo standard errors (effective sample size from the chains' IAT), and a
    KS test of the chains thinned by 2 IAT against exact draws."""
    draws = result.samples[:, 0]
    iat = float(result.info["iat"][0])
    n_eff = draws.numel() / iat
    reference = exact.sample((40000,))[:, 0]
    mean, sd = float(exact.mean.reshape(-1)[0]), float(exact.stddev.reshape(-1)[0])
    kurtosis = float(((reference - mean) ** 4).mean() / sd**4)
    assert abs(float(draws.mean()) - mean) < 4 * sd / math.sqrt(n_eff), (float(draws.mean()), mean, iat)
    assert abs(float(draws.std()) - sd) < 4 * sd * math.sqrt((kurtosis - 1) / (4 * n_eff)), (
        float(draws.std()),
        sd,
        iat,
    )
    thinned = result.info["chains"][:, :: math.ceil(2 * iat), 0].reshape(-1)
    assert ks_2samp(thinned.numpy(), reference.numpy()).pvalue > 1e-3


# --- integrated autocorrelation time -------------------------------------------------------------------


def test_iat_of_ar1_chains_matches_closed_form():
    """The integrated autocorrelation time that ArviZ's bulk ESS implies (dpsbi.diagnostics; Sokal's adaptive
    window estimator before), on AR(1) chains ``(C, T, 1)``: ``(1 + rho) / (1 - rho)``."""
    rho, chains, length = 0.9, 8, 20000
    gen = GEN(1)
    noise = torch.randn(chains, length, generator=gen)
    noise[:, 0] /= math.sqrt(1 - rho**2)  # stationary start
    x = torch.as_tensor(lfilter([1.0], [1.0, -rho], noise.numpy(), axis=1))
    tau, expected = integrated_autocorrelation_time(x[..., None]), (1 + rho) / (1 - rho)
    # Sokal's bound: Var(tau_hat) ~ 2 (2M + 1) tau^2 / (C T) with window M ~ 5 tau.
    sd = expected * math.sqrt(2 * (2 * 5 * expected + 1) / (chains * length))
    assert tau.shape == (1,) and abs(float(tau) - expected) < 4 * sd, (float(tau), expected, sd)
    white = integrated_autocorrelation_time(noise[:1, 1:, None])
    assert abs(float(white) - 1.0) < 4 * math.sqrt(2 * 11 / length)
    assert ess(x[..., None]).item() == pytest.approx(chains * length / float(tau))
    with pytest.raises(ValueError, match="chains must have shape"):
        integrated_autocorrelation_time(torch.ones(2, 2, 2, 2))


# --- smooth sensitivity --------------------------------------------------------------------------------


def _brute_median(v: list, beta: float, upper: float) -> float:
    n, s = len(v), [0.0] + sorted(v) + [upper]
    m, at = (n + 1) // 2, lambda i: s[min(max(i, 0), n + 1)]
    return max(
        math.exp(-k * beta) * max(at(m + t) - at(m + t - k - 1) for t in range(k + 2)) for k in range(n + 1)
    )


def _brute_max(v: list, beta: float, upper: float) -> float:
    n, s = len(v), [0.0] + sorted(v)
    at = lambda i: s[max(i, 0)]  # noqa: E731
    return max(math.exp(-k * beta) * max(upper - at(n - k), at(n) - at(n - k - 1)) for k in range(n + 1))


@pytest.mark.parametrize("n", [1, 2, 5, 10, 11, 40])
def test_smooth_sensitivity_matches_the_definition(n):
    values = 10 * torch.rand(6, n, generator=GEN(n)) ** 2
    values[0] = 5.0  # ties: zero local gaps
    for beta in (0.05, 0.25, 2.0):
        median = torch.tensor([_brute_median(v.tolist(), beta, 10.0) for v in values])
        maximum = torch.tensor([_brute_max(v.tolist(), beta, 10.0) for v in values])
        assert torch.allclose(smooth_sensitivity_median(values, beta, 10.0), median)
        assert torch.allclose(smooth_sensitivity_max(values, beta, 10.0), maximum)


def test_smooth_sensitivity_laplace_mechanism():
    mech = SmoothSensitivityLaplace(5.0, 1e-4, upper=10.0, n=11, statistic="median")
    assert mech.input_dim == 2 and mech.dim == 1 and mech.alpha == 2.5
    assert mech.beta == pytest.approx(5 / (2 * math.log(2e4)))
    values = 10 * torch.rand(4, 11, generator=GEN())
    s = mech.summarize(values)
    assert torch.equal(s[:, 0], values.sort(-1).values[:, 5])
    assert torch.allclose(s[:, 1], smooth_sensitivity_median(values, mech.beta, 10.0))
    y = mech.sample(s, generator=GEN(1))
    laplace = torch.distributions.Laplace(s[:, :1], s[:, 1:] / mech.alpha)
    assert torch.allclose(mech.log_prob(y, s), laplace.log_prob(y)[:, 0])
    assert torch.equal(mech.sample(s, u=torch.full((4, 1), 0.5)), s[:, :1])
    assert (mech.max_log_prob(y) >= mech.log_prob(y, s)).all()
    with pytest.raises(ValueError, match="unknown statistic"):
        SmoothSensitivityLaplace(5.0, 1e-4, 10.0, 11, statistic="mean")
    with pytest.raises(ValueError, match="expected 11 values"):
        mech.summarize(values[:, :5])
    with pytest.raises(ValueError, match="last dimension 2"):
        mech.sample(s[:, :1])


# --- tasks ---------------------------------------------------------------------------------------------


def test_normal_variance_variants_and_errors():
    laplace = load("normal_variance", power=2, epsilon=1.0)
    assert laplace.mechanism.scale == pytest.approx(100 / 100)  # A^a / (n eps)
    assert (
        isinstance(laplace.summary_model, GaussianCLT)
        and laplace.prior.support.check(torch.tensor([99.0])).all()
    )
    gauss = load("normal_variance", power=1, noise="gaussian", epsilon=2.0)
    assert gauss.mechanism.sigma == pytest.approx(10 / (100 * 2))
    seq = load("normal_variance", release="sequential")
    assert (
        seq.y_obs.shape == (1, 100)
        and seq.mechanism.scale == pytest.approx(10 / 5)
        and seq.record_model.sequential
    )
    for statistic in ("median", "max"):
        task = load("normal_variance", statistic=statistic)
        assert task.mechanism.delta == pytest.approx(1e-4) and task.summary_model is None
        assert task.simulate(torch.tensor([[2.0], [3.0]]), GEN()).shape == (2, 2)
    # The CLT moments of |x|^a match simulated records.
    s = load("normal_variance", power=2).simulate(torch.full((4000, 1), 2.0), GEN(2))
    mean, var = laplace.summary_model.mean_cov(torch.tensor([2.0]))
    assert abs(float(s.mean()) - float(mean)) < 4 * math.sqrt(float(var) / 4000)
    with pytest.raises(ValueError, match="sequential release"):
        load("normal_variance", statistic="median", release="sequential")
    with pytest.raises(ValueError, match="smooth-sensitivity Laplace"):
        load("normal_variance", statistic="max", noise="gaussian")
    with pytest.raises(ValueError, match="unknown statistic"):
        load("normal_variance", statistic="mode")
    with pytest.raises(ValueError, match="unknown mechanism"):
        load("binary_responses", mechanism="coin")


@pytest.mark.parametrize("mechanism", ["randomized_response", "gaussian_local", "noisy_mean"])
def test_binary_exact_posterior_matches_quadrature(mechanism):
    task = load("binary_responses", mechanism=mechanism, epsilon=1.0)
    y, n = task.y_obs[0], 100
    theta = ((torch.arange(20000) + 0.5) / 20000)[:, None]  # midpoint rule: the density need not vanish at 0
    if mechanism == "randomized_response":
        tau = (theta * math.exp(1.0) + 1 - theta) / (1 + math.exp(1.0))
        log_lik = y.sum() * tau.log() + (n - y.sum()) * (1 - tau).log()
    elif mechanism == "gaussian_local":
        normal = lambda mu: torch.distributions.Normal(mu, 1.0).log_prob(y).exp()  # noqa: E731
        log_lik = (theta * normal(1.0) + (1 - theta) * normal(0.0)).log().sum(-1, keepdim=True)
    else:
        j = torch.arange(n + 1.0)
        binom = torch.distributions.Binomial(n, probs=theta).log_prob(j)
        log_lik = torch.logsumexp(
            binom + torch.distributions.Normal(j / n, 1 / n).log_prob(y), -1, keepdim=True
        )
    w = torch.softmax(log_lik[:, 0], 0)
    mean = (w * theta[:, 0]).sum()
    sd = ((w * (theta[:, 0] - mean) ** 2).sum()).sqrt()
    exact = task.exact_posterior(task.y_obs)
    assert float(exact.mean) == pytest.approx(float(mean), abs=1e-6)
    assert float(exact.stddev) == pytest.approx(float(sd), abs=1e-6)


# --- MCMC: exactness -----------------------------------------------------------------------------------


def test_pmmh_matches_exact_poisson_posterior():
    task = load("poisson_counts", epsilon=0.2)
    result = pmmh(task, 1200, 16, 0.3, theta0=[30.0], num_chains=16, generator=GEN(3), progress=False)
    assert result.samples.shape == (16 * 900, 1) and result.num_simulations == 16 * 1201 * 16
    assert 0.2 < result.info["acceptance_rate"] < 0.9 and result.info["chains"].shape == (16, 900, 1)
    assert_matches_exact(result, task.exact_posterior(task.y_obs))


def test_mhaar_summary_mode_matches_exact_poisson_posterior():
    task = load("poisson_counts", epsilon=0.2)
    result = mhaar(
        task,
        1200,
        4,
        0.3,
        theta0=[30.0],
        model=PoissonCount(),
        num_chains=16,
        generator=GEN(4),
        progress=False,
    )
    assert result.info["mode"] == "summary" and result.info["num_particles"] == 4
    assert_matches_exact(result, task.exact_posterior(task.y_obs))


@pytest.mark.parametrize("subset_size", [None, 10])
def test_mhaar_records_mode_matches_exact_binary_posterior(subset_size):
    task = load("binary_responses", mechanism="noisy_mean", epsilon=1.0)
    result = mhaar(
        task,
        1200,
        4,
        0.3,
        theta0=[0.3],
        mode="records",
        subset_size=subset_size,
        num_chains=16,
        generator=GEN(5),
        progress=False,
    )
    assert result.info["mode"] == "records" and result.info["subset_size"] == subset_size
    assert_matches_exact(result, task.exact_posterior(task.y_obs))


def test_mhaar_sequential_mode_matches_exact_randomized_response_posterior():
    task = load("binary_responses", mechanism="randomized_response", epsilon=1.0)
    result = mhaar(task, 1000, 4, 0.5, theta0=[0.3], num_chains=16, generator=GEN(6), progress=False)
    assert result.info["mode"] == "sequential"
    assert_matches_exact(result, task.exact_posterior(task.y_obs))


def test_mh_clt_matches_quadrature_of_the_clt_posterior():
    task = load("normal_variance", power=2, noise="gaussian", epsilon=5.0)
    result = mh_clt(task, 1500, 0.15, theta0=[2.0], num_chains=16, generator=GEN(7), progress=False)
    theta = torch.linspace(1e-4, 8.0, 40001)
    mean, cov = task.summary_model.mean_cov(theta[:, None])
    log_post = torch.distributions.Normal(
        mean[:, 0], (cov[:, 0, 0] + task.mechanism.sigma**2).sqrt()
    ).log_prob(task.y_obs[0, 0])
    w = torch.softmax(log_post, 0)
    grid_mean = (w * theta).sum()
    grid_sd = (w * (theta - grid_mean) ** 2).sum().sqrt()
    draws, iat = result.samples[:, 0], float(result.info["iat"][0])
    assert result.num_simulations == 0
    assert abs(float(draws.mean() - grid_mean)) < 4 * float(grid_sd) * math.sqrt(iat / draws.numel())
    assert abs(float(draws.std() - grid_sd)) < 4 * float(grid_sd) * math.sqrt(iat / draws.numel())


# --- MCMC: mixing --------------------------------------------------------------------------------------


def test_mhaar_mixes_better_than_pmmh_at_small_n():
    """The paper's Sec. 5.3 (Table 3): normal variance, |x|, Laplace, epsilon = 5, CLT summary law, N = 2."""
    task = load("normal_variance", power=1, epsilon=5.0)
    kwargs = dict(theta0=[2.0], model=task.summary_model, num_chains=32, progress=False)
    taus = {}
    for name, run in (("pmmh", pmmh), ("mhaar", mhaar)):
        result = run(task, 1600, 2, 0.3, generator=GEN(8), **kwargs)
        chains = result.info["chains"]
        tau = float(result.info["iat"][0])
        # Sokal's standard error of tau with window ~ 5 tau over all chains' draws.
        taus[name] = (tau, tau * math.sqrt(2 * (10 * tau + 1) / chains[..., 0].numel()))
    (tau_p, se_p), (tau_m, se_m) = taus["pmmh"], taus["mhaar"]
    assert tau_p - tau_m > 4 * math.hypot(se_p, se_m), taus


# --- Fisher information --------------------------------------------------------------------------------


def test_clt_fisher_information_matches_closed_forms():
    theta = torch.tensor([0.25])
    binary = load("binary_responses", mechanism="noisy_mean", epsilon=1.0)
    model = GaussianCLT(lambda t: (t, (t * (1 - t))[..., None]), 100)
    f3 = clt_fisher_information(model, binary.mechanism, theta)
    assert float(f3.information) == pytest.approx(
        float(fisher_information_formula(theta, 1.0, 100, "noisy_mean"))
    )
    # Ex. 2 with a = 1: mu = sqrt(2 theta / pi), Sigma = theta (1 - 2 / pi), H = Sigma / n + sigma^2.
    task = load("normal_variance", power=1, noise="gaussian", epsilon=1.0)
    t, n, sigma2 = 2.0, 100, task.mechanism.sigma**2
    h = t * (1 - 2 / math.pi) / n + sigma2
    expected = 1 / (2 * math.pi * t) / h + ((1 - 2 / math.pi) / n) ** 2 / (2 * h**2)
    estimate = fisher_information(task)
    assert estimate.method == "clt" and float(estimate.information) == pytest.approx(expected, rel=1e-10)


def test_fisher_alg1_matches_closed_form_for_gaussian_summary_and_noise():
    task = load("normal_variance", power=2, noise="gaussian", epsilon=1.0)
    exact = float(clt_fisher_information(task.summary_model, task.mechanism, torch.tensor([2.0])).information)
    estimate = fisher_summary_is(
        task.summary_model, task.mechanism, torch.tensor([2.0]), 4000, 256, generator=GEN(9)
    )
    assert estimate.method == "summary" and abs(float(estimate.information) - exact) < 4 * float(
        estimate.stderr
    )


@dataclasses.dataclass
class NormalMeanRecords(ReparameterizedRecords):
    """Test model: ``x_t ~ N(theta, 1)``, summary the mean; with Gaussian noise ``F = 1 / (1/n + sigma^2)``."""

    n: int = 20

    def latent(self, shape, like, generator=None):
        return torch.randn(shape + (1,), generator=generator, dtype=like.dtype)

    def records(self, z, theta):
        return theta[..., None, :] + z

    def log_prob(self, x, theta):
        return torch.distributions.Normal(theta[..., None, :], 1.0).log_prob(x).squeeze(-1)

    def values(self, x):
        return x.squeeze(-1)

    def summarize(self, values):
        return values.mean(-1, keepdim=True)


def test_fisher_alg2_matches_closed_form_for_normal_mean():
    mechanism = Gaussian.gdp(10.0, 1.0)  # sigma = 0.1
    estimate = fisher_records_is(
        NormalMeanRecords(), mechanism, torch.tensor([0.5]), 2000, 128, generator=GEN(10)
    )
    exact = 1 / (1 / 20 + 0.01)
    assert abs(float(estimate.information) - exact) < 4 * float(estimate.stderr), (estimate, exact)


def test_fisher_alg3_matches_randomized_response_closed_form():
    task = load("binary_responses", mechanism="randomized_response", epsilon=1.0)
    estimate = fisher_sequential_is(
        task.record_model, task.mechanism, torch.tensor([0.25]), 4000, 256, generator=GEN(11)
    )
    exact = float(fisher_information_formula(torch.tensor(0.25), 1.0, 100, "randomized_response"))
    assert abs(float(estimate.information) - exact) < 4 * float(estimate.stderr), (estimate, exact)
    assert fisher_information(task, num_releases=8, num_inner=8).method == "sequential"


def test_rank_statistics_follows_the_privacy_level():
    """Ex. 2 / Sec. 5.1: |x| is the better statistic for the normal variance under privacy, x^2 without."""
    candidates = {
        f"|x|^{a}": (lambda e, a=a: load("normal_variance", epsilon=e, power=a, noise="gaussian"))
        for a in (1, 2)
    }
    assert [name for name, _ in rank_statistics(candidates, 1.0)] == ["|x|^1", "|x|^2"]
    assert [name for name, _ in rank_statistics(candidates, 100.0)] == ["|x|^2", "|x|^1"]
    with pytest.raises(ValueError, match="at least one"):
        rank_statistics({}, 1.0)


# --- errors --------------------------------------------------------------------------------------------


def test_clear_errors():
    poisson = load("poisson_counts")
    with pytest.raises(ValueError, match="not a release of its mechanism"):
        pmmh(dataclasses.replace(poisson, release_from_mechanism=False), 10, 2, 0.1, progress=False)
    with pytest.raises(ValueError, match="Gaussian mechanism"):
        mh_clt(load("normal_variance"), 10, 0.1, progress=False)
    with pytest.raises(ValueError, match="tractable law of the summary"):
        mhaar(poisson, 10, 2, 0.1, mode="summary", progress=False)
    with pytest.raises(ValueError, match="record-level model"):
        mhaar(poisson, 10, 2, 0.1, mode="records", progress=False)
    with pytest.raises(ValueError, match="MHAAR's num_particles must be an integer >= 2, got 1"):
        mhaar(poisson, 10, 1, 0.1, model=PoissonCount(), progress=False)
    with pytest.raises(ValueError, match="num_particles must be an integer >= 1, got 0"):
        pmmh(poisson, 10, 0, 0.1, progress=False)
    with pytest.raises(
        ValueError, match=r"num_particles must be an integer >= 1, got 2.5"
    ):  # not 2 particles
        pmmh(poisson, 10, 2.5, 0.1, progress=False)
    batch = load("normal_variance")
    with pytest.raises(ValueError, match="sequential=True"):
        mhaar(batch, 10, 2, 0.1, mode="sequential", progress=False)
    with pytest.raises(ValueError, match="subset_size must lie"):
        mhaar(batch, 10, 2, 0.1, subset_size=101, progress=False)
    with pytest.raises(ValueError, match="applies to mode='records'"):
        mhaar(batch, 10, 2, 0.1, mode="summary", subset_size=5, progress=False)
    with pytest.raises(ValueError, match="proposal_scale must be"):
        pmmh(batch, 10, 2, torch.ones(3), progress=False)
    with pytest.raises(ValueError, match="proposal_scale must be positive"):
        pmmh(batch, 10, 2, -0.1, progress=False)
    with pytest.raises(ValueError, match="outside the prior's support"):
        pmmh(batch, 10, 2, 0.1, theta0=[-1.0], progress=False)
    with pytest.raises(ValueError, match="theta0 must hold"):
        pmmh(batch, 10, 2, 0.1, theta0=[1.0, 2.0, 3.0], num_chains=2, progress=False)
    with pytest.raises(ValueError, match="burn_in"):
        pmmh(batch, 10, 2, 0.1, burn_in=10, progress=False)
    with pytest.raises(ValueError, match="unknown method"):
        fisher_information(batch, method="exact")
