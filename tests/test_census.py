"""The census table task: shapes, the invariant total, nonnegative integer releases at the 2020 production rho;
its exact likelihood against brute-force enumeration and against exact-match rejection (simulation only); the
likelihood-based reference (also on a bounded prior) and the stored one with its provenance."""

import itertools
import math

import numpy as np
import pytest
import torch

import dpsbi
from dpsbi.experiment import stored_references
from dpsbi.experiment.reference import likelihood_importance, reference_posterior
from dpsbi.mechanisms import Laplace
from dpsbi.tasks.census import RHO_2020, age_edges, cell_log_probs, log_convolution_at

#: Least Kish ESS of the stored reference (its mean is then within ~0.03 posterior sd).
MIN_ESS = 1000


def census(**kwargs):
    return dpsbi.tasks.load("census_table", **kwargs)


def test_the_default_table_release_and_privacy_level():
    task = census()
    assert (task.dim_theta, task.dim_s) == (3, 46) and task.parameter_names[2] == "male_log_odds"
    inner = task.mechanism.inner
    assert math.isclose(inner.rho, RHO_2020) and math.isclose(RHO_2020, 0.246121, rel_tol=1e-5)
    assert math.isclose(inner.sigma, 2.0157, rel_tol=1e-4) and math.isclose(task.epsilon, inner.epsilon)
    assert math.isclose(inner.sensitivity, math.sqrt(2))  # bounded neighbours: rho = 1 / sigma^2
    assert torch.equal(task.y_obs, census().y_obs)  # numpy's frozen stream: the same release everywhere
    assert not torch.equal(task.y_obs, census(seed=1).y_obs)
    theta = task.prior.sample((200,))
    s = task.simulate(theta, torch.Generator().manual_seed(0))
    assert s.shape == (200, 46) and (s.sum(1) == 1000).all() and (s >= 0).all()  # the invariant total
    y = task.release(s, generator=torch.Generator().manual_seed(1))
    assert (y >= 0).all() and torch.equal(y, y.round()) and (y != s).any()
    assert bool((y == 0).any())  # sparse old-age cells are clamped
    for groups, cells in ((5, 10), (50, 100), (500, 1000), ([0, 18, 65], 6)):
        assert census(age_groups=groups, population=50).dim_s == cells
    assert census(rho=0.05).mechanism.inner.sigma == pytest.approx(1 / math.sqrt(0.05))
    assert census(epsilon=2.0).epsilon == pytest.approx(2.0)
    with pytest.raises(ValueError, match="not both"):
        census(epsilon=1.0, rho=0.1)
    with pytest.raises(ValueError, match="lower bounds"):
        census(age_groups=[5, 10])


@pytest.mark.parametrize(
    "population, error, message",
    [
        (2**53 + 1, ValueError, r"population must be at most 2\^53 \(counts are float64, exact up to it\)"),
        (1000.5, ValueError, "population must be an integer >= 1, got 1000.5"),
        (0, ValueError, "population must be an integer >= 1, got 0"),
        ("1000", ValueError, "population must be a number"),
    ],
)
def test_a_population_counts_cannot_hold_exactly_is_refused_in_one_line(population, error, message):
    """2^53 + 1 simulated rounded totals, 2^60 failed mid-simulation with a message not naming the population."""
    with pytest.raises(error, match=message):
        dpsbi.tasks.load("census_table", population=population)


def test_cell_probabilities_follow_the_age_profile_and_sex_ratio():
    edges = age_edges(None)
    log_p = cell_log_probs(torch.zeros(1, 3, dtype=torch.float64), edges)[0]
    assert math.isclose(float(log_p.exp().sum()), 1.0, rel_tol=1e-12)
    widths = torch.as_tensor(np.diff(edges))
    assert torch.allclose(log_p.exp(), torch.cat([widths, widths]) / 200, rtol=1e-10)  # flat ages, even sexes
    p = cell_log_probs(torch.tensor([[0.0, 0.0, math.log(3)]], dtype=torch.float64), edges)[0].exp()
    assert math.isclose(float(p[:23].sum()), 0.75, rel_tol=1e-12)


def _brute_force(task, theta, y, edges):
    """``log p(y | theta)`` by enumerating every table ``s`` with the total: Multinomial x the mechanism's pmf."""
    n, cells = int(task.simulate(task.true_theta).sum()), task.dim_s
    tables = torch.tensor(
        [c for c in itertools.product(range(n + 1), repeat=cells) if sum(c) == n], dtype=torch.float64
    )
    log_multinomial = math.lgamma(n + 1) - torch.lgamma(tables + 1).sum(1)
    log_p = cell_log_probs(theta.double(), edges)
    log_s = log_multinomial[:, None] + tables @ log_p.T  # (tables, thetas)
    log_eta = task.mechanism.log_prob(y.double().expand(len(tables), -1), tables)
    return torch.logsumexp(log_s + log_eta[:, None], 0)


@pytest.mark.parametrize("population, groups, rho", [(5, 2, 0.25), (7, 3, 2.0), (9, 1, 0.05)])
def test_the_exact_likelihood_is_the_brute_force_sum(population, groups, rho):
    task = census(population=population, age_groups=groups, rho=rho, y_obs="simulate", seed=3)
    cells = task.dim_s
    theta = torch.cat([task.true_theta, task.prior.sample((5,))])
    releases = [
        task.y_obs[0],
        torch.zeros(cells),  # every cell clamped
        torch.arange(cells, dtype=torch.float32) * 3,  # totals far above the invariant: the tilted path
    ]
    for y in releases:
        exact = task.exact_log_likelihood(theta, y)
        assert torch.allclose(exact, _brute_force(task, theta, y, age_edges(groups)), rtol=1e-11, atol=1e-11)


def test_the_exact_likelihood_at_another_privacy_level_is_that_tasks():
    """``mechanism=task.mechanism.with_epsilon(e)``: the likelihood of the task built at ``e``, and the table of
    the task's own level afterwards (the cache is keyed by the mechanism too)."""
    task = census(population=6, age_groups=2, rho=0.25, y_obs="simulate", seed=3)
    other = census(population=6, age_groups=2, epsilon=9.0, y_obs=task.y_obs[0].tolist())
    theta = task.prior.sample((4,))
    own = task.exact_log_likelihood(theta, task.y_obs)
    at_nine = task.exact_log_likelihood(theta, task.y_obs, mechanism=task.mechanism.with_epsilon(9.0))
    assert torch.allclose(at_nine, other.exact_log_likelihood(theta), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(at_nine, own) and torch.equal(task.exact_log_likelihood(theta, task.y_obs), own)


def test_the_convolution_keeps_relative_precision_in_far_tails():
    rng = np.random.default_rng(0)
    log_f = -0.5 * ((np.arange(40) - rng.uniform(0, 39, (6, 1))) / rng.uniform(0.5, 3, (6, 1))) ** 2
    for total in (0, 3, 60, 150, 234):
        expected = log_f[0]
        for row in log_f[1:]:  # exact log-space convolution
            expected = np.array(
                [
                    np.logaddexp.reduce(
                        [expected[j] + row[t - j] for j in range(len(expected)) if 0 <= t - j < len(row)]
                    )
                    for t in range(len(expected) + len(row) - 1)
                ]
            )
        assert log_convolution_at(log_f, total) == pytest.approx(expected[total], rel=1e-12, abs=1e-9)
    assert log_convolution_at(log_f, 235) == -math.inf  # beyond 6 x 39


def test_the_likelihood_agrees_with_exact_match_rejection():
    """Simulation alone: rejection ABC that accepts a prior draw when its simulated release equals y_obs exactly
    draws the exact posterior, and its acceptance rate is the evidence p(y_obs). Both against the likelihood."""
    torch.manual_seed(0)
    task = census(population=8, age_groups=2, rho=2.0)
    theta = task.prior.sample((400_000,))
    accepted = (task.simulate_release(theta, torch.Generator().manual_seed(0)) == task.y_obs).all(1)
    rejection = theta[accepted].double()
    rate = accepted.double().mean()
    # the evidence: the mean likelihood over prior draws (within 5 combined standard errors)
    likelihood = task.exact_log_likelihood(task.prior.sample((10_000,))).exp()
    se = math.sqrt(rate * (1 - rate) / len(theta) + likelihood.var() / len(likelihood))
    assert abs(float(likelihood.mean() - rate)) < 5 * se
    # the posterior: importance sampling with the exact likelihood vs the accepted draws
    draws, info = likelihood_importance(task, 4000, 2000, seed=0)
    sd = torch.tensor(info["weighted_sd"], dtype=torch.float64)
    se = sd * math.sqrt(1 / len(rejection) + 1 / info["ess"])
    assert len(rejection) > 1000 and info["ess"] > 1000
    assert (
        (rejection.mean(0) - torch.tensor(info["weighted_mean"], dtype=torch.float64)).abs() < 5 * se
    ).all()
    assert ((rejection.std(0) / sd - 1).abs() < 5 / math.sqrt(2 * len(rejection))).all()
    assert draws.shape == (2000, 3) and torch.unique(draws, dim=0).shape[0] == 2000  # systematic: no repeats


def test_the_likelihood_reference_weights_are_right_on_a_bounded_prior():
    """Importance sampling runs in the unconstrained space: on a box prior (a logit transform, not the identity)
    the weights must count the transform's Jacobian once. Target: U(0, 1) prior x N(0.3, 0.1^2) likelihood, a
    normal truncated to [0, 1], its mean and sd exact."""
    from scipy import stats

    task = dpsbi.from_simulator(dpsbi.tasks.box([0.0], [1.0]), lambda theta, g: theta, Laplace(1.0, 1.0), 0.0)
    likelihood = torch.distributions.Normal(0.3, 0.1)
    task.exact_log_likelihood = lambda theta: likelihood.log_prob(theta.double())[:, 0]
    draws, info = likelihood_importance(task, 8000, 2000, seed=0)
    exact = stats.truncnorm(-3.0, 7.0, loc=0.3, scale=0.1)
    se = exact.std() / math.sqrt(info["ess"])
    assert info["ess"] > 2000
    # with the Jacobian counted twice the mean came out 0.018 high (13 se)
    assert abs(info["weighted_mean"][0] - exact.mean()) < 5 * se
    assert abs(info["weighted_sd"][0] / exact.std() - 1) < 5 / math.sqrt(2 * info["ess"])
    assert abs(float(draws.double().mean()) - exact.mean()) < 5 * exact.std() / math.sqrt(len(draws))


def test_the_experiment_layer_computes_a_likelihood_reference_for_other_tables():
    task = census(age_groups=5)
    reference = reference_posterior(task, {"name": "census_table"}, "auto", 300, likelihood_draws=3000)
    assert reference.kind == "likelihood" and reference.samples.shape == (300, 3)
    assert "exact likelihood" in reference.note and "ESS" in reference.note
    with pytest.raises(ValueError, match="no exact likelihood"):
        reference_posterior(dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0), {}, "likelihood", 100)


@pytest.mark.parametrize(
    "stem, kwargs", [("census_table", {}), ("census_table_groups500", {"age_groups": 500})]
)
def test_the_stored_references_have_their_provenance_and_enough_ess(stem, kwargs):
    csv = stored_references.STORE / f"{stem}.csv"
    draws, provenance = stored_references.read(csv)
    assert provenance["task"]["name"] == "census_table"
    assert provenance["y_obs"] == census(**kwargs).y_obs[0].tolist()
    assert provenance["ess"] >= MIN_ESS and provenance["importance_draws"] > provenance["ess"]
    assert provenance["command"].startswith("OMP_NUM_THREADS=1 python scripts/census_references.py")
    assert provenance["git_commit"] and provenance["sha256"]
    assert "exact likelihood" in provenance["method"]
    assert draws.shape == (provenance["num_draws"], 3) and torch.isfinite(draws).all()
    # systematic resampling keeps the weighted mean and sd (within 5 Monte Carlo errors) and repeats no draw
    sd, n = torch.tensor(provenance["weighted_sd"]), draws.shape[0]
    assert ((draws.mean(0) - torch.tensor(provenance["weighted_mean"])).abs() < 5 * sd / n**0.5).all()
    assert ((draws.std(0) / sd - 1).abs() < 5 / (2 * n) ** 0.5).all()
    assert torch.unique(draws, dim=0).shape[0] == n
    assert f"{stem}.csv" in (stored_references.STORE / "README.md").read_text()
    # the experiment layer uses it for exactly this model and release, and computes one for any other
    reference = reference_posterior(census(**kwargs), {"name": "census_table"}, "auto", 500)
    assert reference.kind == "stored" and reference.samples.shape == (500, 3)
    assert reference.note.startswith("APPROXIMATE: stored reference")
    for other in (census(seed=1, **kwargs), census(rho=0.1, **kwargs), census(population=999, **kwargs)):
        assert stored_references.find(other) is None


def test_an_amortized_fit_over_a_range_of_rho_samples_at_any_rho_in_it():
    """One SPPE fit over rho in [0.05, 1] (as the epsilons of the zCDP conversion at the table's delta, so that
    the production 0.2461 lies inside): each simulation's release is drawn at its own rho, and the posterior
    samples at two rhos, different releases for different privacy levels."""
    task = census()
    inner = task.mechanism.inner
    low, high = (inner.with_rho(rho).epsilon for rho in (0.05, 1.0))
    assert low < task.epsilon < high
    posterior = dpsbi.SPPE(
        task,
        amortized=True,
        epsilon_range=(low, high),
        rounds=1,
        sims_per_round=200,
        flow=dict(transforms=1, hidden=16),
        training=dict(max_steps=30),
        progress=False,
    ).run()
    draws = [posterior.sample((50,), epsilon=inner.with_rho(rho).epsilon, seed=0) for rho in (0.1, RHO_2020)]
    assert all(d.shape == (50, 3) and torch.isfinite(d).all() for d in draws)
    assert not torch.equal(*draws)  # the flow is conditioned on the privacy level
    with pytest.raises(ValueError, match="epsilon"):
        posterior.sample((5,), epsilon=inner.with_rho(3.0).epsilon)
