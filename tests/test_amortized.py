"""Amortized by design: ``amortized=True`` draws every round from the prior, ``epsilon_range`` conditions the flow on
epsilon (mechanisms re-calibrated per simulation by ``with_epsilon``), and the posterior takes ``epsilon=`` per
release, refusing one outside the trained range. Accuracy against the exact posteriors of the conjugate Gaussian
and Poisson-counts tasks at several (release, epsilon) pairs."""

import contextlib
import copy
import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch
from sbi.utils.sbiutils import standardizing_net

import dpsbi
from dpsbi.inference import posterior_file
from dpsbi.inference.epsilon_scaling import EpsilonStandardize, _quadratic_fit
from dpsbi.inference.estimator import SequentialEstimator
from dpsbi.inference.flows import ConditionalFlow
from dpsbi.mechanisms import (
    BinomialCurve,
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    PostProcessed,
    RandomizedResponse,
    SmoothSensitivityLaplace,
    nonnegative,
)
from dpsbi.mechanisms.epsilon import at_epsilons, epsilon_range_problem
from dpsbi.mechanisms.gaussian import analytic_mu, analytic_sigma
from dpsbi.tasks import load
from dpsbi.tasks.poisson_counts import exact_posterior as poisson_exact

TINY = dict(flow=dict(transforms=1, hidden=16), training=dict(max_steps=30), progress=False)
#: The conjugate Gaussian with a small sensitivity, so that epsilon in [0.5, 4] moves the posterior sd by 40%.
GAUSS = dict(noise_sd=0.5, sensitivity=0.25, dim=2)

# ---- mechanisms at other epsilons ----------------------------------------------------------------------------

FAMILIES = {
    "laplace": lambda: Laplace(1.0, 2.0, 2),
    "gaussian": lambda: Gaussian(0.5, 1e-5, 1.0, 2),
    "gaussian_classic": lambda: Gaussian(0.5, 1e-5, 1.0, 2, calibration="classic"),
    "gaussian_gdp": lambda: Gaussian.gdp(0.7, 1.0, 2),
    "discrete_laplace": lambda: DiscreteLaplace(1.0, 1, 2),
    "binomial": lambda: BinomialCurve(20, 100, 3, epsilon=1.0),
    "randomized_response": lambda: RandomizedResponse(1.0, 2),
    "postprocessed": lambda: PostProcessed(Laplace(1.0, 1.0, 2), nonnegative),
    "discrete_gaussian": lambda: DiscreteGaussian(1.0, 1e-6),  # CKS Thm. 7
    "discrete_gaussian_zcdp": lambda: DiscreteGaussian(1.0, 1e-6, 2.0, dim=3),  # the zCDP conversion
    "discrete_gaussian_rho": lambda: DiscreteGaussian.from_rho(0.1, 1.0, dim=2),
    "census": lambda: PostProcessed(DiscreteGaussian.from_rho(0.2461, 2**0.5, 4, 1e-10), nonnegative),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_tensor_of_epsilons_draws_every_row_as_the_mechanism_at_its_epsilon(family):
    """One vectorized call at per-row epsilons gives, row by row, the releases of ``with_epsilon(eps_i)``."""
    mechanism = FAMILIES[family]()
    binary = isinstance(mechanism, RandomizedResponse)
    s = torch.randint(0, 2 if binary else 50, (4, mechanism.input_dim)).float()
    u = torch.rand(4, 3, mechanism.noise_dim, generator=torch.Generator().manual_seed(0))
    eps = torch.tensor([0.2, 0.5, 0.9, 0.35])
    batched = at_epsilons(mechanism, eps.reshape(-1, 1, 1)).sample(s.unsqueeze(-2), u)
    one_by_one = torch.stack(
        [
            mechanism.with_epsilon(float(e)).sample(s[i : i + 1].unsqueeze(-2), u[i : i + 1])[0]
            for i, e in enumerate(eps)
        ]
    )
    assert batched.shape == (4, 3, mechanism.dim) and batched.dtype == mechanism.dtype  # float64 for counts
    torch.testing.assert_close(batched, one_by_one)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_with_epsilon_at_its_own_epsilon_is_the_same_mechanism(family):
    mechanism = FAMILIES[family]()
    own = float(getattr(mechanism, "target_epsilon", mechanism.epsilon))
    again = mechanism.with_epsilon(own)
    assert type(again) is type(mechanism) and math.isclose(again.epsilon, mechanism.epsilon, rel_tol=1e-6)
    s = torch.randint(0, 2, (5, mechanism.input_dim)).float()
    u = torch.rand(5, mechanism.noise_dim, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(again.sample(s, u), mechanism.sample(s, u), rtol=1e-5, atol=1e-5)


def test_the_analytic_calibration_is_one_path_on_every_device_and_fits_stay_in_its_range(operator_count):
    """Traced (a compiled step) the analytic calibration gives its eager values, on the meta device it reads
    nothing back (a step on a GPU never waits for it), an epsilon past its range is refused in one line on the CPU,
    and an amortized fit whose widened range leaves it (or a classic calibration's epsilon < 1) is refused in
    one line before any compute, compiled or not."""
    eps = torch.tensor([1e-20, 1e-3, 0.1, 1.0, 9.0, 2e4, 1e7], dtype=torch.float64)
    traced = torch.compile(analytic_mu, backend="eager", fullgraph=True)(eps, 1e-5)
    torch.testing.assert_close(traced, analytic_mu(eps, 1e-5), rtol=1e-12, atol=0)
    with operator_count() as count:
        assert analytic_mu(eps.to("meta"), 1e-5).shape == eps.shape
    assert count.calls < 200  # the table and three Newton steps (101 ops), not a 64-step bisection (1518)
    with pytest.raises(ValueError, match=r"covers epsilon up to 1.39e\+08, got 2e\+08"):
        analytic_mu(torch.tensor([1.0, 2e8]), 1e-5)
    task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
    dpsbi.SPPE(task, amortized=True, epsilon_range=(1e-8, 1e6), epsilon_margin=10)
    for training in ({}, {"compile": False}):
        with pytest.raises(
            ValueError, match=r"re-calibrated per row only at epsilon between 0 and 1.39e\+08"
        ) as error:
            dpsbi.SPPE(task, amortized=True, epsilon_range=(1.0, 1e8), epsilon_margin=10, training=training)
        assert "\n" not in str(error.value)
    # beyond brentq's range, up to the table's end: a root of delta(mu), not a bound
    for delta in (1e-3, 1e-9):
        at = torch.tensor([6e7, 1e8, 1.38e8], dtype=torch.float64)
        mu = analytic_mu(at, delta)
        relative = (
            torch.special.ndtr(-at / mu + mu / 2) - torch.exp(at + torch.special.log_ndtr(-at / mu - mu / 2))
        ) / delta
        assert torch.isfinite(mu).all() and float((relative - 1).abs().max()) < 1e-6
    classic = dpsbi.tasks.from_simulator(
        dpsbi.tasks.box([0.0], [1.0]), lambda theta: theta, Gaussian(0.5, 1e-5, 1.0, 1, "classic"), None
    )
    dpsbi.SPPE(classic, amortized=True, epsilon_range=(0.1, 0.9))
    with pytest.raises(ValueError, match="re-calibrated per row only at epsilon between 0 and 1 "):
        dpsbi.SPPE(classic, amortized=True, epsilon_range=(0.1, 0.9), epsilon_margin=1.2)


def test_vectorized_analytic_calibration_agrees_with_brentq():
    """From epsilon 1e-25 to 1e7, wherever the scalar calibration (brentq) has a root in its range; to 1e-8 of
    it: the rounding of ``delta(mu)`` (about 5e-17) bounds the Newton polish, 2e-9 of ``mu`` at delta 1e-9."""
    eps = torch.tensor(
        [1e-25, 1e-12, 1e-6, 1e-3, 0.05, 0.1, 0.33, 1.0, 2.5, 10.0, 50.0, 1e5, 1e7], dtype=torch.float64
    )
    for delta, valid in ((1e-3, 13), (1e-5, 13), (1e-9, 11)):
        expected = []
        for e in eps.tolist():
            with contextlib.suppress(ValueError):  # mu below 1e-8: no root where brentq looks
                expected.append((e, 1 / analytic_sigma(e, delta, 1.0)))
        at, mu = torch.tensor(expected, dtype=torch.float64).T
        assert len(at) == valid
        torch.testing.assert_close(analytic_mu(at, delta), mu, rtol=1e-8, atol=0)


@pytest.mark.parametrize(
    "mechanism",
    [SmoothSensitivityLaplace(1.0, 1e-6, 1.0, 11)],
    ids=["smooth_sensitivity"],
)
def test_a_family_that_cannot_redraw_per_epsilon_is_refused_in_one_line(mechanism):
    assert epsilon_range_problem(mechanism)
    assert mechanism.with_epsilon(2.0).epsilon == pytest.approx(
        2.0, rel=1e-6
    )  # one epsilon at a time still works
    task = dpsbi.tasks.from_simulator(
        dpsbi.tasks.box([0.0], [1.0]), lambda theta: theta.repeat(1, mechanism.input_dim), mechanism, None
    )
    with pytest.raises(ValueError, match="epsilon_range") as error:
        dpsbi.SPPE(task, amortized=True, epsilon_range=(0.5, 2.0), **TINY)
    assert "\n" not in str(error.value)


# ---- the estimators ------------------------------------------------------------------------------------------


def test_amortized_rounds_all_draw_from_the_prior(monkeypatch):
    """No proposal at y_obs: rounds after the first never call the posterior, and y_obs may be absent."""
    monkeypatch.setattr(
        SequentialEstimator, "proposal_draws", lambda *a: pytest.fail("an amortized fit proposed at y_obs")
    )
    task = load("conjugate_gaussian", epsilon=1.0, **GAUSS)
    task.y_obs = None
    estimator = dpsbi.SPPE(task, amortized=True, rounds=2, sims_per_round=100, **TINY)
    posterior = estimator.run()
    assert estimator.num_simulations == 200 and estimator.fingerprint()["amortized"] is True
    assert posterior.amortized and estimator.propose(5).shape == (5, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        posterior.sample((10,), y=torch.tensor([3.0, -2.0]))
    assert not [w for w in caught if "not a valid posterior" in str(w.message)]  # valid at any release


def test_epsilon_range_needs_amortized_and_a_proper_range():
    task = load("conjugate_gaussian", epsilon=1.0, **GAUSS)
    with pytest.raises(ValueError, match="amortized=True"):
        dpsbi.SPPE(task, epsilon_range=(0.5, 2.0), **TINY)
    with pytest.raises(ValueError, match="0 < low < high"):
        dpsbi.SPPE(task, amortized=True, epsilon_range=(2.0, 0.5), **TINY)
    classic = dpsbi.tasks.from_simulator(
        dpsbi.tasks.normal(0.0, 1.0), lambda t: t, Gaussian(0.5, 1e-5, 1.0, calibration="classic"), None
    )
    with pytest.raises(ValueError, match="classic"):  # the family's own limit, checked at both ends
        dpsbi.SPPE(classic, amortized=True, epsilon_range=(0.5, 2.0), **TINY)
    with pytest.raises(ValueError, match="NaiveNPE"):
        dpsbi.NaiveNPE(task, epsilon_range=(0.5, 2.0), **TINY)


@pytest.fixture(scope="module")
def gaussian_posterior():
    """SPPE over epsilon in [0.5, 4] on the two-dimensional conjugate Gaussian (~10 s)."""
    task = load("conjugate_gaussian", epsilon=1.0, **GAUSS)
    estimator = dpsbi.SPPE(
        task,
        amortized=True,
        epsilon_range=(0.5, 4.0),
        rounds=1,
        sims_per_round=1000,
        inner_samples=8,
        qmc=True,
        flow=dict(transforms=2, hidden=32),
        training=dict(max_steps=500, batch_size=200),
        progress=False,
    )
    return estimator, estimator.run()


def _close_to(draws: torch.Tensor, mean: torch.Tensor, sd: torch.Tensor, tolerance: float) -> None:
    """Draws' means within ``tolerance`` exact sds of the exact means, and sds within ``tolerance`` relative: the
    Monte Carlo error of 4000 draws (~0.02) plus a small flow's approximation."""
    draws = draws.cpu()  # results live on the flow's device
    shift = ((draws.mean(0) - mean) / sd).abs().max()
    spread = (draws.std(0) / sd - 1).abs().max()
    assert shift < tolerance and spread < tolerance, (float(shift), float(spread))


@pytest.mark.parametrize("release", [[0.8, -0.3], [2.0, 1.0], [-1.5, 0.2]])
def test_conjugate_gaussian_over_epsilon_matches_the_exact_posteriors(gaussian_posterior, release):
    _, posterior = gaussian_posterior
    y = torch.tensor(release)
    for epsilon in (0.6, 1.5, 3.5):  # the exact posterior sd goes from 0.84 to 0.51
        exact = load("conjugate_gaussian", epsilon=epsilon, **GAUSS).exact_posterior(y)
        draws = posterior.sample((4000,), y=y, epsilon=epsilon, seed=0)
        _close_to(draws, exact.mean, exact.stddev, 0.3)


def test_an_epsilon_column_travels_with_the_simulations_and_the_checkpoint(gaussian_posterior, tmp_path):
    estimator, _ = gaussian_posterior
    epsilon = estimator.data["epsilon"]
    assert epsilon.shape == (1000,) and 0.5 <= float(epsilon.min()) and float(epsilon.max()) <= 4.0
    assert abs(float(torch.log(epsilon).mean()) - (math.log(0.5) + math.log(4.0)) / 2) < 0.1  # log-uniform
    assert estimator.fingerprint()["epsilon_range"] == [0.5, 4.0] and estimator.flow.context_dim == 3
    task = load("conjugate_gaussian", epsilon=1.0, **GAUSS)
    settings = dict(amortized=True, rounds=1, sims_per_round=100, checkpoint_dir=tmp_path, **TINY)
    first = dpsbi.SPPE(task, epsilon_range=(0.5, 4.0), **settings)
    first.run()
    again = dpsbi.SPPE(task, epsilon_range=(0.5, 4.0), **{**settings, "rounds": 2})
    again.run()
    assert torch.equal(again.data["epsilon"][:100], first.data["epsilon"]) and again.num_simulations == 200
    with pytest.raises(ValueError, match="epsilon_range"):
        dpsbi.SPPE(task, epsilon_range=(0.5, 3.0), **{**settings, "rounds": 3}).run()


def test_epsilon_per_release_in_batched_calls(gaussian_posterior):
    _, posterior = gaussian_posterior
    y = torch.tensor([[0.8, -0.3], [2.0, 1.0], [0.0, 0.0]])
    epsilon = torch.tensor([0.6, 1.5, 3.5])
    theta = torch.randn(7, 3, 2, generator=torch.Generator().manual_seed(0))
    batched = posterior.log_prob_batched(theta, y=y, epsilon=epsilon)
    single = torch.stack(
        [posterior.log_prob(theta[:, b], y=y[b], epsilon=float(epsilon[b])) for b in range(3)], -1
    )
    torch.testing.assert_close(batched, single, rtol=1e-4, atol=1e-4)
    draws = posterior.sample_batched((2000,), y=y, epsilon=epsilon, seed=0)
    assert draws.shape == (2000, 3, 2)
    for b in range(3):
        exact = load("conjugate_gaussian", epsilon=float(epsilon[b]), **GAUSS).exact_posterior(y[b])
        _close_to(draws[:, b], exact.mean, exact.stddev, 0.3)
    one = posterior.sample_batched((5,), y=y[:1], epsilon=0.6, seed=3)[:, 0]
    torch.testing.assert_close(one, posterior.sample((5,), y=y[0], epsilon=0.6, seed=3))


def test_epsilon_outside_the_range_is_refused_and_the_default_is_the_tasks(gaussian_posterior):
    _, posterior = gaussian_posterior
    y = torch.tensor([0.8, -0.3])
    for bad in (0.4, 4.5):
        with pytest.raises(ValueError, match=r"outside the range \[0.5, 4\]") as error:
            posterior.sample((10,), y=y, epsilon=bad)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="outside the range"):
        posterior.sample_batched((10,), y=torch.stack([y, y]), epsilon=torch.tensor([1.0, 5.0]))
    with pytest.raises(ValueError, match="outside the range"):
        posterior.log_prob(torch.zeros(2), y=y, epsilon=0.1)
    with pytest.raises(ValueError, match="one per release"):
        posterior.sample_batched((10,), y=torch.stack([y, y]), epsilon=torch.tensor([1.0, 2.0, 3.0]))
    # no epsilon: the task's own (1.0, inside the range)
    torch.testing.assert_close(
        posterior.sample((20,), y=y, seed=1), posterior.sample((20,), y=y, epsilon=1.0, seed=1)
    )


def test_posterior_files_record_the_range_and_refuse_outside_it(gaussian_posterior, tmp_path):
    _, posterior = gaussian_posterior
    path = tmp_path / "posterior.pt"
    posterior.save(path)
    loaded = dpsbi.load_posterior(path, device=posterior.device)
    assert loaded.epsilon_range == (0.5, 4.0) and loaded.metadata()["options"]["epsilon_range"] == [0.5, 4.0]
    y = torch.tensor([0.8, -0.3])
    torch.testing.assert_close(
        loaded.sample((50,), y=y, epsilon=2.0, seed=0), posterior.sample((50,), y=y, epsilon=2.0, seed=0)
    )
    with pytest.raises(ValueError, match="outside the range"):
        loaded.sample((5,), y=y, epsilon=8.0)
    # a task whose own epsilon lies outside the range: epsilon must be given
    outside = dpsbi.load_posterior(path, task=load("conjugate_gaussian", epsilon=1.0, **GAUSS))
    outside.task.mechanism = outside.task.mechanism.with_epsilon(8.0)  # as if the task were at epsilon 8
    with pytest.raises(ValueError, match="pass epsilon="):
        outside.sample((5,), y=y)


def test_releases_are_z_scored_at_their_own_epsilon():
    """Releases whose spread shrinks a hundredfold over the range reach the flow on one scale at every epsilon
    (one z-scoring over all of them leaves the least noisy 50x narrower), and the map is affine in the release."""
    log_eps = torch.linspace(math.log(0.1), math.log(10.0), 4000)
    release = 3.0 + torch.randn(
        4000, 2, generator=torch.Generator().manual_seed(0)
    ) / log_eps.exp().unsqueeze(-1)
    context = torch.cat([release, log_eps.unsqueeze(-1)], -1)
    per_epsilon, overall = EpsilonStandardize(context), standardizing_net(context)
    for ends in (slice(0, 300), slice(-300, None)):
        assert ((per_epsilon(context[ends])[:, :2].std(0) - 1).abs() < 0.25).all()
    assert (overall(context[-300:])[:, :2].std(0) < 0.05).all()
    one = context[:1].expand(3, -1).clone()
    one[:, 0] = torch.tensor([0.0, 1.0, 2.0])
    steps = per_epsilon(one)[:, 0].diff()
    torch.testing.assert_close(steps[0], steps[1])  # affine in the release at a fixed epsilon
    assert per_epsilon(context.double()).dtype == torch.float64  # wide releases keep their precision
    both = EpsilonStandardize(context, both=True)(context)  # the global z-scoring, then the per-epsilon one
    torch.testing.assert_close(both, torch.cat([overall(context)[:, :2], per_epsilon(context)], -1))


def test_per_epsilon_statistics_are_the_weighted_quadratic_and_rebuild_bit_for_bit():
    """The bins' statistics are smoothed by the count-weighted least-squares quadratic (numpy's, in float64; an
    empty bin weighs nothing, one populated bin gives a constant), and a z-scoring built again from the same
    examples, with the allocator's state moved in between, is the same to the bit (LAPACK's least squares, used
    before, was not: two fits of one seed in one process could differ)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.linspace(-2.0, 2.0, 8)
    t = ((x - x.mean()) / x.std()).double().numpy()
    basis = np.stack([np.ones(8), t, t * t], -1)
    for empty in range(3):
        values = torch.randn(8, 3, generator=generator)
        count = torch.randint(1, 50, (8, 1), generator=generator).float()
        count[empty] = 0
        root = np.sqrt(count.double().numpy())
        want = basis @ np.linalg.lstsq(basis * root, values.double().numpy() * root, rcond=None)[0]
        np.testing.assert_allclose(_quadratic_fit(x, values, count).double().numpy(), want, atol=1e-6)
    one = torch.zeros(8, 1)
    one[3] = 10.0
    values = torch.randn(8, 2, generator=generator)
    torch.testing.assert_close(_quadratic_fit(x, values, one), values[3].expand(8, 2))
    context = torch.cat(
        [5 * torch.randn(2000, 3, generator=generator), 4.6 * torch.rand(2000, 1, generator=generator) - 2.3],
        1,
    )
    first = EpsilonStandardize(context).state_dict()
    held = []
    for size in torch.randint(1, 100_000, (30,), generator=generator).tolist():
        held.append(torch.empty(size))  # moves where the next build's tensors land
        again = EpsilonStandardize(context.clone()).state_dict()
        assert all(torch.equal(again[name], first[name]) for name in first)


def test_older_files_and_global_scaling_load_as_they_were_trained(gaussian_posterior, tmp_path):
    """A file written before ``release_scaling`` existed holds a globally z-scored flow: it loads as one."""
    estimator, posterior = gaussian_posterior
    scaling = posterior.flow.embedding[0]
    assert posterior.flow.epsilon_context and isinstance(scaling, EpsilonStandardize) and not scaling.both
    flow = ConditionalFlow(
        dataclasses.replace(estimator.flow_settings, release_scaling="global"),
        torch.randn(50, 2),
        torch.randn(50, 3),
        epsilon_context=True,
    )
    older = copy.copy(posterior)
    older.flow = flow
    meta = older.metadata()
    del meta["flow"]["epsilon_context"], meta["flow"]["config"]["release_scaling"]
    path = tmp_path / "older.pt"
    posterior_file.write(path, meta, flow.state_dict())
    loaded = dpsbi.load_posterior(path)
    assert loaded.flow.config.release_scaling == "global" and not loaded.flow.epsilon_context
    y = torch.tensor([0.8, -0.3])
    torch.testing.assert_close(
        loaded.sample((20,), y=y, epsilon=2.0, seed=0), older.sample((20,), y=y, epsilon=2.0, seed=0)
    )


def test_a_default_epsilon_serves_tools_that_pass_releases_only(gaussian_posterior, tmp_path):
    """``set_default_epsilon`` (checked against the range at once) is what every call without ``epsilon`` uses,
    so that sbi's ``run_sbc`` (which passes releases only) calibrates the posterior at that epsilon: KS p > 0.01
    against the exact posterior's ranks; ArviZ exports take ``epsilon=`` and record the one used; the default
    survives saving."""
    from sbi.diagnostics import check_sbc, run_sbc

    _, posterior = gaussian_posterior
    view = copy.copy(posterior)
    with pytest.raises(ValueError, match="outside the range"):
        view.set_default_epsilon(8.0)
    y = torch.tensor([0.8, -0.3])
    assert view.set_default_epsilon(3.0) is view
    torch.testing.assert_close(
        view.sample((20,), y=y, seed=1), posterior.sample((20,), y=y, epsilon=3.0, seed=1)
    )
    task = load("conjugate_gaussian", epsilon=3.0, **GAUSS)
    torch.manual_seed(0)
    theta = task.prior.sample((200,))
    releases = task.simulate_release(theta, generator=torch.Generator().manual_seed(1))
    on = view.device  # as with sbi's own posteriors, parameters and releases on the posterior's device
    ranks, dap = run_sbc(
        theta.to(on), releases.to(on), view, num_posterior_samples=300, show_progress_bar=False
    )
    ranks, dap = ranks.cpu(), dap.cpu()
    checks = check_sbc(ranks, task.prior.sample((200,)), dap, num_posterior_samples=300)
    assert (checks["ks_pvals"] > 0.01).all(), checks["ks_pvals"]
    noisier = load("conjugate_gaussian", epsilon=0.5, **GAUSS).simulate_release(
        theta, torch.Generator().manual_seed(1)
    )  # releases made at epsilon 0.5: the posterior at 3.0 is too narrow for them
    wrong, _ = run_sbc(theta.to(on), noisier.to(on), view, num_posterior_samples=300, show_progress_bar=False)
    wrong = wrong.cpu()
    assert check_sbc(wrong, theta, dap, num_posterior_samples=300)["ks_pvals"].min() < 1e-3  # too wide at 0.5

    data = posterior.to_arviz(500, y=y, epsilon=2.0, seed=0, predictive=True)
    assert data.posterior.attrs["epsilon"] == 2.0
    torch.testing.assert_close(
        torch.as_tensor(data.posterior["theta_1"].values[0]).float(),
        posterior.sample((500,), y=y, epsilon=2.0, seed=0)[:, 0].cpu(),
    )
    assert view.to_arviz(10, y=y).posterior.attrs["epsilon"] == 3.0
    view.save(tmp_path / "view.pt")
    assert dpsbi.load_posterior(tmp_path / "view.pt")._default_epsilon == 3.0


def test_a_posterior_at_one_epsilon_takes_only_that_one(tmp_path):
    task = load("conjugate_gaussian", epsilon=1.0, **GAUSS)
    posterior = dpsbi.SPPE(task, amortized=True, rounds=1, sims_per_round=100, **TINY).run()
    assert "epsilon_range" not in posterior.metadata()["options"]  # files as before
    posterior.sample((5,), epsilon=1.0)
    with pytest.raises(ValueError, match="trained at the task's epsilon = 1 only"):
        posterior.sample((5,), epsilon=2.0)
    with pytest.raises(ValueError, match="trained at the task's epsilon = 1 only"):
        posterior.set_default_epsilon(2.0)


@pytest.fixture(scope="module")
def poisson_task():
    return load("poisson_counts", epsilon=0.2)


def _poisson_exact(y: float, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and sd of the exact posterior, a mixture of Gamma(a_k, b) with weights w_k, at release ``y`` and
    ``epsilon``: ``sum w_k a_k / b`` and ``sum w_k a_k (a_k + 1) / b^2 - mean^2``."""
    exact = poisson_exact(torch.tensor([y]), epsilon)
    w = exact.mixture_distribution.probs.double()
    a = exact.component_distribution.base_dist.concentration[:, 0].double()
    b = exact.component_distribution.base_dist.rate[:, 0].double()
    mean = (w * a / b).sum()
    sd = ((w * a * (a + 1) / b**2).sum() - mean**2).sqrt()
    return mean.reshape(1).float(), sd.reshape(1).float()


@pytest.mark.parametrize("widening", [None, {"classifier_steps": 500}], ids=["plain", "widened"])
def test_poisson_counts_over_epsilon_match_the_exact_posteriors(poisson_task, widening):
    """Plain, and with widened training releases (``widening``): its weights keep the exact posterior the optimum."""
    posterior = dpsbi.SPPE(
        poisson_task,
        amortized=True,
        epsilon_range=(0.1, 1.0),
        rounds=1,
        sims_per_round=1000,
        inner_samples=8,
        qmc=True,
        flow=dict(transforms=1, hidden=32),
        training=dict(max_steps=300),
        widening=widening,
        progress=False,
    ).run()
    releases = torch.tensor([[18.0], [27.0], [33.0]])
    for epsilon in (0.12, 0.3, 0.9):  # Laplace scales 8.3 to 1.1 against the prior's sd of 5
        draws = posterior.sample_batched((4000,), y=releases, epsilon=epsilon, seed=0)
        for b, y in enumerate(releases[:, 0].tolist()):
            _close_to(draws[:, b], *_poisson_exact(y, epsilon), 0.25)


def test_sple_over_epsilon_matches_the_exact_poisson_posteriors(poisson_task):
    posterior = dpsbi.SPLE(
        poisson_task,
        amortized=True,
        epsilon_range=(0.1, 1.0),
        rounds=1,
        sims_per_round=1000,
        inner_samples=8,
        flow=dict(transforms=1, hidden=32),
        training=dict(max_steps=300),
        mcmc=dict(num_chains=100),
        progress=False,
    ).run()
    assert posterior.epsilon_range == (0.1, 1.0) and posterior.flow.context_dim == 2
    for y, epsilon in ((18.0, 0.12), (27.0, 0.9)):
        draws = posterior.sample((2000,), y=torch.tensor([y]), epsilon=epsilon, seed=0)
        _close_to(draws, *_poisson_exact(y, epsilon), 0.25)
    with pytest.raises(ValueError, match="outside the range"):
        posterior.sample((10,), y=torch.tensor([20.0]), epsilon=2.0)


def test_a_users_model_trains_over_epsilon_in_one_fit():
    """``from_simulator`` with a Laplace mechanism and no observed release: one fit over epsilon in (0.1, 1)."""

    def simulator(theta, rng):
        return theta + 0.3 * torch.randn(theta.shape, generator=rng)

    task = dpsbi.tasks.from_simulator(
        dpsbi.tasks.normal([0.0, 0.0], [1.0, 1.0]), simulator, Laplace(0.3, 0.2, dim=2), None
    )
    posterior = dpsbi.SPPE(
        task, amortized=True, epsilon_range=(0.1, 1.0), rounds=2, sims_per_round=200, **TINY
    ).run()
    draws = posterior.sample_batched((100,), y=torch.zeros(4, 2), epsilon=torch.tensor([0.1, 0.3, 0.6, 1.0]))
    assert draws.shape == (100, 4, 2) and torch.isfinite(draws).all()


def test_the_command_line_takes_amortized_and_epsilon_range():
    """``method.amortized=true method.epsilon_range=[low,high]`` reach the estimator; a range that leaves out the
    task's epsilon (where a run scores the posterior) is a config error."""
    from hydra import compose, initialize_config_dir

    from dpsbi.experiment import ConfigError, config_dir, plan

    base = ["task=conjugate_gaussian", "method=sppe", "companions=[]", "method.amortized=true"]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        ((_, settings),) = plan(compose("config", overrides=[*base, "method.epsilon_range=[0.5,2]"])).methods
        assert settings["amortized"] is True and list(settings["epsilon_range"]) == [0.5, 2]
        assert settings["training"]["batch_size"] is None  # SPPE's amortized batch, as in the API
        assert settings["training"]["weight_decay"] is None  # and its weight decay
        with pytest.raises(ConfigError, match="does not hold the task's epsilon"):
            plan(compose("config", overrides=[*base, "method.epsilon_range=[2,4]"]))


@pytest.mark.parametrize("noise", ["discrete_laplace", "discrete_gaussian"])
def test_the_discrete_poisson_release_has_the_gamma_mixture_posterior(noise):
    """``poisson_counts(noise="discrete_laplace")`` and ``"discrete_gaussian"`` release integers; the exact
    posterior (the Gamma mixture) is checked against quadrature of prior x sum_s Pois(s) p(y - s) with the
    mechanism's own pmf on a theta grid."""
    for epsilon, y in ((0.15, 31.0), (1.5, 19.0)):
        task = load("poisson_counts", epsilon=epsilon, noise=noise)
        assert task.mechanism.lattice == 1.0 and float(task.y_obs) == round(float(task.y_obs))
        theta = torch.linspace(0.5, 80, 4000, dtype=torch.float64)
        s = torch.arange(0, 400, dtype=torch.float64)
        log_pois = s * theta[:, None].log() - theta[:, None] - torch.lgamma(s + 1)
        log_mech = task.mechanism.log_prob(torch.tensor([[y]]), s[:, None].float()).double()
        log_post = task.prior.log_prob(theta[:, None].float()).double() + torch.logsumexp(
            log_pois + log_mech, -1
        )
        w = torch.softmax(log_post, 0)
        exact = task.exact_posterior(torch.tensor([y]))
        assert abs(float((w * theta).sum()) - float(exact.mean)) < 1e-3
        assert abs(float((w * theta**2).sum() - (w * theta).sum() ** 2) - float(exact.variance)) < 1e-2
    with pytest.raises(ValueError, match="noise must be one of"):
        load("poisson_counts", noise="gaussian")
