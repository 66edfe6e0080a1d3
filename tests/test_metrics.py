"""Metrics against exact answers: KDE vs scipy, NLOG vs the smoothed Gaussian density, LMD vs the noncentral
chi median, C2ST/MMD at and away from the null, SBC/TARP of exact and miscalibrated posteriors."""

import math

import pytest
import scipy.stats as st
import torch
from torch.distributions import ExpTransform

import dpsbi
from dpsbi import metrics


def test_kde_matches_scipy():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 3, generator=g, dtype=torch.float64) * torch.tensor(
        [1.0, 2.0, 0.5], dtype=torch.float64
    )
    points = torch.randn(7, 3, generator=g, dtype=torch.float64)
    expected = st.gaussian_kde(x.numpy().T).logpdf(points.numpy().T)
    assert torch.allclose(metrics.kde_log_prob(x, points), torch.from_numpy(expected), rtol=0, atol=1e-10)


def _smoothed_gaussian_nlog(z: torch.Tensor, point: torch.Tensor) -> tuple[float, float]:
    """For draws z ~ N(0, I_d): the KDE's expected -log density at ``point``, -log N(point; 0, (1 + h^2) I),
    and the Monte Carlo standard error of the KDE's log density (relative sd of the mean kernel value)."""
    n, d = z.shape
    h2 = n ** (-2.0 / (d + 4))
    expected = -st.multivariate_normal(torch.zeros(d).numpy(), (1 + h2) * torch.eye(d).numpy()).logpdf(
        point.numpy()
    )
    cov = torch.atleast_2d(torch.cov(z.T)) * h2
    kernel = torch.distributions.MultivariateNormal(point, cov).log_prob(z).exp()
    return float(expected), float(kernel.std() / (kernel.mean() * math.sqrt(n)))


def test_nlog_is_minus_log_kde_density_at_truth():
    z = torch.randn(4000, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    point = torch.tensor([0.5, -0.3], dtype=torch.float64)
    expected, se = _smoothed_gaussian_nlog(z, point)
    assert abs(metrics.nlog(z, point[None]) - expected) < 4 * se + 0.01  # + covariance-estimate bias


def test_nlog_with_transform_carries_the_jacobian():
    """Log-normal draws theta = exp(z): the KDE lives in z, the density of theta is divided by theta."""
    z = torch.randn(4000, 1, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    theta0 = torch.tensor([[1.7]], dtype=torch.float64)
    expected, se = _smoothed_gaussian_nlog(z, theta0.log()[0])
    got = metrics.nlog(z.exp(), theta0, ExpTransform())
    assert abs(got - (expected + math.log(1.7))) < 4 * se + 0.01


def test_kde_refuses_degenerate_draws():
    with pytest.raises(ValueError, match="singular"):
        metrics.kde_log_prob(torch.ones(50, 2), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="needs more than 3 draws"):
        metrics.kde_log_prob(torch.randn(3, 3), torch.zeros(1, 3))


def test_lmd_matches_noncentral_chi_median():
    """Draws all at theta: y_sim ~ N(theta, v I), so |y_sim - y_obs|^2 / v is noncentral chi-square."""
    task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
    n, d = 4000, task.dim_theta
    theta = torch.full((n, d), 0.2)
    v = 1.0 + task.mechanism.sigma**2
    nc = float(((theta[0] - task.y_obs[0]) ** 2).sum()) / v
    median = math.sqrt(v * st.ncx2.ppf(0.5, d, nc))
    density = st.ncx2.pdf(median**2 / v, d, nc) * 2 * median / v  # of the distance at its median
    se = 1 / (2 * density * math.sqrt(n))
    got = metrics.lmd(task, theta, generator=torch.Generator().manual_seed(3))
    assert abs(math.exp(got) - median) < 4 * se


def test_lmd_checks_the_release():
    task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
    with pytest.raises(ValueError, match="release must have shape"):
        metrics.lmd(task, torch.zeros(10, 2), y=torch.zeros(1, 3))


def test_c2st_and_mmd_at_and_away_from_the_null():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(300, 2, generator=g), torch.randn(300, 2, generator=g)
    assert abs(metrics.c2st(a, b) - 0.5) < 4 * math.sqrt(0.25 / 600)
    assert metrics.c2st(a, b + 3.0) > 0.95
    assert metrics.mmd(a, b + 1.0) > 10 * abs(metrics.mmd(a, b))


def test_c2st_names_bad_draws_before_sbi_sees_them():
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(100, 2, generator=g), torch.randn(100, 2, generator=g)
    b[[3, 50, 70], 1] = math.nan
    b[80, 0] = math.inf
    with pytest.raises(ValueError, match=r"c2st: b has 4 of 100 rows with NaN/inf"):
        metrics.c2st(a, b)
    with pytest.raises(ValueError, match=r"c2st: a has 3 rows; it needs at least 5"):
        metrics.c2st(a[:3], a)
    with pytest.raises(ValueError, match=r"c2st: a and b must be \(n, d\) and \(m, d\)"):
        metrics.c2st(a, a[:, :1])


class _ScaledExact:
    """The conjugate task's exact posterior with its spread scaled by ``width`` (1: exact; amortized)."""

    def __init__(self, task, width: float) -> None:
        self.task, self.width = task, width

    def sample(self, sample_shape, y=None):
        exact = self.task.exact_posterior(y)
        return exact.mean + self.width * (exact.sample(sample_shape) - exact.mean)


@pytest.fixture(scope="module")
def conjugate():
    return dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)


def test_calibration_accepts_the_exact_posterior(conjugate):
    result = metrics.calibration(
        _ScaledExact(conjugate, 1.0), conjugate, num_runs=200, num_posterior_samples=500, progress=False
    )
    # Under calibration the KS p-values are uniform: with a fixed seed each is below 1e-3 with probability 1e-3.
    assert min(result["sbc_ks_pvalues"]) > 1e-3
    assert result["tarp_ks_pvalue"] > 1e-3


@pytest.mark.parametrize("width, sign", [(0.5, -1), (2.0, 1)])
def test_calibration_rejects_too_narrow_and_too_wide(conjugate, width, sign):
    result = metrics.calibration(
        _ScaledExact(conjugate, width), conjugate, num_runs=200, num_posterior_samples=500, progress=False
    )
    assert min(result["sbc_ks_pvalues"]) < 1e-4
    assert sign * result["tarp_atc"] > 0.05  # TARP: below the diagonal when too narrow, above when too wide


def test_calibration_needs_enough_runs(conjugate):
    with pytest.raises(ValueError, match="num_runs >= 10"):
        metrics.calibration(_ScaledExact(conjugate, 1.0), conjugate, num_runs=5, progress=False)


def test_calibration_of_a_flow_posterior_costs_one_flow_call(conjugate, monkeypatch):
    """SBC and TARP share one ``sample_batched`` call, which is one flow call for 50 runs x 100 draws; the
    result is fixed by the seed."""
    from dpsbi.inference import ConditionalFlow, FlowPosterior, FlowSettings

    theta = conjugate.prior.sample((50,))
    flow = ConditionalFlow(FlowSettings(transforms=1, hidden=8), theta, conjugate.simulate_release(theta))
    post = FlowPosterior(conjugate, flow, "SPPE", amortized=True)
    rows = []
    sample = flow.sample_and_log_prob  # the flow's drawing pass
    monkeypatch.setattr(
        flow,
        "sample_and_log_prob",
        lambda noise, context: rows.append(noise.shape[:-1].numel()) or sample(noise, context),
    )
    result = metrics.calibration(post, conjugate, num_runs=50, num_posterior_samples=100, progress=False)
    assert rows == [50 * 100]
    assert (
        len(result["sbc_ks_pvalues"]) == 2
        and math.isfinite(result["tarp_atc"])
        and 0 <= result["tarp_ks_pvalue"] <= 1
    )
    assert (
        metrics.calibration(post, conjugate, num_runs=50, num_posterior_samples=100, progress=False) == result
    )


def test_spread_ratios_are_exact_on_affine_copies():
    """Draws ``a x + b`` against ``x``: every parameter's sd and central 95 % width scale by ``|a|`` exactly (sample
    sd and linearly interpolated quantiles are affine-equivariant), whatever the draws."""
    x = (
        torch.randn(1000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) ** 3
    )  # heavy tails
    scale = torch.tensor([1.0, 2.5, 0.3], dtype=torch.float64)
    ratios = metrics.spread_ratios(x * scale - torch.tensor([4.0, 0.0, 1.0]), x)
    assert set(ratios) == set(metrics.SPREADS)
    for name in metrics.SPREADS:
        assert ratios[name] == pytest.approx(scale.tolist(), rel=1e-12)


def test_the_width_ratio_sees_a_far_tail_the_sd_ratio_reads_differently():
    """A mixture of 97 % N(0, 1) and 3 % N(0, 10^2) against N(0, 1): the width ratio is that of the mixture's
    quantiles, the sd ratio that of its sd, sqrt(0.97 + 3) = 1.99 (both within 4 Monte Carlo sd)."""
    g = torch.Generator().manual_seed(1)
    n = 200_000
    ref = torch.randn(n, 1, generator=g, dtype=torch.float64)
    wide = torch.randn(n, 1, generator=g, dtype=torch.float64) * torch.where(
        torch.rand(n, 1, generator=g) < 0.03, 10.0, 1.0
    )
    ratios = metrics.spread_ratios(wide, ref)
    mixture = lambda q: st.norm.cdf(q) * 0.97 + st.norm.cdf(q / 10) * 0.03  # noqa: E731
    from scipy.optimize import brentq

    width = brentq(lambda q: mixture(q) - 0.975, 0, 50) / st.norm.ppf(0.975)  # symmetric: the upper ends
    assert ratios["sd_ratio"][0] == pytest.approx(math.sqrt(0.97 + 0.03 * 100), rel=0.03)
    assert ratios["width95_ratio"][0] == pytest.approx(width, rel=0.02)


def test_mean_shift_is_exact_on_shifted_copies_and_blind_to_spread():
    """Draws ``x + c sd(x)`` against ``x``: the shift is ``c`` exactly; ``2 x`` (same mean, twice the spread) has
    none, where the spread ratios see it."""
    x = torch.randn(1000, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64) ** 3
    c = torch.tensor([0.5, -2.0, 0.0], dtype=torch.float64)
    assert metrics.mean_shift(x + c * x.std(0), x) == pytest.approx(c.tolist(), abs=1e-12)
    centred = x - x.mean(0)
    assert metrics.mean_shift(2 * centred, centred) == pytest.approx([0.0] * 3, abs=1e-12)
    with pytest.raises(ValueError, match="mean_shift: a and b must be"):
        metrics.mean_shift(torch.zeros(10, 2), torch.zeros(10, 3))


def test_spread_ratios_refuse_mismatched_draws_in_one_line():
    with pytest.raises(ValueError, match="spread_ratios: a and b must be") as error:
        metrics.spread_ratios(torch.zeros(10, 2), torch.zeros(10, 3))
    assert "\n" not in str(error.value)
