"""Tasks: constants, simulators' known moments, releases, bijections and clear errors."""

import math

import pytest
import torch
from torch.distributions import Independent, Normal

import dpsbi
from dpsbi.mechanisms import Laplace
from dpsbi.tasks import Task, load, names
from dpsbi.tasks.poisson_counts import exact_log_likelihood
from dpsbi.tasks.simplex import BlockStickBreaking

pytestmark = pytest.mark.usefixtures("float64")
GEN = lambda seed=0: torch.Generator().manual_seed(seed)  # noqa: E731


def assert_mean(samples: torch.Tensor, expected: torch.Tensor, z: float = 4.0):
    se = samples.std(0) / math.sqrt(samples.shape[0])
    assert ((samples.mean(0) - expected).abs() <= z * se + 1e-12).all(), (samples.mean(0), expected, se)


def test_registry_lists_all_paper_tasks():
    expected = {
        "sir",
        "regression",
        "naive_bayes",
        "poisson_counts",
        "sir_influenza",
        "sir_ebola_guinea",
        "sir_ebola_liberia",
        "sir_ebola_sierra_leone",
        "sir_covid_clark",
    }
    assert expected <= set(names())


def test_unknown_task_and_missing_release_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown task 'sri'.*regression"):
        load("sri")
    with pytest.raises(ValueError, match="no stored release at epsilon=2.*stored: 10, 1, 0.1"):
        load("regression", epsilon=2.0)
    with pytest.raises(ValueError, match="epsilon must be"):
        load("regression", epsilon=-1.0, y_obs="simulate")
    with pytest.raises(ValueError, match="shape"):
        load("regression", y_obs=[0.1, 0.2])
    with pytest.raises(ValueError, match="outside the support"):
        load("sir", y_obs=[0.1234] * 10)
    with pytest.raises(ValueError, match="task 'poisson_counts'.*unexpected keyword"):
        load("poisson_counts", bogus=1)


def test_stored_constants():
    task = load("regression", epsilon=10.0)
    assert task.y_obs[0, 0].item() == pytest.approx(-0.38244)
    assert task.mechanism.scale == pytest.approx(0.013)
    assert task.s_obs[0, 3].item() == pytest.approx(0.249949)
    sir = load("sir", epsilon=1.0)
    assert sir.mechanism.pseudo_count == pytest.approx(10000.0) and sir.mechanism.epsilon <= 1.0
    assert sir.y_obs.shape == (1, 10) and torch.allclose(sir.true_theta, torch.tensor([[-0.5, -3.0]]))
    assert load("naive_bayes").mechanism.scale == pytest.approx(0.004)
    assert load("poisson_counts").y_obs.item() == pytest.approx(37.4)


def test_user_release_and_simulated_release():
    task = load("regression", epsilon=2.0, y_obs=[0.0] * 9)
    assert task.y_obs.shape == (1, 9)
    a = load("naive_bayes", epsilon=1.0, y_obs="simulate", seed=3).y_obs
    assert torch.equal(a, load("naive_bayes", epsilon=1.0, y_obs="simulate", seed=3).y_obs)


def test_real_outbreaks_are_flagged_as_not_mechanism_releases():
    task = load("sir_influenza")
    assert not task.release_from_mechanism and task.true_theta is None
    assert task.mechanism.trials == 100 and task.mechanism.population == 100_000
    assert task.epsilon == pytest.approx(1000 * math.log1p(1 / 100))
    with pytest.raises(ValueError, match="not a release of its mechanism"):
        task.require_mechanism_release("rejection ABC")
    with pytest.raises(ValueError, match="pseudo_count"):
        load("sir_influenza", epsilon=1.0)


def test_sir_tasks_say_their_exact_simulator_is_costly():
    """So that an amortized SPPE fit draws 10 000 a round by default with the exact simulator (8-15 CPU ms a
    simulation), and 100 000 with tau-leaping."""
    assert load("sir").costly_simulator and load("sir_influenza").costly_simulator
    assert not load("sir", simulator="tau_leap").costly_simulator  # 0.14 CPU ms a simulation
    assert not load("naive_bayes").costly_simulator and not load("regression").costly_simulator


def test_a_privatized_outbreak_is_the_mechanism_applied_to_the_curves_counts():
    """``y_obs="privatize"`` releases the curve's counts in K through the binomial mechanism: over 400 seeds each
    point's mean is the mechanism's success probability at those counts (z within 4 binomial standard errors:
    fractions taken for counts would give about 0.001 everywhere), on the lattice k / N."""
    real = load("sir_covid_clark")
    releases = torch.cat([load("sir_covid_clark", y_obs="privatize", seed=s).y_obs for s in range(400)])
    p = real.mechanism.probability(real.y_obs * real.mechanism.population)[0]
    z = (releases.mean(0) - p) / (p * (1 - p) / real.mechanism.trials / 400).sqrt()
    assert z.abs().max() < 4, z
    assert torch.allclose(releases * 100, (releases * 100).round(), atol=1e-4)
    task = load("sir_covid_clark", y_obs="privatize", seed=3)
    assert task.release_from_mechanism and torch.equal(task.y_obs, releases[3:4])
    task.require_mechanism_release("rejection ABC")  # a release of the mechanism: exact methods apply


def test_regression_statistic_means_by_direct_computation():
    """With coefficients for which clamping at |10| is negligible, E[s] has a closed form."""
    task = load("regression", epsilon=1.0)
    b0, b1, b2 = 0.2, 0.5, -0.3
    m1, m2 = 0.9, -1.17
    ey = b0 + b1 * m1 + b2 * m2
    ex1y = b0 * m1 + b1 * (1 + m1**2) + b2 * m1 * m2
    ex2y = b0 * m2 + b1 * m1 * m2 + b2 * (1 + m2**2)
    ey2 = ey**2 + 2 + b1**2 + b2**2
    expected = torch.tensor(
        [
            ey / 10,
            ex1y / 100,
            ex2y / 100,
            ey2 / 100,
            m1 / 10,
            m2 / 10,
            (1 + m1**2) / 100,
            m1 * m2 / 100,
            (1 + m2**2) / 100,
        ]
    )
    s = task.simulate(torch.tensor([[b0, b1, b2]]).expand(4000, 3), GEN(1))
    assert_mean(s, expected)


def test_naive_bayes_count_means():
    task = load("naive_bayes")
    theta = task.true_theta
    s = task.simulate(theta.expand(4000, 10), GEN(2))
    pi = theta[0, 8:]
    cond = theta[0, :8].reshape(2, 2, 2)
    assert_mean(s, (pi[:, None, None] * cond).reshape(-1))
    assert torch.allclose(
        s.reshape(-1, 2, 4).sum(-1) / 2, s.reshape(-1, 2, 2, 2)[:, :, 0].sum(-1)
    )  # class totals agree


def test_poisson_mean_and_variance():
    task = load("poisson_counts")
    s = task.simulate(torch.full((20000, 1), 12.0), GEN(3))
    assert_mean(s, torch.tensor([12.0]))
    var_se = 12.0 * math.sqrt(2 / 20000) * 1.1  # var of the sample variance ~ 2 sigma^4 / n (+ kurtosis)
    assert abs(s.var().item() - 12.0) < 4 * var_se


@pytest.mark.parametrize("noise", ["laplace", "discrete_laplace", "discrete_gaussian"])
def test_poisson_exact_posterior_agrees_with_a_grid_sum(noise):
    """The Gamma mixture against prior x ``exact_log_likelihood`` on a grid, for every noise (each by its own
    pmf or density: a likelihood that ignored ``noise`` would miss the discrete Gaussian's moments by far more)."""
    task = load("poisson_counts", noise=noise)
    post = task.exact_posterior(task.y_obs)
    grid = torch.linspace(1e-3, 90, 90001)
    logp = task.prior.log_prob(grid[:, None]) + exact_log_likelihood(grid[:, None], task.y_obs, 0.2, noise)
    dens = (logp - logp.max()).exp()
    dens = dens / torch.trapezoid(dens, grid)
    assert torch.trapezoid(dens * grid, grid).item() == pytest.approx(post.mean.item(), rel=1e-6)
    assert torch.trapezoid(dens * grid**2, grid).item() == pytest.approx(
        (post.variance + post.mean**2).item(), rel=1e-6
    )
    assert torch.allclose(post.log_prob(grid[::1000, None]).exp(), dens[::1000], rtol=1e-4, atol=1e-10)


def test_simplex_bijection_round_trip_and_log_det():
    transform = BlockStickBreaking([2, 3])
    z = torch.randn(6, 3, generator=GEN(4))
    theta = transform(z)
    assert theta.shape == (6, 5) and torch.allclose(theta[:, :2].sum(-1), torch.ones(6))
    assert torch.allclose(transform.inv(theta), z, atol=1e-10)
    jac = torch.autograd.functional.jacobian(
        lambda x: transform(x)[[0, 2, 3]], z[0]
    )  # drop one coord per block
    assert transform.log_abs_det_jacobian(z[:1], theta[:1]).item() == pytest.approx(
        torch.linalg.det(jac).abs().log().item()
    )
    task = load("naive_bayes")
    assert task.dim_unconstrained == 5 and bool(
        task.prior.support.check(task.transform(torch.randn(3, 5))).all()
    )


def test_simulator_nan_and_bad_theta_raise():
    bad = Task(
        "bad",
        Independent(Normal(torch.zeros(1), 1.0), 1),
        lambda th, g: th * float("nan"),
        Laplace(1.0, 1.0),
        epsilon=1.0,
    )
    with pytest.raises(RuntimeError, match="NaN"):
        bad.simulate(torch.zeros(3, 1))
    task = load("poisson_counts")
    with pytest.raises(ValueError, match=r"shape \(n, 1\)"):
        task.simulate(torch.ones(3, 2))
    with pytest.raises(ValueError, match="outside the prior's support"):
        task.simulate(torch.tensor([[-1.0]]))


def test_top_level_api():
    assert dpsbi.tasks.load("conjugate_gaussian").exact_posterior is not None
    with pytest.raises(AttributeError):
        dpsbi.not_a_thing  # noqa: B018


@pytest.mark.parametrize("simulator", ["exact", "tau_leap"])
def test_sir_task_releases_lie_in_the_mechanism_support(simulator):
    task = load("sir", epsilon=1.0, population=20_000, simulator=simulator)
    s = task.simulate(task.true_theta.expand(8, 2), GEN(5))
    assert s.shape == (8, 10) and (s >= 0).all() and (s <= 20_000).all()
    y = task.release(s, generator=GEN(6))
    assert bool(task.mechanism.in_support(y).all())
    with pytest.raises(ValueError, match="unknown SIR simulator"):
        load("sir", simulator="ode")


def test_naive_bayes_exact_posterior_agrees_with_abc_importance_sampling():
    from dpsbi.baselines import abc_is

    release = [0.5333, 0.3867, 0.6302, 0.2461, 0.1757, 0.0523, 0.1347, 0.084]  # simulated, seed 4
    task = load("naive_bayes", epsilon=1.0, y_obs=release)
    exact = task.exact_posterior(task.y_obs)
    mean, sd = exact.mean.double(), exact.stddev.double()
    reference = abc_is(task, 300_000, seed=5, progress=False)  # exact weights: the mechanism is the kernel
    ref_mean = (reference.weights[:, None] * reference.samples).sum(0).double()
    assert reference.ess > 300
    assert ((ref_mean - mean).abs() < 4 * sd / math.sqrt(reference.ess)).all(), (ref_mean, mean)
    torch.manual_seed(0)
    draws = exact.sample((4000,))
    assert draws.shape == (4000, 10) and task.prior.support.check(draws).all()
    assert ((draws.mean(0).double() - mean).abs() < 4 * sd / math.sqrt(4000)).all()
    assert ((draws.std(0).double() / sd - 1).abs() < 4 / math.sqrt(2 * 4000)).all()
    assert (sd < task.prior.sample((4000,)).std(0).double() * 0.9).all()  # informative: not the prior


def test_naive_bayes_exact_likelihood_is_the_simulators_mean_mechanism_density():
    """``exact_log_likelihood`` against ``log mean eta(y | s)`` over 400 000 simulations at each theta (within 4
    Monte Carlo standard errors, from the densities' spread), at the task's epsilon and, through
    ``mechanism=with_epsilon(1)``, as the task built at epsilon 1 gives it."""
    task = load("naive_bayes", epsilon=3.0, n=6, y_obs="simulate", seed=2)
    theta = task.prior.sample((3,))
    exact = task.exact_log_likelihood(theta)
    for row, value in zip(theta, exact, strict=True):
        s = task.simulate(row.expand(400_000, -1), GEN(7))
        eta = task.mechanism.log_prob(task.y_obs.expand(len(s), -1), s).double().exp()
        error = 4 * float(eta.std() / eta.mean()) / math.sqrt(len(s))  # of log mean eta
        assert abs(float(value) - float(eta.mean().log())) < error
    other = load("naive_bayes", epsilon=1.0, n=6, y_obs=task.y_obs[0].tolist())
    at_one = task.exact_log_likelihood(theta, mechanism=task.mechanism.with_epsilon(1.0))
    assert torch.allclose(at_one, other.exact_log_likelihood(theta), rtol=1e-12, atol=1e-12)
    assert not hasattr(load("naive_bayes", values=3, y_obs="simulate"), "exact_log_likelihood")


def test_naive_bayes_exact_posterior_only_for_binary_two_class_models():
    assert load("naive_bayes", values=3, y_obs="simulate").exact_posterior is None
    with pytest.raises(ValueError, match="release has 7 entries"):
        load("naive_bayes").exact_posterior(torch.zeros(7))
