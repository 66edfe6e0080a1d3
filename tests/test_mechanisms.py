"""Mechanisms: inverse-CDF maps reproduce their distributions, densities are normalized, DP holds."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

import dpsbi
from dpsbi.mechanisms import (
    BinomialCurve,
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    RandomizedResponse,
    SmoothSensitivityLaplace,
    binomial_icdf,
)
from dpsbi.mechanisms.gaussian import analytic_delta

pytestmark = pytest.mark.usefixtures("float64")
SEED = 1234


def draws(mech, s, n, seed=SEED):
    g = torch.Generator().manual_seed(seed)
    return mech.sample(s.expand(n, mech.dim), generator=g)


def test_laplace_inverse_cdf_matches_distribution():
    mech = Laplace(epsilon=0.5, sensitivity=2.0, dim=1)
    y = draws(mech, torch.tensor([3.0]), 20000)
    assert stats.kstest(y[:, 0].numpy(), stats.laplace(loc=3.0, scale=4.0).cdf).pvalue > 1e-3


def test_gaussian_inverse_cdf_matches_distribution():
    mech = Gaussian(epsilon=1.0, delta=1e-5, sensitivity=1.0)
    y = draws(mech, torch.tensor([-1.0]), 20000)
    assert stats.kstest(y[:, 0].numpy(), stats.norm(loc=-1.0, scale=mech.sigma).cdf).pvalue > 1e-3


def test_binomial_curve_matches_binomial_chi_square():
    mech = BinomialCurve(trials=50, population=1000, dim=3, epsilon=5.0)
    s = torch.tensor([0.0, 400.0, 1000.0])
    k = (draws(mech, s, 40000) * 50).round().long()
    p = mech.probability(s).numpy()
    for t in range(3):
        observed = np.bincount(k[:, t].numpy(), minlength=51)
        expected = 40000 * stats.binom.pmf(np.arange(51), 50, p[t])
        keep = expected > 5  # pool the sparse tail cells
        obs = np.append(observed[keep], observed[~keep].sum())
        exp = np.append(expected[keep], expected[~keep].sum())
        chi2 = ((obs - exp) ** 2 / np.maximum(exp, 1e-12)).sum()
        assert stats.chi2.sf(chi2, len(obs) - 1) > 1e-3


def test_randomized_response_flip_rate():
    mech = RandomizedResponse(epsilon=1.0, dim=4)
    s = torch.tensor([0.0, 1.0, 1.0, 0.0])
    y = draws(mech, s, 20000)
    flips = int((y != s).sum())
    p_flip = 1 / (1 + math.e)
    assert stats.binomtest(flips, y.numel(), p_flip).pvalue > 1e-3


@pytest.mark.parametrize("n", [1, 7, 1000])
def test_binomial_icdf_equals_scipy(n):
    g = torch.Generator().manual_seed(n)
    u = torch.rand(5000, generator=g)
    p = torch.rand(5000, generator=g) * 0.9999 + 1e-5
    assert np.array_equal(binomial_icdf(u, n, p).numpy(), stats.binom.ppf(u.numpy(), n, p.numpy()))


@pytest.mark.parametrize("n", [7, 1000, 10_000])
def test_binomial_icdf_equals_scipy_near_probabilities_0_and_1(n):
    """The window's ``k logit p + n log(1 - p)`` form of the log pmf loses nothing where ``p`` is within 1e-9 of 0
    or 1 (``log(1 - p)`` large, ``logit p`` large)."""
    g = torch.Generator().manual_seed(n)
    u = torch.rand(4000, generator=g, dtype=torch.float64)
    near = 10 ** -torch.empty(2000, dtype=torch.float64).uniform_(3, 9, generator=g)
    p = torch.cat([near, 1 - near])
    assert np.array_equal(binomial_icdf(u, n, p).numpy(), stats.binom.ppf(u.numpy(), n, p.numpy()))


def test_binomial_icdf_broadcasts_shared_probabilities():
    g = torch.Generator().manual_seed(0)
    u, p = torch.rand(20, 16, 3, generator=g), torch.rand(20, 1, 3, generator=g)
    k = binomial_icdf(u, 30, p)
    assert k.shape == (20, 16, 3)
    assert np.array_equal(k.numpy(), stats.binom.ppf(u.numpy(), 30, p.numpy()))


def test_continuous_log_probs_are_normalized():
    grid = torch.linspace(-80, 80, 400001)
    for mech in [Laplace(1.0, 1.0), Gaussian(0.5, 1e-6, 1.0, calibration="classic")]:
        dens = mech.log_prob(grid[:, None], torch.tensor([[0.7]])).exp()
        assert torch.trapezoid(dens, grid).item() == pytest.approx(1.0, abs=1e-6)


def test_discrete_log_probs_are_normalized():
    mech = BinomialCurve(trials=40, population=500, dim=1, epsilon=2.0)
    y = torch.arange(41.0)[:, None] / 40
    assert mech.log_prob(y, torch.tensor([[123.0]])).exp().sum().item() == pytest.approx(1.0, abs=1e-12)
    rr = RandomizedResponse(0.7, dim=3)
    outcomes = torch.tensor([[a, b, c] for a in (0.0, 1.0) for b in (0.0, 1.0) for c in (0.0, 1.0)])
    assert rr.log_prob(outcomes, torch.tensor([[1.0, 0.0, 1.0]])).exp().sum().item() == pytest.approx(1.0)


def test_laplace_log_likelihood_ratio_bounded_by_epsilon():
    mech = Laplace(epsilon=0.8, sensitivity=0.3, dim=3)
    g = torch.Generator().manual_seed(0)
    s = torch.randn(200, 3, generator=g)
    step = torch.randn(200, 3, generator=g)
    neighbour = s + 0.3 * step / step.abs().sum(-1, keepdim=True)  # ||s - s'||_1 = sensitivity
    y = torch.randn(300, 1, 3, generator=g) * 3
    llr = (mech.log_prob(y, s) - mech.log_prob(y, neighbour)).abs()
    assert llr.max().item() <= 0.8 + 1e-9
    assert llr.max().item() > 0.79  # the bound is attained where y is beyond both points


def test_binomial_log_likelihood_ratio_bounded_by_epsilon():
    mech = BinomialCurve(trials=20, population=200, dim=4, epsilon=3.0)
    s = torch.tensor([[0.0], [1.0], [57.0], [150.0], [199.0]]).expand(5, 4)
    y = torch.arange(21.0)[:, None, None].expand(21, 1, 4) / 20
    llr = (mech.log_prob(y, s) - mech.log_prob(y, s + 1)).abs()  # one person changes state at every t
    assert llr.max().item() <= mech.epsilon + 1e-9
    assert mech.epsilon <= 3.0 and llr.max().item() > 0.99 * mech.epsilon


def test_randomized_response_log_likelihood_ratio_bounded_by_epsilon():
    mech = RandomizedResponse(epsilon=1.3, dim=2)
    outcomes = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    llr = (
        mech.log_prob(outcomes, torch.tensor([[0.0, 1.0]]))
        - mech.log_prob(outcomes, torch.tensor([[1.0, 1.0]]))
    ).abs()
    assert llr.max().item() == pytest.approx(1.3)


def test_gaussian_calibrations():
    analytic = Gaussian(2.0, 1e-5, 1.5)
    assert analytic_delta(analytic.mu, 2.0) == pytest.approx(1e-5, rel=1e-6)
    classic = Gaussian(0.5, 1e-5, 1.5, calibration="classic")
    assert classic.sigma == pytest.approx(1.5 * math.sqrt(2 * math.log(1.25e5)) / 0.5)
    assert Gaussian(0.5, 1e-5, 1.5).sigma < classic.sigma  # the exact calibration needs less noise
    gdp = Gaussian.gdp(mu=0.5, sensitivity=2.0, delta=1e-6)
    assert gdp.sigma == pytest.approx(4.0) and analytic_delta(0.5, gdp.epsilon) == pytest.approx(
        1e-6, rel=1e-6
    )
    with pytest.raises(ValueError, match="epsilon < 1"):
        Gaussian(2.0, 1e-5, 1.0, calibration="classic")


def test_inverse_cdf_is_deterministic_and_broadcasts():
    mech = Laplace(1.0, 1.0, dim=2)
    s = torch.zeros(5, 1, 2)
    u = torch.rand(5, 8, 2, generator=torch.Generator().manual_seed(3))
    assert mech.sample(s, u).shape == (5, 8, 2)
    assert torch.equal(mech.sample(s, u), mech.sample(s, u))
    assert torch.isfinite(mech.sample(s, torch.zeros(5, 8, 2))).all()  # u = 0 is clamped into (0, 1)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Laplace(0.0, 1.0),
        lambda: Laplace(-1.0, 1.0),
        lambda: Laplace(1.0, 0.0),
        lambda: RandomizedResponse(float("nan")),
        lambda: Gaussian(1.0, 0.0, 1.0),
    ],
)
def test_bad_privacy_parameters_raise(make):
    with pytest.raises(ValueError):
        make()


def test_bad_shapes_and_releases_raise():
    mech = BinomialCurve(trials=10, population=100, dim=2, epsilon=1.0)
    with pytest.raises(ValueError, match="last dimension 2"):
        mech.sample(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="last dimension 2"):
        mech.sample(torch.zeros(4, 2), torch.rand(4, 5))
    with pytest.raises(ValueError, match="outside the support"):
        mech.validate_release(torch.tensor([0.1, 0.123]))
    with pytest.raises(ValueError, match="shape"):
        mech.validate_release(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="outside the support"):
        RandomizedResponse(1.0, 2).validate_release(torch.tensor([0.0, 0.5]))
    assert mech.log_prob(torch.tensor([[0.1, 0.123]]), torch.zeros(1, 2)).item() == -math.inf


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: Laplace(1e-40, 1.0), ValueError, "scale=1e\\+40 .*epsilon=1e-40.*larger epsilon"),
        (lambda: DiscreteLaplace(1e-40, 1.0), ValueError, "scale=1e\\+40 .*larger epsilon"),
        (lambda: Laplace.from_scale(float("inf"), 1.0), ValueError, "scale"),
        (lambda: Gaussian(1e300, 1e-6, 1.0), ValueError, "epsilon=1e\\+300 .*analytic Gaussian calibration"),
        (lambda: DiscreteGaussian(1e300, 1e-6), ValueError, "epsilon=1e\\+300 .*calibration"),
        (lambda: DiscreteGaussian(sigma=1e20), ValueError, "sigma=1e\\+20"),
        (lambda: Laplace("1", 1.0), TypeError, "epsilon must be a number, got '1'"),
        (lambda: Gaussian(1.0, "1e-6", 1.0), TypeError, "delta must be a number"),
        (lambda: Laplace(1.0, "2"), TypeError, "sensitivity must be a number"),
        (lambda: Laplace(1.0, 1.0, dim=2.7), ValueError, "dim must be an integer >= 1, got 2.7"),
        (lambda: DiscreteGaussian(1.0, 1e-6, dim=2.7), ValueError, "dim must be an integer"),
        (lambda: RandomizedResponse(1.0, dim="2"), TypeError, "dim must be a number"),
        (lambda: BinomialCurve(2.5, 100, 2, epsilon=1.0), ValueError, "trials must be an integer"),
        (lambda: SmoothSensitivityLaplace(1.0, 1e-6, 1.0, n=10.5), ValueError, "n must be an integer"),
        # a scale float32 rounds to 0 (or holds only subnormally): releases would equal s, log_prob NaN
        (lambda: Laplace(1e308, 1.0), ValueError, "scale=1e-308 .*epsilon=1e\\+308.*below .*float32"),
        (lambda: Laplace.from_scale(1e-39, 1.0), ValueError, "scale=1e-39 is below"),
        (lambda: Laplace.from_scale((1.0, 1e-39), 1.0), ValueError, "scale=1e-39 is below"),
        (lambda: Gaussian.from_sigma(1e-300, 1.0), ValueError, "sigma=1e-300 is below"),
        (lambda: DiscreteLaplace(1e308, 1.0), ValueError, "scale=1e-308 .*below .*float64"),
        (lambda: DiscreteGaussian(sigma=1e-160), ValueError, "sigma=1e-160 is below .*sigma\\^2"),
        (lambda: DiscreteGaussian(rho=1e308), ValueError, "sigma=0 .*rho=1e\\+308.*is below"),
    ],
)
def test_bad_constructor_arguments_get_one_line_naming_them(make, error, match):
    with pytest.raises(error, match=match) as caught:
        make()
    assert "\n" not in str(caught.value)


def test_the_least_scales_give_finite_releases_and_densities():
    for mech in [Laplace(1e37, 1.0), Laplace.from_scale((1e-37, 1.0), 1.0)]:
        s = torch.ones(4, mech.dim, dtype=torch.float32)  # the narrowest dtype releases are computed in
        y = mech.sample(s, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(y).all() and torch.isfinite(mech.log_prob(s, s)).all()
    assert torch.isfinite(DiscreteLaplace(1e300, 1.0).log_prob(torch.ones(1, 1), torch.ones(1, 1))).all()


def test_log_prob_refuses_releases_and_statistics_of_the_wrong_width():
    """Shapes only (a training step calls log_prob): no broadcast of a (n, 1) release against (n, 2) statistics."""
    cases = [
        (Laplace(1.0, 1.0, dim=2), 2, 2),
        (Gaussian(1.0, 1e-6, 1.0, dim=2), 2, 2),
        (RandomizedResponse(1.0, dim=2), 2, 2),
        (BinomialCurve(10, 100, 2, epsilon=1.0), 2, 2),
        (SmoothSensitivityLaplace(1.0, 1e-6, 1.0, n=10), 1, 2),
    ]
    for mech, dim, input_dim in cases:
        with pytest.raises(
            ValueError, match=f"^y must have last dimension {dim} for .*got shape \\(2, 3\\)$"
        ):
            mech.log_prob(torch.zeros(2, 3), torch.zeros(2, input_dim))
        with pytest.raises(
            ValueError, match=f"^s must have last dimension {input_dim} for .*got shape \\(2, 3\\)$"
        ):
            mech.log_prob(torch.zeros(2, dim), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="^y must have last dimension 2 for Laplace, got shape \\(2, 1\\)$"):
        Laplace(1.0, 1.0, dim=2).log_prob(torch.zeros(2, 1), torch.zeros(2, 2))


def test_randomized_response_takes_bits_only():
    mech = RandomizedResponse(1.0, dim=2)
    s = torch.tensor([[2.0, 0.5]])
    with pytest.raises(ValueError, match="^RandomizedResponse reports bits; .*e.g. 2.0$"):
        mech.sample(s)
    with pytest.raises(ValueError, match="^RandomizedResponse reports bits"):
        mech.log_prob(torch.tensor([[1.0, 0.0]]), s)
    # where values cannot be read (a device, a compiled step) a statistic that is not a bit has no density
    assert torch.isnan(mech.coordinate_log_prob(torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.0]))[0])
    with pytest.raises(RuntimeError, match="mechanism refuses: RandomizedResponse reports bits"):
        dpsbi.from_simulator(
            dpsbi.tasks.box([0.0], [1.0]), lambda theta: theta.expand(-1, 2) * 2, mech, y_obs=[[1.0, 0.0]]
        ).simulate(torch.ones(3, 1))


def test_randomized_response_at_a_large_epsilon_reports_truthfully():
    mech = RandomizedResponse(1000.0)
    bits = torch.tensor([[1.0], [0.0]])
    assert mech.keep == 1.0 and torch.equal(mech.sample(bits), bits)
    assert mech.log_prob(bits, bits).tolist() == [0.0, 0.0]
    assert mech.log_prob(1 - bits, bits).tolist() == [-1000.0, -1000.0]


@pytest.mark.parametrize(
    "mech",
    [
        Laplace(1.0, 1.0),
        Laplace.from_scale((2.0, 1.0), 1.0),
        Gaussian(1.0, 1e-6, 1.0),
        DiscreteLaplace(1.0, 1.0),
        DiscreteGaussian(sigma=2.0),
        RandomizedResponse(1.0),
        BinomialCurve(10, 100, 2, epsilon=1.0),
    ],
    ids=lambda m: type(m).__name__,
)
def test_repr_at_a_tensor_of_epsilons_shows_the_values(mech):
    text = repr(mech.with_epsilon(torch.tensor([[0.5], [1.0]])))
    assert (
        "epsilon=tensor(0.5, 1)" in text or "epsilon=tensor(0.49" in text
    )  # BinomialCurve: its exact epsilon
    many = repr(mech.with_epsilon(torch.linspace(0.5, 2.0, 10)[:, None]))
    assert "10 values in [" in many


def test_whole_number_dims_are_taken():
    assert Laplace(1.0, 1.0, dim=2.0).dim == 2
    assert Laplace(1.0, 1.0, dim=np.int64(3)).dim == 3
    assert Laplace(torch.tensor(2.0), 1.0).epsilon == 2.0


# ---- per-coordinate scales (a DP mean's noisy sum and noisy count) ---------------------------------------------


def test_per_coordinate_laplace_draws_and_density_are_each_coordinates():
    """Sensitivities (4, 1) at epsilon 2, split evenly: b = (4, 1); any split by from_scale, epsilon = sum Delta/b."""
    mech = Laplace(2.0, (4.0, 1.0))
    assert mech.dim == 2 and mech.scale == (4.0, 1.0) and mech.sensitivity == (4.0, 1.0)
    s = torch.tensor([10.0, -2.0])
    y = draws(mech, s, 20000)
    for j, b in enumerate(mech.scale):
        assert stats.kstest(y[:, j].numpy(), stats.laplace(loc=s[j].item(), scale=b).cdf).pvalue > 1e-3
    expected = sum(
        stats.laplace(loc=s[j].item(), scale=b).logpdf(y[:50, j].numpy()) for j, b in enumerate(mech.scale)
    )
    assert np.allclose(mech.log_prob(y[:50], s).numpy(), expected, rtol=1e-12)
    assert mech.max_log_prob(y[:3]).tolist() == pytest.approx([-math.log(8.0) - math.log(2.0)] * 3)
    uneven = Laplace.from_scale((8.0, 0.5), (4.0, 1.0))
    assert uneven.epsilon == pytest.approx(4 / 8 + 1 / 0.5)
    # (Delta, Delta) per coordinate is an L1 sensitivity of 2 Delta: the scalar mechanism's noise
    assert Laplace(0.5, (1.5, 1.5)).scale == (Laplace(0.5, 3.0, 2).scale,) * 2


def test_per_coordinate_laplace_log_likelihood_ratio_bounded_by_its_epsilon():
    mech = Laplace.from_scale((8.0, 0.5), (4.0, 1.0))
    g = torch.Generator().manual_seed(1)
    s = torch.randn(200, 2, generator=g) * 5
    sign = torch.where(torch.rand(200, 2, generator=g) < 0.5, -1.0, 1.0)
    neighbour = s + sign * torch.tensor([4.0, 1.0])  # every coordinate moves by its sensitivity at once
    y = torch.randn(300, 1, 2, generator=g) * 20
    llr = (mech.log_prob(y, s) - mech.log_prob(y, neighbour)).abs()
    assert llr.max().item() <= mech.epsilon + 1e-9 and llr.max().item() > 0.99 * mech.epsilon


def test_per_coordinate_gaussian_is_mu_gdp_with_mu_from_all_coordinates():
    mech = Gaussian(1.0, 1e-6, (4.0, 1.0))
    even = Gaussian(1.0, 1e-6, 1.0)  # the same mu, split evenly: sigma_j = sqrt(2) Delta_j / mu
    assert mech.mu == pytest.approx(even.mu) and mech.sigma == pytest.approx(
        (4 * math.sqrt(2) / even.mu, math.sqrt(2) / even.mu)
    )
    assert mech.rho == pytest.approx(even.mu**2 / 2)
    chosen = Gaussian.from_sigma((2.0, 0.5), (4.0, 1.0), delta=1e-6)
    assert chosen.mu == pytest.approx(math.sqrt(8.0)) and chosen.rho == pytest.approx(4.0)
    assert analytic_delta(chosen.mu, chosen.epsilon) == pytest.approx(1e-6, rel=1e-6)
    s = torch.tensor([3.0, -1.0])
    y = draws(chosen, s, 20000)
    for j, sd in enumerate(chosen.sigma):
        assert stats.kstest(y[:, j].numpy(), stats.norm(loc=s[j].item(), scale=sd).cdf).pvalue > 1e-3
    expected = sum(stats.norm(s[j].item(), sd).logpdf(y[:50, j].numpy()) for j, sd in enumerate(chosen.sigma))
    assert np.allclose(chosen.log_prob(y[:50], s).numpy(), expected, rtol=1e-12)
    assert chosen.max_log_prob(y[:1]).item() == pytest.approx(
        stats.norm(0, 2.0).logpdf(0) + stats.norm(0, 0.5).logpdf(0)
    )


@pytest.mark.parametrize(
    "make",
    [lambda: Laplace.from_scale((8.0, 0.5), (4.0, 1.0)), lambda: Gaussian.from_sigma((2.0, 0.5), (4.0, 1.0))],
)
def test_per_coordinate_with_epsilon_keeps_the_split(make):
    """At another epsilon every coordinate's scale changes by one factor; a tensor of epsilons gives the same rows."""
    mech = make()
    scales = lambda m: torch.as_tensor(getattr(m, "scale", None) or m.sigma)  # noqa: E731
    other = mech.with_epsilon(2 * mech.epsilon)
    assert other.epsilon == pytest.approx(2 * mech.epsilon)
    ratio = scales(other) / scales(mech)
    assert torch.allclose(ratio, ratio[0].expand(2)) and ratio[0] < 1
    batched = mech.with_epsilon(torch.tensor([mech.epsilon, 2 * mech.epsilon]).reshape(2, 1))
    u = torch.rand(2, 2, generator=torch.Generator().manual_seed(0))
    expected = torch.stack([mech.sample(torch.zeros(2), u[0]), other.sample(torch.zeros(2), u[1])])
    assert torch.allclose(batched.sample(torch.zeros(2, 2), u), expected, rtol=1e-9)


def test_per_coordinate_parameters_enter_the_identity_and_repr():
    from dpsbi.tasks.identity import differences, mechanism_identity

    mech = Laplace.from_scale((8.0, 0.5), (4.0, 1.0))
    ident = mechanism_identity(mech)
    assert ident["scale"] == [8.0, 0.5] and ident["sensitivity"] == [4.0, 1.0]
    changed = differences(ident, mechanism_identity(Laplace.from_scale((8.0, 0.6), (4.0, 1.0))))
    assert [line.split(":")[0] for line in changed] == ["epsilon", "scale"]
    assert "scale=(8, 0.5)" in repr(mech) and "sigma=(2, 0.5)" in repr(
        Gaussian.from_sigma((2.0, 0.5), (4.0, 1.0))
    )


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Laplace(1.0, (1.0, -1.0)), r"sensitivity\[1\] must be a finite number > 0"),
        (lambda: Laplace(1.0, (1.0, 2.0), dim=3), "holds 2 numbers, one per coordinate, but dim=3"),
        (lambda: Laplace.from_scale((1.0, 2.0), (1.0, 2.0, 3.0)), "differ in length"),
        (lambda: Gaussian(1.0, 1e-6, []), "at least one number"),
    ],
)
def test_bad_per_coordinate_parameters_get_one_line(make, match):
    with pytest.raises(ValueError, match=match) as error:
        make()
    assert "\n" not in str(error.value)
