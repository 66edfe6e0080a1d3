"""sbi's own diagnostics and plots, called unchanged on a dpsbi posterior: ``run_sbc`` / ``check_sbc``,
``run_tarp`` / ``check_tarp``, ``get_nltp``, ``pairplot`` / ``marginal_plot`` / ``conditional_pairplot`` and the
local C2ST (``LC2ST``); and sbi's keywords (``x=``, ``show_progress_bars``, ...) on every method that takes
dpsbi's ``y=``.

The posterior is an amortized SPPE (``rounds=1``: valid at any release, so no warning over the prior
predictive) of the conjugate Gaussian toy, whose exact posterior is known; ~5 s to train, once per module.
"""

import math
import warnings

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from sbi.analysis import conditional_pairplot, marginal_plot, pairplot  # noqa: E402
from sbi.diagnostics import LC2ST, check_sbc, check_tarp, get_nltp, run_sbc, run_tarp  # noqa: E402
from sbi.diagnostics.sbc import check_uniformity_frequentist  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.inference import ConditionalFlow, FlowSettings, LikelihoodPosterior  # noqa: E402

#: Pairs (theta_i, y_i) from the prior predictive for SBC and TARP, and posterior draws per release.
N, M = 200, 500
RELEASES = torch.tensor([[0.0, 0.0], [2.0, -1.0], [-2.0, 1.5]])


@pytest.fixture(scope="module")
def task():
    return dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0)


@pytest.fixture(scope="module")
def posterior(task):
    return dpsbi.SPPE(
        task,
        rounds=1,
        sims_per_round=1000,
        seed=0,
        progress=False,
        flow=dict(transforms=2, hidden=16),
        training=dict(max_steps=300),
    ).run()


@pytest.fixture(scope="module")
def calibration(task):
    """``N`` parameters drawn from the prior and their releases, ``(N, 2)`` each, seeded."""
    generator = torch.Generator().manual_seed(2)
    theta = torch.randn(N, task.dim_theta, generator=generator)  # the prior is N(0, I)
    return theta, task.simulate_release(theta, generator=generator)


def _quiet(capfd) -> None:
    """sbi printed nothing (no bars, no messages) on stdout or stderr."""
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)


def test_run_sbc_and_check_sbc_calibrate_a_dpsbi_posterior(posterior, task, calibration, capfd):
    """SBC ranks are uniform for a calibrated posterior: KS p-values above 0.01 per parameter (0.49 and 0.66
    here; the exact posterior gives 0.4-0.7 on these pairs), and the C2STs of ranks against uniform and of the
    data-averaged posterior against the prior stay near 0.5. The same posterior at the wrong releases
    (``y + 2``) is caught (p < 1e-6), so the check can fail. sbi samples through ``sample_batched(x=...,
    show_progress_bars=...)``: no fallback warning."""
    theta, y = calibration
    torch.manual_seed(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ranks, dap = run_sbc(theta, y, posterior, num_posterior_samples=M, show_progress_bar=False)
    assert not [w for w in caught if "Batched sampling not implemented" in str(w.message)]
    assert ranks.shape == (N, 2) and dap.shape == (N, 2)
    checks = check_sbc(ranks, task.prior.sample((N,)), dap, num_posterior_samples=M)
    assert (checks["ks_pvals"] > 0.01).all(), checks
    assert ((checks["c2st_ranks"] - 0.5).abs() < 0.1).all() and ((checks["c2st_dap"] - 0.5).abs() < 0.1).all()

    wrong, _ = run_sbc(theta, y + 2.0, posterior, num_posterior_samples=M, show_progress_bar=False)
    assert (check_uniformity_frequentist(wrong, M) < 1e-6).all()  # check_sbc's KS p-values, without its C2STs
    _quiet(capfd)


def test_run_sbc_unbatched_and_expected_coverage(posterior, calibration, capfd):
    """Unbatched, sbi draws release by release through ``sample(sample_shape, x=x, show_progress_bars=False)``
    under its own ``torch.manual_seed``; with ``reduce_fns=posterior.log_prob`` it ranks densities (expected
    coverage, calling ``log_prob(theta, x)``). Both sets of ranks pass the KS test of uniformity (p = 0.23,
    0.84 and 0.39 here)."""
    theta, y = calibration
    torch.manual_seed(5)
    ranks, _ = run_sbc(
        theta, y, posterior, num_posterior_samples=M, show_progress_bar=False, use_batched_sampling=False
    )
    coverage, _ = run_sbc(
        theta, y, posterior, num_posterior_samples=M, reduce_fns=posterior.log_prob, show_progress_bar=False
    )
    assert ranks.shape == (N, 2) and coverage.shape == (N, 1)
    assert (check_uniformity_frequentist(torch.cat([ranks, coverage], 1), M) > 0.01).all()
    _quiet(capfd)


def test_run_tarp_and_check_tarp_find_no_dispersion_error(posterior, calibration, capfd):
    """TARP's ATC (area between the expected-coverage curve and the diagonal above alpha = 0.5) is near 0 for
    a calibrated posterior. With N coverage values uniform on [0, 1] the curve is their empirical CDF F_N, and
    ATC ~ int_{1/2}^1 (F_N(a) - a) da has standard deviation sqrt(5/192 / N) = 0.0114 at N = 200 (a
    Brownian bridge's integral); 0.05 is 4.4 of them, leaving room for the flow's own error (ATC = -0.009 here)."""
    theta, y = calibration
    torch.manual_seed(4)  # TARP's reference points and sbi's unseeded sampling use torch's global stream
    ecp, alpha = run_tarp(theta, y, posterior, num_posterior_samples=M, show_progress_bar=False)
    assert ecp.shape == alpha.shape == (N // 10 + 1,)
    atc, ks_pvalue = check_tarp(ecp, alpha)
    assert abs(atc) < 0.05, atc
    assert ks_pvalue > 0.05
    _quiet(capfd)


def test_get_nltp_is_the_negative_log_density_of_the_true_parameters(posterior, task, calibration):
    """sbi's ``get_nltp`` calls ``potential(theta, x=y)`` (dpsbi is not sbi's DirectPosterior, so it also
    warns that the values are unnormalized: here they are normalized). Its mean over the prior predictive
    exceeds the exact posterior's by the mean KL divergence, small for a good posterior."""
    theta, y = calibration
    with pytest.warns(UserWarning, match="not normalized"):
        nltp = get_nltp(theta[:50], y[:50], posterior)
    assert torch.allclose(
        nltp, torch.stack([-posterior.log_prob(theta[i], y=y[i]) for i in range(50)]), atol=1e-5
    )
    exact = torch.stack([-task.exact_posterior(y[i]).log_prob(theta[i]) for i in range(50)])
    assert abs(float(nltp.mean() - exact.mean())) < 0.1


def test_sbi_plots_draw_a_dpsbi_posterior(posterior, task):
    """``pairplot`` and ``marginal_plot`` draw dpsbi's samples; ``conditional_pairplot`` evaluates
    ``posterior.log_prob`` (at the default release) on a grid: its image is that density, scaled to a maximum
    of 1, and its centre of mass lies within 0.1 of the exact posterior's mean (0.75 standard deviations wide:
    the mean of this small flow is within 0.02, its shape less exact)."""
    exact = task.exact_posterior(task.y_obs)
    sd = float(exact.covariance_matrix[0, 0].sqrt())
    limits = torch.stack([exact.mean - 3 * sd, exact.mean + 3 * sd], dim=-1)  # (2, 2)
    samples = posterior.sample((2000,), x=task.y_obs, seed=0)
    try:
        fig, axes = pairplot(samples, limits=limits, points=exact.mean[None], labels=task.parameter_names)
        assert axes.shape == (2, 2) and len(axes[0, 0].patches) > 0  # the diagonal histograms
        fig, axes = marginal_plot(samples, limits=limits)
        assert len(axes[0].patches) > 0
        fig, axes = conditional_pairplot(posterior, condition=exact.mean[None], limits=limits, resolution=40)
        image = torch.as_tensor(
            axes[0, 1].images[0].get_array()
        )  # image[i, j]: theta_1 = g1[i], theta_2 = g2[j]
        g1, g2 = (torch.linspace(float(limits[k, 0]), float(limits[k, 1]), 40) for k in range(2))
        grid = torch.stack(torch.meshgrid(g1, g2, indexing="ij"), -1)
        log_prob = posterior.log_prob(grid)
        assert image.shape == (40, 40) and torch.allclose(image, (log_prob - log_prob.max()).exp(), atol=1e-4)
        centre = (image[..., None] * grid).sum((0, 1)) / image.sum()
        assert (centre - exact.mean).abs().max() < 0.1
    finally:
        plt.close("all")


def test_local_c2st_accepts_the_posterior_and_rejects_a_wrong_one(posterior, task):
    """sbi's L-C2ST at the observed release, with a random forest (20 trees, leaves of >= 20 points, seeded:
    ~1 s to train where sbi's default MLP took 5) on 600 pairs against 20 permutation nulls. The posterior
    is not rejected at level 0.05 (p = 0.45); the same posterior at the wrong releases (``y + 2``) is, with a
    statistic over twice the largest of the null's. (On 1000 pairs the test starts to see this small flow's
    flaw, a standard deviation of theta_2 15 % too wide at y_obs: p fell to 0-0.05.)"""
    generator = torch.Generator().manual_seed(5)
    theta = torch.randn(600, task.dim_theta, generator=generator)  # the prior is N(0, I)
    y = task.simulate_release(theta, generator=generator)
    y_o = task.y_obs
    settings = dict(
        num_trials_null=20,
        classifier="random_forest",
        classifier_kwargs=dict(n_estimators=20, min_samples_leaf=20, random_state=0),
    )
    for shift, rejected in ((0.0, False), (2.0, True)):
        draws = posterior.sample_batched((1,), x=y + shift, seed=4)[0]  # one draw per release
        # by position, and not chained: sbi 0.26 calls the first thetas= and its training returns None
        lc2st = LC2ST(theta, y, draws, **settings)
        lc2st.train_on_observed_data(verbosity=0)
        lc2st.train_under_null_hypothesis(verbosity=0)
        theta_o = posterior.sample((1000,), x=y_o + shift, seed=1)
        assert lc2st.reject_test(theta_o, y_o, alpha=0.05) == rejected, lc2st.p_value(theta_o, y_o)
        if rejected:
            null = lc2st.get_statistics_under_null_hypothesis(theta_o, y_o)
            null = getattr(null, "scores", null)  # sbi 0.26 returns the scores themselves
            assert lc2st.get_statistic_on_observed_data(theta_o, y_o) > 2 * null.max()


# ---- sbi's keywords on dpsbi's methods -------------------------------------------------------------------


def test_x_is_y_under_sbis_name_in_every_method(posterior, task):
    """The same release as ``y=`` or as sbi's ``x=`` gives the same draws and densities (same seed); giving
    both with the same values is allowed."""
    y, theta = task.y_obs, torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(posterior.sample((5,), x=y, seed=0), posterior.sample((5,), y=y, seed=0))
    assert torch.equal(posterior.sample((5,), y=y, x=y.clone(), seed=0), posterior.sample((5,), y=y, seed=0))
    assert torch.equal(
        posterior.sample_batched((4,), x=RELEASES, seed=1), posterior.sample_batched((4,), RELEASES, seed=1)
    )
    assert torch.equal(posterior.log_prob(theta, x=RELEASES[1]), posterior.log_prob(theta, y=RELEASES[1]))
    assert torch.equal(posterior.potential(theta, x=RELEASES[1]), posterior.log_prob(theta, RELEASES[1]))
    batch = theta[:3].expand(2, 3, 2)
    assert torch.equal(
        posterior.log_prob_batched(batch, x=RELEASES), posterior.log_prob_batched(batch, RELEASES)
    )
    quick = dict(num_init=50, num_to_optimize=2, steps=3, seed=1)
    assert torch.equal(posterior.map(x=RELEASES[2], **quick), posterior.map(y=RELEASES[2], **quick))


def test_y_and_x_with_different_values_is_a_type_error(posterior, task):
    theta, other = torch.zeros(3, 2), task.y_obs + 1.0
    calls = {
        "sample": lambda: posterior.sample((2,), y=task.y_obs, x=other),
        "sample_batched": lambda: posterior.sample_batched((2,), RELEASES, x=RELEASES[:2]),
        "log_prob": lambda: posterior.log_prob(theta, task.y_obs, x=other),
        "potential": lambda: posterior.potential(theta, task.y_obs, x=other),
        "log_prob_batched": lambda: posterior.log_prob_batched(theta, RELEASES, x=RELEASES + 1),
        "map": lambda: posterior.map(y=task.y_obs, x=other, num_init=5, num_to_optimize=1, steps=0),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=f"^{name}: give the release as y= or as sbi's x=, not both"):
            call()
    for name in ("sample_batched", "log_prob_batched"):  # these need releases: neither y nor x is a TypeError
        with pytest.raises(TypeError, match=f"{name} needs the releases"):
            getattr(posterior, name)(torch.Size((2,)) if name == "sample_batched" else theta)
    with pytest.raises(TypeError, match="unexpected keyword"):  # sbi's keywords are named, not **kwargs
        posterior.sample((2,), x=task.y_obs, sample_with="mcmc")


def test_sbis_sampling_keywords_change_no_draw(posterior, task):
    """``show_progress_bars``, ``max_sampling_batch_size`` and ``reject_outside_prior`` (sbi's) leave a flow
    posterior's draws as they are; ``track_gradients`` makes a density differentiable in ``theta``, with the
    gradient of its central differences."""
    sbi_keywords = dict(show_progress_bars=False, max_sampling_batch_size=7, reject_outside_prior=False)
    assert torch.equal(
        posterior.sample((5,), x=task.y_obs, seed=2, **sbi_keywords), posterior.sample((5,), seed=2)
    )
    assert torch.equal(
        posterior.sample_batched((5,), x=RELEASES, seed=2, **sbi_keywords),
        posterior.sample_batched((5,), RELEASES, seed=2),
    )
    assert torch.equal(
        posterior.map(x=task.y_obs, num_init=20, num_to_optimize=2, steps=2, seed=0, show_progress_bars=True),
        posterior.map(num_init=20, num_to_optimize=2, steps=2, seed=0),
    )
    assert not posterior.log_prob(torch.zeros(2, 2)).requires_grad
    theta = torch.tensor([[1.1, -0.2]], requires_grad=True)
    (gradient,) = torch.autograd.grad(
        posterior.log_prob(theta, x=task.y_obs, track_gradients=True).sum(), theta
    )
    step = 1e-2 * torch.eye(2)
    central = (posterior.log_prob(theta.detach() + step) - posterior.log_prob(theta.detach() - step)) / 2e-2
    assert torch.allclose(gradient[0], central, rtol=1e-2, atol=1e-2)
    batched = posterior.log_prob_batched(theta[None].expand(1, 1, 2), x=task.y_obs, track_gradients=True)
    assert batched.requires_grad and math.isfinite(float(batched))


def test_show_progress_bars_switches_a_likelihood_posteriors_sampler_bars(task, capfd):
    """A likelihood posterior shows its slice sampler's bars (on stderr) when sbi's ``show_progress_bars``
    asks, whatever its own ``progress`` setting, and hides them when told; the draws stay the same."""
    theta = task.prior.sample((50,))
    flow = ConditionalFlow(FlowSettings(transforms=1, hidden=8), task.simulate_release(theta), theta)
    mcmc = dict(num_chains=10, warmup=3, init_candidates=50)
    quiet = LikelihoodPosterior(task, flow, "SPLE", mcmc=mcmc, progress=False)
    loud = LikelihoodPosterior(task, flow, "SPLE", mcmc=mcmc, progress=True)
    capfd.readouterr()
    silent = loud.sample((20,), seed=0, show_progress_bars=False)
    assert capfd.readouterr().err == "" and quiet.progress is False and loud.progress is True
    shown = quiet.sample_batched((20,), x=task.y_obs, seed=0, show_progress_bars=True)[:, 0]
    assert "slice sampling" in capfd.readouterr().err and quiet.progress is False  # restored after the call
    assert torch.equal(silent, shown)
