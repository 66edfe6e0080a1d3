"""Discrete Laplace and discrete Gaussian: pmfs against closed forms, inverse CDFs against exact quantiles, draws
against OpenDP's samplers, privacy accounting against CKS 2020 and dp-accounting, and exact ABC on them.

Statistical checks use fixed seeds and chi-square p-values > 1e-3 (draw counts stated in each test); OpenDP's
own sampler cannot be seeded, so the comparison with it uses p > 1e-4 (a false alarm once in 10^4 runs).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch.distributions import Gamma, Independent

import dpsbi
from dpsbi.baselines import rejection_abc
from dpsbi.inference.losses import dequantized
from dpsbi.mechanisms import DiscreteGaussian, DiscreteLaplace
from dpsbi.mechanisms.discrete import (
    _DELTA_MARGIN,
    MAX_SIGMA,
    _bisected_sigmas,
    _deltas,
    discrete_gaussian_delta,
    discrete_gaussian_epsilons,
    discrete_gaussian_log_normalizer,
    discrete_gaussian_log_tail,
    discrete_gaussian_sigmas,
    one_to_one_epsilon,
    zcdp_epsilon,
)
from dpsbi.tasks import Task

pytestmark = pytest.mark.usefixtures("float64")
SEED = 1234


def draws(mech, s, n, seed=SEED):
    return mech.sample(
        torch.as_tensor(s, dtype=torch.float64).expand(n, mech.dim),
        generator=torch.Generator().manual_seed(seed),
    )


def dg_pmf(k: np.ndarray, sigma: float) -> np.ndarray:
    """Brute force: e^{-k^2 / 2 sigma^2} normalized over |k| <= 60 sigma + 50."""
    grid = np.arange(-math.ceil(60 * sigma) - 50, math.ceil(60 * sigma) + 51)
    return np.exp(-(k**2) / (2 * sigma**2)) / np.exp(-(grid**2) / (2 * sigma**2)).sum()


def chi_square_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    """Goodness of fit with the cells of expected count < 5 pooled."""
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    chi2 = ((obs - exp) ** 2 / np.maximum(exp, 1e-12)).sum()
    return float(stats.chi2.sf(chi2, len(obs) - 1))


def counts(values: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Counts of the integers ``lo..hi``, the tails pooled into the end cells."""
    return np.bincount(np.clip(values, lo, hi).astype(int) - lo, minlength=hi - lo + 1)


# ---- probability mass functions -------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon, sensitivity", [(0.3, 1.0), (1.0, 2.0), (4.0, 1.0)])
def test_discrete_laplace_pmf_matches_closed_form_and_scipy(epsilon, sensitivity):
    mech = DiscreteLaplace(epsilon, sensitivity)
    t = sensitivity / epsilon
    k = torch.arange(-400.0, 401.0)[:, None]
    logp = mech.log_prob(k + 3, torch.tensor([[3.0]]))
    p = math.exp(-1 / t)
    assert torch.allclose(logp, math.log((1 - p) / (1 + p)) - k[:, 0].abs() / t, rtol=1e-13, atol=0)
    near = k[:, 0].abs() <= 60  # scipy's logpmf underflows further out
    assert np.allclose(logp[near].numpy(), stats.dlaplace.logpmf(k[near, 0].numpy(), 1 / t), rtol=1e-12)
    assert logp.exp().sum().item() == pytest.approx(1.0, abs=1e-12)
    assert mech.log_prob(torch.tensor([[3.5]]), torch.tensor([[3.0]])).item() == -math.inf
    assert (mech.max_log_prob(k) >= logp).all() and mech.max_log_prob(k)[0] == logp.max()


@pytest.mark.parametrize("sigma", [0.4, 1.0, 3.7, 25.0])
def test_discrete_gaussian_pmf_matches_closed_form(sigma):
    mech = DiscreteGaussian(sigma=sigma)
    k = np.arange(-math.ceil(12 * sigma) - 5, math.ceil(12 * sigma) + 6)
    logp = mech.log_prob(torch.as_tensor(k, dtype=torch.float64)[:, None] - 2, torch.tensor([[-2.0]]))
    assert np.allclose(logp.exp().numpy(), dg_pmf(k, sigma), rtol=1e-12, atol=1e-300)
    assert logp.exp().sum().item() == pytest.approx(1.0, abs=1e-12)
    assert discrete_gaussian_log_normalizer(sigma) == pytest.approx(
        math.log(np.exp(-(k**2) / (2 * sigma**2)).sum()), abs=1e-13
    )
    assert mech.log_prob(torch.tensor([[0.25]]), torch.tensor([[0.0]])).item() == -math.inf
    assert (mech.max_log_prob(torch.zeros(1, 1)) >= logp.max()).all()


@pytest.mark.parametrize("make", [lambda: DiscreteLaplace(0.7, 1.0), lambda: DiscreteGaussian(sigma=2.3)])
def test_log_cdf_equals_summed_pmf_including_far_tails(make):
    mech = make()
    x = torch.tensor([-400.0, -60.0, -31.0, -30.5, -7.0, -1.0, -0.2, 0.0, 0.7, 3.0, 25.0, 40.0])
    k = np.arange(-3000, 3001)
    logpmf = mech.noise_log_prob(torch.as_tensor(k, dtype=torch.float64)).numpy()
    expected = [np.logaddexp.reduce(logpmf[k <= math.floor(v)]) for v in x.tolist()]
    got = mech.noise_log_cdf(x).numpy()
    assert np.allclose(got, expected, rtol=1e-10, atol=1e-14)
    sf = mech.coordinate_log_sf(x, torch.zeros_like(x)).numpy()
    assert np.allclose(np.exp(sf) + np.exp(got), 1.0, atol=1e-14)


def test_discrete_gaussian_table_leaves_out_negligible_mass():
    for sigma in [0.05, 1.0, 7.3, 300.0]:
        mech = DiscreteGaussian(sigma=sigma)
        assert discrete_gaussian_log_tail(mech.half_width + 1, sigma) < math.log(1e-21)


# ---- inverse CDF ----------------------------------------------------------------------------------------------


def test_discrete_laplace_inverse_cdf_is_the_exact_quantile():
    mech = DiscreteLaplace(0.4, 1.0)
    u = torch.rand(20000, 1, generator=torch.Generator().manual_seed(0))
    u = torch.cat([u, torch.tensor([[1e-300], [1e-12], [0.5], [1 - 1e-12]])])
    y = mech.sample(torch.zeros(1), u)
    assert np.array_equal(y[:, 0].numpy(), stats.dlaplace.ppf(u[:, 0].numpy(), 1 / mech.scale))


@pytest.mark.parametrize("sigma", [0.3, 2.0, 40.0])
def test_discrete_gaussian_inverse_cdf_is_the_exact_quantile(sigma):
    mech = DiscreteGaussian(sigma=sigma)
    k = np.arange(-mech.half_width, mech.half_width + 1)
    cdf = np.cumsum(dg_pmf(k, sigma))
    u = torch.rand(20000, 1, generator=torch.Generator().manual_seed(1))
    expected = k[np.searchsorted(cdf, u[:, 0].numpy())]  # smallest k with F(k) >= u
    y = mech.sample(torch.full((1,), 5.0), u)
    assert np.array_equal(y[:, 0].numpy() - 5, expected)


@pytest.mark.parametrize(
    "make", [lambda: DiscreteLaplace(0.5, 1.0, dim=3), lambda: DiscreteGaussian(1.0, 1e-6, 2.0, dim=3)]
)
def test_draws_match_pmf_chi_square(make):
    mech = make()
    s = torch.tensor([0.0, 7.0, -12.0])
    y = draws(mech, s, 30000)  # 30 000 draws per coordinate
    for j in range(3):
        noise = (y[:, j] - s[j]).numpy()
        lo, hi = int(noise.min()), int(noise.max())
        probs = mech.noise_log_prob(torch.arange(lo, hi + 1.0)).exp().numpy()
        probs[0] += mech.noise_log_cdf(torch.tensor(lo - 1.0)).exp().item()
        probs[-1] += mech.coordinate_log_sf(torch.tensor(float(hi)), torch.tensor(0.0)).exp().item()
        assert chi_square_pvalue(counts(noise, lo, hi), 30000 * probs) > 1e-3


def test_inverse_cdf_broadcasts_on_tables_cached_per_dtype():
    mech = DiscreteGaussian(sigma=3.0, dim=2)
    s = torch.tensor([[[4.0, -1.0]]]).expand(5, 1, 2)
    u = torch.rand(5, 8, 2, generator=torch.Generator().manual_seed(3))
    y = mech.sample(s, u)
    assert y.shape == (5, 8, 2) and torch.equal(y, mech.sample(s, u)) and bool(mech.in_support(y).all())
    y32 = mech.sample(s.float(), u.float())  # counts are computed and held in float64 whatever comes in
    assert y32.dtype == torch.float64 and (y32 != y).float().mean() < 1e-3
    y_table32 = mech.transform(s.float(), u.float())  # the map itself works in the uniforms' dtype
    assert y_table32.dtype == torch.float32 and (y_table32.double() != y).float().mean() < 1e-3
    assert set(mech._tables) == {(torch.device("cpu"), torch.float64), (torch.device("cpu"), torch.float32)}
    extreme = mech.sample(torch.zeros(2), torch.tensor([[0.0, 1.0]]))  # clamped into (0, 1): finite
    assert torch.isfinite(extreme).all() and extreme[0, 0] < -10 and extreme[0, 1] > 10


def test_lattice_support_and_dequantization():
    for mech in [DiscreteLaplace(1.0, 1.0, dim=2), DiscreteGaussian(rho=0.5, dim=2)]:
        assert mech.lattice == 1
        y = torch.tensor([[1.0, -3.0], [1.5, 0.0], [math.inf, 0.0]])
        assert mech.in_support(y).tolist() == [True, False, False]
        with pytest.raises(ValueError, match="outside the support"):
            mech.validate_release(y[1])
        v = torch.rand(2, 2, generator=torch.Generator().manual_seed(0))
        assert torch.equal(dequantized(y[:1], mech, v), y[:1] + v)
        with pytest.raises(ValueError, match="non-integer values, e.g. 0.5"):
            mech.sample(torch.tensor([0.5, 1.0]))


# ---- privacy accounting ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma, sensitivity, epsilon", [(0.7, 1, 0.5), (3.3, 2, 1.2), (4.2, 1, 1.0), (40.0, 5, 0.1)]
)
def test_discrete_gaussian_delta_matches_dp_accounting(sigma, sensitivity, epsilon):
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_mechanism")
    reference = pld.DiscreteGaussianPrivacyLoss(sigma, sensitivity=sensitivity).get_delta_for_epsilon(epsilon)
    assert discrete_gaussian_delta(epsilon, sigma, sensitivity) == pytest.approx(reference, rel=1e-9)


def test_discrete_gaussian_delta_matches_cks_theorem_7_by_enumeration():
    # delta(eps) = sum_y max(0, P(y) - e^eps P(y - Delta)) over the whole support (the hockey-stick divergence).
    sigma, sensitivity, epsilon = 1.7, 2, 0.8
    k = np.arange(-200, 201)
    hockey = np.maximum(0, dg_pmf(k, sigma) - math.exp(epsilon) * dg_pmf(k - sensitivity, sigma)).sum()
    assert discrete_gaussian_delta(epsilon, sigma, sensitivity) == pytest.approx(hockey, rel=1e-12)


def test_discrete_gaussian_calibrations():
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_mechanism")
    mech = DiscreteGaussian(1.0, 1e-6, sensitivity=2)
    loss = pld.DiscreteGaussianPrivacyLoss(mech.sigma, sensitivity=2)
    assert loss.get_delta_for_epsilon(1.0) == pytest.approx(1e-6, rel=1e-6)
    assert discrete_gaussian_delta(1.0, mech.sigma * (1 - 1e-6), 2) > 1e-6  # the smallest such sigma
    assert mech.rho == pytest.approx(4 / (2 * mech.sigma**2), rel=1e-14)
    rho = DiscreteGaussian.from_rho(0.125, sensitivity=1, delta=1e-5)
    assert rho.sigma == pytest.approx(2.0) and rho.rho == 0.125 and rho.delta == 1e-5
    assert discrete_gaussian_delta(rho.epsilon, 2.0, 1) == pytest.approx(1e-5, rel=1e-8)
    sig = DiscreteGaussian.from_sigma(2.0)
    assert sig.rho == pytest.approx(0.125) and sig.delta == 1e-6
    vector = DiscreteGaussian(1.0, 1e-6, sensitivity=math.sqrt(3), dim=3)  # zCDP conversion for vectors
    assert zcdp_epsilon(vector.rho, 1e-6) == pytest.approx(1.0, rel=1e-9)
    assert vector.sigma == pytest.approx(math.sqrt(3) / math.sqrt(2 * vector.rho))
    again = mech.with_epsilon(2.0)
    assert isinstance(again, DiscreteGaussian) and again.sigma < mech.sigma and again.delta == 1e-6
    assert mech.with_epsilon(mech.epsilon).sigma == pytest.approx(mech.sigma, rel=1e-9)


@pytest.mark.parametrize("rho, delta", [(0.5, 1e-6), (0.01, 1e-5), (3.0, 1e-9)])
def test_zcdp_conversion_matches_dp_accounting(rho, delta):
    rdp = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    orders = np.concatenate([1 + np.geomspace(1e-3, 10, 4000), np.linspace(11, 5000, 20000)])
    reference, _ = rdp.compute_epsilon(orders, orders * rho, delta)  # RDP of rho-zCDP: alpha rho
    ours = zcdp_epsilon(rho, delta)
    assert ours <= reference + 1e-12 and ours == pytest.approx(reference, rel=1e-5)


def test_discrete_laplace_is_exactly_epsilon_dp():
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_mechanism")
    mech = DiscreteLaplace(0.8, 3.0)
    assert mech.scale == pytest.approx(3.0 / 0.8)
    loss = pld.DiscreteLaplacePrivacyLoss(1 / mech.scale, sensitivity=3)
    assert loss.get_delta_for_epsilon(0.8 + 1e-9) == 0.0 and loss.get_delta_for_epsilon(0.79) > 0
    y = torch.arange(-60.0, 61.0)[:, None]
    llr = (mech.log_prob(y, torch.tensor([[0.0]])) - mech.log_prob(y, torch.tensor([[3.0]]))).abs()
    assert llr.max().item() == pytest.approx(0.8, rel=1e-12)
    assert mech.with_epsilon(2.0).scale == pytest.approx(1.5)
    assert DiscreteLaplace.from_scale(2.5, 1.0).epsilon == pytest.approx(0.4)


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: DiscreteLaplace(0.0, 1.0), "epsilon"),
        (lambda: DiscreteLaplace(1.0, 0.5), "sensitivity"),
        (lambda: DiscreteLaplace.from_scale(-1.0, 1.0), "scale"),
        # an integer statistic's L1 sensitivity is a whole number, in any dimension
        (lambda: DiscreteLaplace(1.0, 1.5), "^sensitivity must be an integer here .*got 1.5$"),
        (lambda: DiscreteLaplace(1.0, 2.5, dim=3), "^sensitivity must be an integer here"),
        (lambda: DiscreteLaplace.from_scale(2.0, 1.5), "^sensitivity must be an integer here"),
        (lambda: DiscreteGaussian(1.0, None), "delta"),
        (lambda: DiscreteGaussian(1.0, 1.5), "delta"),
        (lambda: DiscreteGaussian(1.0, 1e-6, sensitivity=1.5), "sensitivity"),
        (lambda: DiscreteGaussian(rho=-1.0), "rho"),
        (lambda: DiscreteGaussian(sigma=float("nan")), "sigma"),
        (lambda: DiscreteGaussian(1.0, 1e-6, rho=1.0), "exactly one of epsilon"),
        (lambda: DiscreteGaussian(sigma=1e4, delta=0.5), "already"),
    ],
)
def test_bad_parameters_are_refused_in_one_line(make, name):
    with pytest.raises(ValueError, match=name) as error:
        make()
    assert "\n" not in str(error.value)


# ---- one sigma per row (batched calibration and sampling) -----------------------------------------------------

EPSILONS = [0.02, 0.1, 0.3, 1.0, 2.5, 10.0]


@pytest.mark.parametrize(("dim", "sensitivity", "delta"), [(1, 1, 1e-6), (1, 3, 1e-10), (46, 2**0.5, 1e-10)])
def test_per_row_calibration_from_epsilon_is_the_scalar_one(dim, sensitivity, delta):
    """dim 1: CKS Thm. 7 bisected on the device; dim > 1: the largest rho whose zCDP conversion gives epsilon."""
    mech = DiscreteGaussian(1.0, delta, sensitivity, dim)
    batched = mech.with_epsilon(torch.tensor(EPSILONS).reshape(-1, 1, 1))
    expected = [DiscreteGaussian(e, delta, sensitivity, dim) for e in EPSILONS]
    assert batched.sigma.shape == (len(EPSILONS), 1, 1)
    for got, want in zip(batched.sigma.flatten().tolist(), expected):
        assert got == pytest.approx(want.sigma, rel=1e-6)
    for got, want in zip(batched.rho.flatten().tolist(), expected):
        assert got == pytest.approx(want.rho, rel=1e-6)


@pytest.mark.parametrize(("delta", "sensitivity"), [(1e-6, 1), (1e-5, 1), (1e-10, 3)])
def test_below_its_limit_a_scalar_statistics_epsilon_has_one_sigma(delta, sensitivity):
    """A release's sigma (from OpenDP, say) gives its epsilon; a training step calibrates a sigma back from it: below
    ``one_to_one_epsilon`` the two agree (5000 sigmas drawn off the limit's own grid), above it they need not
    (``sigma = 1``, sensitivity 1, delta 1e-6: 9 % apart), and an amortized fit reaching past it is refused in one
    line."""
    u = torch.rand(5000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sigma = torch.exp(math.log(0.01) + u * math.log(3000 * sensitivity))
    epsilon = discrete_gaussian_epsilons(delta, sigma, sensitivity)
    back = DiscreteGaussian(1.0, delta, sensitivity).with_epsilon(epsilon).sigma
    limit = one_to_one_epsilon(delta, sensitivity)
    below = epsilon < limit
    assert 1000 < int(below.sum()) < 5000
    assert float((back / sigma - 1)[below].abs().max()) <= 1e-3
    if (delta, sensitivity) == (1e-5, 1):  # a narrow band a grid of 8001 sigmas missed (its limit was 1.7612)
        band = torch.tensor([2.1969], dtype=torch.float64)
        assert limit < float(discrete_gaussian_epsilons(delta, band, 1)) < 1.7612
    if (delta, sensitivity) == (1e-10, 3):  # the minimum at a kink (sigma 3.8494) that the grid stepped over:
        # the grid alone gave 4.96040, where sigma 3.8553 calibrates back to 3.8493
        assert 4.96034 < limit < 4.96035
    if (delta, sensitivity) == (1e-6, 1):  # sigma 1 is private at epsilon 4.50, which calibrates back to 1.09
        one = torch.tensor([1.0], dtype=torch.float64)
        assert (
            float(DiscreteGaussian(1.0, delta).with_epsilon(discrete_gaussian_epsilons(delta, one, 1)).sigma)
            > 1.09
        )
    task = dpsbi.tasks.from_simulator(
        dpsbi.tasks.box([0.0], [100.0]),
        lambda theta: theta.round(),
        DiscreteGaussian(1.0, delta, sensitivity),
        None,
    )
    dpsbi.SPPE(task, amortized=True, epsilon_range=(0.2, 0.9 * limit))
    with pytest.raises(ValueError, match="re-calibrated per row only at epsilon between 0 and") as error:
        dpsbi.SPPE(task, amortized=True, epsilon_range=(0.2, 1.1 * limit))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("delta", "sensitivity"), [(1e-6, 1), (1e-5, 1), (1e-10, 3), (1e-9, 2)])
def test_the_scalar_calibration_is_the_bisections_in_seven_calls_on_every_device(
    delta, sensitivity, operator_count
):
    """Per row, a scalar statistic's sigma (CKS Thm. 7) is a table's bracket and six Newton steps at ``delta (1 -
    1e-9)``: from epsilon 1e-5 to just below ``one_to_one_epsilon`` (20 000 epsilons) within 1e-9 of a 64-halving
    bisection's private end at that delta (their differences are the rounding of ``delta``, below 4.5e-10 in 100 000
    epsilons), every sigma private at ``delta``, also below the table (epsilon to 0, where sigma rises to
    ``Delta / (delta sqrt(2 pi))``); a NaN or negative epsilon gets the bisection's ``2 MAX_SIGMA``; traced as a
    compiled step it gives the same, and on torch's meta device it reads nothing back in fewer than 2000 operators
    (the bisection: 10 310)."""
    limit = one_to_one_epsilon(delta, sensitivity)
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    epsilon = torch.exp(math.log(1e-5) + u * (math.log(0.999 * limit) - math.log(1e-5)))
    tiny = torch.tensor([0.0, 1e-15, 1e-11, 2.0e-9, 2.06e-9], dtype=torch.float64)  # below the table: e^-20
    epsilon = torch.cat([epsilon, tiny])
    sigma = discrete_gaussian_sigmas(epsilon, delta, sensitivity)
    bisected = torch.exp(_bisected_sigmas(epsilon, delta * (1 - _DELTA_MARGIN), sensitivity)[:, 1])
    assert float((sigma / bisected - 1).abs().max()) < 1e-9
    # where no sigma up to the search's top is private, both stop there
    capped = bisected > 2 * MAX_SIGMA * (1 - 1e-12)
    assert bool((_deltas(epsilon, sigma, sensitivity) <= delta)[~capped].all())
    odd = discrete_gaussian_sigmas(torch.tensor([math.nan, -1.0], dtype=torch.float64), delta, sensitivity)
    assert odd.tolist() == pytest.approx([2 * MAX_SIGMA] * 2, rel=1e-12)
    traced = torch.compile(
        lambda e: discrete_gaussian_sigmas(e, delta, sensitivity),
        backend="eager",
        fullgraph=True,
        dynamic=False,
    )
    torch.testing.assert_close(traced(epsilon[:100]), sigma[:100], rtol=1e-12, atol=0)
    with operator_count() as count:
        assert discrete_gaussian_sigmas(epsilon[:1000].to("meta"), delta, sensitivity).shape == (1000,)
    assert count.calls < 2000


def test_the_exact_delta_is_continuous_where_the_privacy_loss_crosses_epsilon_at_an_integer():
    """Where ``a = epsilon sigma^2 / Delta - Delta / 2`` is an integer the sums of CKS Thm. 7 lose the term at ``a``,
    which is 0 there: ``delta`` is continuous. Computed as ``floor(a + Delta)``, the second sum's bound rounded up
    where ``a`` fell an ulp below the integer and ``delta`` jumped by ``P(Y = a)`` (thirteen times itself at
    sigma 21.9, epsilon 0.80, Delta 3), which made a root-finder's sign wrong."""
    epsilon, sensitivity = 0.7977680848919669, 3
    m = torch.arange(100, 300, dtype=torch.float64)
    sigma = torch.sqrt((m + sensitivity / 2) * sensitivity / epsilon)
    at = _deltas(torch.tensor(epsilon, dtype=torch.float64), sigma, sensitivity)
    near = _deltas(torch.tensor(epsilon, dtype=torch.float64), sigma * (1 + 1e-9), sensitivity)
    assert float((at / near - 1).abs().max()) < 1e-6
    for i in range(200):
        scalar = discrete_gaussian_delta(epsilon, float(sigma[i]), sensitivity)
        assert scalar == pytest.approx(float(near[i]), rel=1e-6)


def test_the_zcdp_calibration_is_a_table_on_every_device(operator_count):
    """Per row, the zCDP conversions (a many-cell table's epsilon <-> rho) are a tabled optimum, interpolated: a few
    operators and no value read back (on torch's meta device a read raises), not 48 golden-section steps (about
    1300 operators a call)."""
    mech = DiscreteGaussian(1.0, 1e-10, 2**0.5, 46)
    epsilon = torch.linspace(0.5, 8.0, 1000, dtype=torch.float64)[:, None]
    for calibrate in (mech.with_epsilon, mech.with_rho):
        calibrate(epsilon)  # its table, built once on the CPU
        with operator_count() as count:
            assert calibrate(epsilon.to("meta")).sigma.shape == (1000, 1)
        assert count.calls < 100


@pytest.mark.parametrize(("dim", "sensitivity"), [(1, 1), (1, 2), (46, 2**0.5)])
def test_per_row_calibration_from_rho_and_sigma_is_the_scalar_one(dim, sensitivity):
    mech = DiscreteGaussian.from_rho(0.2461, sensitivity, dim, 1e-10)
    rhos = [0.01, 0.05, 0.2461, 1.0, 3.0]
    by_rho = mech.with_rho(torch.tensor(rhos))
    for i, rho in enumerate(rhos):
        want = DiscreteGaussian.from_rho(rho, sensitivity, dim, 1e-10)
        assert float(by_rho.sigma[i]) == pytest.approx(want.sigma, rel=1e-6)
        assert float(by_rho.epsilon[i]) == pytest.approx(want.epsilon, rel=1e-6)
    sigmas = [0.7, 2.016, 9.0, 150.0]
    by_sigma = mech.with_sigma(torch.tensor(sigmas))
    for i, sigma in enumerate(sigmas):
        want = DiscreteGaussian.from_sigma(sigma, sensitivity, dim, 1e-10)
        assert float(by_sigma.rho[i]) == pytest.approx(want.rho, rel=1e-6)
        assert float(by_sigma.epsilon[i]) == pytest.approx(want.epsilon, rel=1e-6)


@pytest.mark.parametrize("sigma", [0.05, 0.6, 2.016, 13.0, 400.0])
def test_per_row_transform_is_the_scalar_transform(sigma):
    """Bit-identical to the table's searchsorted wherever the table holds the quantile (u above 1e-16: the table
    leaves out mass below 1e-21, which shifts quantiles only at smaller u)."""
    mech = DiscreteGaussian(sigma=sigma, delta=0.4 if sigma < 0.1 else 1e-6)
    generator = torch.Generator().manual_seed(SEED)
    u = torch.cat(
        [
            torch.rand(20000, generator=generator),
            torch.exp(-36 * torch.rand(20000, generator=generator)),  # the lower tail, down to 2e-16
            1 - torch.exp(-36 * torch.rand(20000, generator=generator)),
            torch.tensor([0.5]),
        ]
    ).reshape(-1, 1)
    s = torch.full((1,), 7.0)
    batched = mech.with_sigma(torch.full((1, 1), sigma))  # broadcasting over the rows
    assert torch.equal(batched.sample(s, u), mech.sample(s, u))


def test_per_row_transform_draws_each_row_from_its_own_distribution():
    """Rows at sigmas 0.4, 2.016 and 9 in one call: each row's 20000 draws against its exact pmf (chi-square)."""
    sigmas = torch.tensor([0.4, 2.016, 9.0])
    mech = DiscreteGaussian.from_rho(0.2461).with_sigma(sigmas.reshape(-1, 1, 1))
    u = torch.rand(3, 20000, 1, generator=torch.Generator().manual_seed(SEED))
    draws = mech.sample(torch.zeros(3, 1, 1), u)[..., 0].numpy()
    for row, sigma in enumerate(sigmas.tolist()):
        k = np.arange(-math.ceil(5 * sigma) - 1, math.ceil(5 * sigma) + 2)
        pmf = dg_pmf(k, sigma)
        observed = np.array([(draws[row] == v).sum() for v in k])
        assert observed.sum() > 19990  # the rest lies beyond 5 sigma
        assert chi_square_pvalue(observed, pmf / pmf.sum() * observed.sum()) > 1e-3


def test_the_batched_path_never_reads_values_on_the_host():
    """Calibration and sampling run on the meta device, where a tensor has no values: no .item(), no boolean
    mask, no branch on a value (what would make a training step wait for the GPU)."""
    one, table = DiscreteGaussian(1.0, 1e-6), DiscreteGaussian.from_rho(0.2461, 2**0.5, 46, 1e-10)
    rows = torch.empty(8, 1, 1, device="meta")
    for mech, batched in (
        (one, one.with_epsilon(rows)),
        (table, table.with_epsilon(rows)),
        (table, table.with_rho(rows)),
    ):
        s = torch.empty(8, 1, mech.dim, device="meta", dtype=torch.float64)
        y = batched.sample(s, torch.empty(8, 4, mech.dim, device="meta", dtype=torch.float64))
        assert y.shape == (8, 4, mech.dim) and y.device.type == "meta"


def test_per_row_sigmas_beyond_the_table_limit_are_refused_in_one_line():
    with pytest.raises(ValueError, match="sigma=") as error:
        DiscreteGaussian(1.0, 1e-9).with_epsilon(torch.tensor([1.0, 1e-7]))  # sigma ~ 4e8
    assert "\n" not in str(error.value)


# ---- exact ABC on a discrete mechanism ------------------------------------------------------------------------


def test_rejection_abc_on_discrete_laplace_matches_the_exact_posterior():
    mech = DiscreteLaplace(0.5, 1.0)
    task = Task(
        name="poisson_discrete_laplace",
        prior=Independent(Gamma(torch.tensor([25.0]), torch.tensor([1.0])), 1),
        simulator=lambda theta, generator=None: torch.poisson(theta, generator=generator),
        mechanism=mech,
        epsilon=0.5,
        y_obs=torch.tensor([[33.0]]),
    )
    # Exact posterior on a grid: prior x sum_s Poisson(s; theta) P(y - s).
    theta = torch.linspace(1e-3, 80, 8001, dtype=torch.float64)
    s = torch.arange(0, 300, dtype=torch.float64)
    log_pois = s * theta[:, None].log() - theta[:, None] - torch.lgamma(s + 1)
    log_lik = torch.logsumexp(log_pois + mech.log_prob(torch.tensor([[33.0]]), s[:, None]), -1)
    w = torch.softmax(Gamma(25.0, 1.0).log_prob(theta) + log_lik, 0)
    mean = float((w * theta).sum())
    sd = float((w * (theta - mean) ** 2).sum().sqrt())
    result = rejection_abc(task, 4000, seed=0, progress=False)
    assert abs(result.samples.mean().item() - mean) < 4 * sd / math.sqrt(4000)
    assert result.samples.std().item() == pytest.approx(sd, abs=4 * sd / math.sqrt(2 * 4000))


# ---- OpenDP's samplers ----------------------------------------------------------------------------------------


def opendp_draws(integer_measurement, n: int) -> np.ndarray:
    return np.asarray(integer_measurement([0] * n))


@pytest.mark.parametrize("kind, scale", [("laplace", 2.5), ("gaussian", 3.0)])
def test_draws_match_opendp_samplers(kind, scale):
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=int), size=40000)
    if kind == "laplace":
        ours = DiscreteLaplace.from_scale(scale, 1.0)
        theirs = dp.m.make_laplace(space, dp.l1_distance(T=int), scale=scale)
    else:
        ours = DiscreteGaussian.from_sigma(scale)
        theirs = dp.m.make_gaussian(space, dp.l2_distance(T=int), scale=scale)
    reference = opendp_draws(theirs, 40000)  # 40 000 draws each; OpenDP's sampler is not seedable
    mine = draws(ours, torch.zeros(1), 40000)[:, 0].numpy()
    lo, hi = -math.ceil(4 * scale), math.ceil(4 * scale)
    table = np.stack([counts(reference, lo, hi), counts(mine, lo, hi)])
    table = table[:, table.min(0) >= 5]
    assert stats.chi2_contingency(table).pvalue > 1e-4  # same distribution (homogeneity)
    k = np.arange(lo, hi + 1)
    probs = ours.noise_log_prob(torch.as_tensor(k, dtype=torch.float64)).exp().numpy()
    probs[0] += ours.noise_log_cdf(torch.tensor(lo - 1.0)).exp().item()
    probs[-1] += ours.coordinate_log_sf(torch.tensor(float(hi)), torch.tensor(0.0)).exp().item()
    assert chi_square_pvalue(counts(reference, lo, hi), 40000 * probs) > 1e-4  # OpenDP's draws fit our pmf
