"""Post-processed mechanisms: exact likelihoods of clamping and rounding against brute-force enumeration and
Monte Carlo frequencies, the consistency step's invariants, and the refusals of methods that need a likelihood.

Monte Carlo checks use fixed seeds and chi-square / binomial p-values > 1e-3 (draw counts stated in each test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch.distributions import Gamma, Independent

from dpsbi.baselines import abc_is, rejection_abc
from dpsbi.experiment.methods import METHODS
from dpsbi.experiment.reference import reference_posterior
from dpsbi.inference import SPLE, SPPE
from dpsbi.mechanisms import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    IntractableLikelihood,
    Laplace,
    PostProcessed,
    PostProcessing,
    consistent_total,
    nonnegative,
    rounded,
)
from dpsbi.tasks import Task

pytestmark = pytest.mark.usefixtures("float64")
SEED = 1234


def draws(mech, s, n, seed=SEED):
    s = torch.as_tensor(s, dtype=torch.float64).expand(n, mech.input_dim)
    return mech.sample(s, generator=torch.Generator().manual_seed(seed))


def chi_square_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    return float(stats.chi2.sf(((obs - exp) ** 2 / np.maximum(exp, 1e-12)).sum(), len(obs) - 1))


def one_line(error) -> bool:
    return "\n" not in str(error.value)


# ---- exact likelihoods ----------------------------------------------------------------------------------------


def test_clamped_discrete_gaussian_pmf_by_enumeration_and_monte_carlo():
    inner = DiscreteGaussian(sigma=2.5)
    mech = PostProcessed(inner, nonnegative)
    assert mech.lattice == 1 and mech.has_log_prob and mech.epsilon == inner.epsilon and mech.rho == inner.rho
    s = torch.tensor([[1.0]])
    y = torch.arange(-3.0, 40.0)[:, None]
    p = mech.log_prob(y, s).exp()
    k = np.arange(-200, 201)
    noise = np.exp(-(k**2) / (2 * 2.5**2))
    noise /= noise.sum()
    brute = np.array(
        [
            noise[k + 1 <= 0].sum() if v == 0 else (noise[k + 1 == v].sum() if v > 0 else 0.0)
            for v in range(-3, 40)
        ]
    )
    assert np.allclose(p.numpy(), brute, rtol=1e-12, atol=1e-300)
    assert p.sum().item() == pytest.approx(1.0, abs=1e-12)
    released = draws(mech, s[0], 40000)[:, 0].numpy().astype(int)  # 40 000 draws
    assert released.min() == 0 and bool(
        mech.in_support(torch.as_tensor(released, dtype=torch.float64)[:, None]).all()
    )
    observed = np.bincount(released, minlength=40)[:40]
    assert chi_square_pvalue(observed, 40000 * brute[3:]) > 1e-3
    assert (mech.max_log_prob(y) >= mech.log_prob(y, torch.arange(-30.0, 30.0)[:, None, None]).amax(0)).all()


def test_clamped_laplace_atom_and_density():
    mech = PostProcessed(Laplace(1.0, 2.0), nonnegative)  # scale 2
    s = torch.tensor([[0.7]])
    at_zero = mech.log_prob(torch.zeros(1, 1), s).exp().item()
    assert at_zero == pytest.approx(stats.laplace(0.7, 2.0).cdf(0.0), rel=1e-13)
    grid = torch.linspace(0, 200, 400001)[:, None]
    assert torch.equal(mech.log_prob(grid[1:], s), mech.inner.log_prob(grid[1:], s))  # a density above 0
    density = torch.trapezoid(mech.inner.log_prob(grid, s).exp(), grid[:, 0]).item()
    assert at_zero + density == pytest.approx(1.0, abs=1e-6)
    zeros = int((draws(mech, s[0], 20000) == 0).sum())  # 20 000 draws
    assert stats.binomtest(zeros, 20000, at_zero).pvalue > 1e-3
    assert mech.log_prob(torch.tensor([[-0.1]]), s).item() == -math.inf
    assert mech.in_support(torch.tensor([[0.0], [0.3], [-0.3]])).tolist() == [True, True, False]


@pytest.mark.parametrize("inner", [Laplace(0.5, 1.0), Gaussian(1.0, 1e-5, 1.0)])
def test_rounded_continuous_mechanism_pmf(inner):
    mech = PostProcessed(inner, rounded)
    assert mech.lattice == 1 and mech.has_log_prob
    ref = stats.laplace(0.3, inner.scale) if isinstance(inner, Laplace) else stats.norm(0.3, inner.sigma)
    k = np.arange(-60, 61)
    p = mech.log_prob(torch.as_tensor(k, dtype=torch.float64)[:, None], torch.tensor([[0.3]])).exp().numpy()
    assert np.allclose(p, ref.cdf(k + 0.5) - ref.cdf(k - 0.5), rtol=1e-9, atol=1e-15)
    far = mech.log_prob(
        torch.tensor([[400.0]]), torch.tensor([[0.3]])
    ).item()  # the upper tail, no cancellation
    upper, lower = ref.logsf(399.5), ref.logsf(400.5)
    assert far == pytest.approx(upper + np.log1p(-np.exp(lower - upper)), rel=1e-9)
    released = draws(mech, torch.tensor([0.3]), 20000)[:, 0].numpy().astype(int)  # 20 000 draws
    lo = released.min()
    observed = np.bincount(released - lo)
    assert (
        chi_square_pvalue(
            observed,
            20000
            * (
                ref.cdf(np.arange(lo, lo + len(observed)) + 0.5)
                - ref.cdf(np.arange(lo, lo + len(observed)) - 0.5)
            ),
        )
        > 1e-3
    )
    best = mech.max_log_prob(torch.tensor([[4.0]]))
    assert best.item() == pytest.approx(
        mech.log_prob(torch.tensor([[4.0]]), torch.tensor([[4.0]])).item(), rel=1e-12
    )
    assert mech.log_prob(torch.tensor([[0.5]]), torch.tensor([[0.3]])).item() == -math.inf


def test_steps_compose_rounded_then_clamped():
    inner = Gaussian.from_sigma(1.5, 1.0)
    mech = PostProcessed(inner, [rounded, nonnegative])
    assert isinstance(mech.inner, PostProcessed) and mech.has_log_prob and mech.lattice == 1
    ref = stats.norm(0.8, 1.5)
    y = torch.arange(0.0, 30.0)[:, None]
    p = mech.log_prob(y, torch.tensor([[0.8]])).exp().numpy()
    expected = np.append(ref.cdf(0.5), ref.cdf(np.arange(1, 30) + 0.5) - ref.cdf(np.arange(1, 30) - 0.5))
    assert np.allclose(p, expected, rtol=1e-10) and p.sum() == pytest.approx(1.0, abs=1e-12)
    clamped_then_rounded = PostProcessed(inner, [nonnegative, rounded])
    assert not clamped_then_rounded.has_log_prob  # not implemented that way round; the step says so
    assert "rounding has an exact likelihood only" in clamped_then_rounded.likelihood_problem


def test_clamped_discrete_gaussian_far_tail_is_finite_and_exact():
    mech = PostProcessed(DiscreteGaussian(sigma=1.0), nonnegative)
    log_p0 = mech.log_prob(torch.zeros(1, 1), torch.tensor([[30.0]])).item()  # log P(noise <= -30)
    k = np.arange(30, 200)
    expected = np.logaddexp.reduce(-(k**2) / 2.0) - math.log(np.exp(-(np.arange(-50, 51) ** 2) / 2.0).sum())
    assert log_p0 == pytest.approx(expected, rel=1e-12)


# ---- the consistency step ---------------------------------------------------------------------------------------


def test_consistent_total_invariants():
    mech = PostProcessed(DiscreteGaussian(sigma=4.0, dim=4), consistent_total)
    assert mech.lattice == 1 and not mech.has_log_prob and mech.input_dim == 4
    s = torch.tensor([[[3.0, 0.0, 10.0, 1.0]], [[50.0, 20.0, 0.0, 30.0]]])
    u = torch.rand(2, 64, 4, generator=torch.Generator().manual_seed(0))
    y = mech.sample(s, u)
    assert y.shape == (2, 64, 4) and torch.equal(y, mech.sample(s, u))
    assert torch.equal(y.sum(-1), s.sum(-1).expand(2, 64)) and bool(mech.in_support(y).all())
    assert (y >= 0).all() and torch.equal(y, y.round())
    quiet = PostProcessed(DiscreteGaussian(sigma=0.05, dim=3), consistent_total)
    assert torch.equal(quiet.sample(torch.tensor([7.0, 0.0, 2.0])), torch.tensor([7.0, 0.0, 2.0]))
    # Largest remainders: (2.3, 3.4, 4.3) of 10 -> floors (2, 3, 4) and one unit to the largest remainder.
    gauss = PostProcessed(Gaussian.from_sigma(1.0, 1.0, dim=3), consistent_total)
    assert gauss.step(torch.tensor([2.3, 3.4, 4.3]), torch.tensor([3.0, 3.0, 4.0])).tolist() == [
        2.0,
        4.0,
        4.0,
    ]
    # Rescaled to the total 20: (4.6, 6.8, 8.6) -> floors (4, 6, 8), two units to the two largest remainders.
    assert gauss.step(torch.tensor([2.3, 3.4, 4.3]), torch.tensor([5.0, 5.0, 10.0])).tolist() == [
        5.0,
        7.0,
        8.0,
    ]
    assert gauss.step(torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([2.0, 0.0, 0.0])).tolist() == [
        1.0,
        1.0,
        0.0,
    ]
    with pytest.raises(IntractableLikelihood, match="consistent_total.*intractable") as error:
        mech.log_prob(y[0], s[0])
    assert one_line(error)
    with pytest.raises(ValueError, match=">= 2 cells"):
        PostProcessed(DiscreteGaussian(sigma=1.0), consistent_total)


# ---- refusals and acceptances -----------------------------------------------------------------------------------


def counting_task(mechanism, y_obs):
    calls = []

    def simulator(theta, generator=None):
        calls.append(theta.shape[0])
        return torch.poisson(theta.expand(-1, mechanism.input_dim), generator=generator)

    task = Task(
        name="cells",
        prior=Independent(Gamma(torch.tensor([20.0]), torch.tensor([1.0])), 1),
        simulator=simulator,
        mechanism=mechanism,
        epsilon=mechanism.epsilon,
        y_obs=y_obs,
    )
    return task, calls


def test_likelihood_methods_refuse_consistency_before_any_simulation():
    mech = PostProcessed(DiscreteGaussian(1.0, 1e-6, sensitivity=math.sqrt(3), dim=3), consistent_total)
    task, calls = counting_task(mech, torch.tensor([[20.0, 18.0, 25.0]]))
    for run, name in [
        (lambda: rejection_abc(task, 10, progress=False), "rejection_abc"),
        (lambda: abc_is(task, 10, progress=False), "abc_is"),
        (lambda: METHODS["rejection_abc"].check(task), "rejection_abc"),
        (lambda: METHODS["pmmh"].check(task), "pmmh"),
    ]:
        with pytest.raises(
            IntractableLikelihood, match=f"^{name} needs the likelihood.*consistency step"
        ) as error:
            run()
        assert one_line(error)
    assert calls == []
    sppe = SPPE(task, rounds=2, sims_per_round=100, progress=False)  # SPPE only simulates
    assert sppe.task is task and calls == []
    sple = SPLE(task, rounds=2, sims_per_round=100, progress=False)  # integer cells: a lattice, dequantized
    assert sple.dequantize and calls == []
    METHODS["sple"].check(task)
    assert reference_posterior(task, {}, method="auto").samples is None  # no exact reference: none


def test_sple_refuses_an_atom_on_a_density_but_sppe_and_abc_accept_it():
    mech = PostProcessed(Laplace(0.5, 1.0, dim=2), nonnegative)
    task, calls = counting_task(mech, torch.tensor([[0.0, 14.2]]))
    with pytest.raises(
        ValueError, match="^SPLE models the release with a likelihood flow.*atom at 0"
    ) as error:
        SPLE(task, rounds=2, sims_per_round=100, progress=False)
    assert one_line(error)
    with pytest.raises(ValueError, match="^sple models"):
        METHODS["sple"].check(task)
    SPPE(task, rounds=2, sims_per_round=100, progress=False)
    METHODS["rejection_abc"].check(task)  # the mixed likelihood is exact: exact ABC runs
    result = rejection_abc(task, 50, seed=0, progress=False)
    assert result.samples.shape == (50, 1) and calls
    # Rounding first makes it a lattice release, which SPLE dequantizes.
    lattice_task, _ = counting_task(
        PostProcessed(Laplace(0.5, 1.0, dim=2), [rounded, nonnegative]), torch.tensor([[0.0, 14.0]])
    )
    assert SPLE(lattice_task, rounds=2, sims_per_round=100, progress=False).dequantize


def test_user_defined_steps():
    inner = Gaussian.from_sigma(1.0, 1.0)
    plain = PostProcessed(inner, torch.exp)
    assert not plain.has_log_prob and plain.lattice is None and repr(plain).endswith(", exp)")
    assert (plain.sample(torch.zeros(100, 1)) > 0).all()
    with pytest.raises(ValueError, match="not declared to keep a density or a lattice"):
        plain.require_likelihood_flow("SPLE")
    with pytest.raises(IntractableLikelihood, match="^abc_is needs the likelihood.*user-defined step 'exp'"):
        plain.require_log_prob("abc_is")
    PostProcessed(inner, PostProcessing(torch.exp, keeps_density=True)).require_likelihood_flow("SPLE")
    halves = PostProcessed(inner, PostProcessing(lambda x: torch.round(2 * x) / 2, "halves", lattice=0.5))
    assert (
        halves.lattice == 0.5
        and bool(halves.in_support(torch.tensor([[1.5]])))
        and not bool(halves.in_support(torch.tensor([[0.3]])))
    )
    halves.require_likelihood_flow("SPLE")


def test_a_tensor_of_epsilons_recalibrates_the_inner_mechanism_per_row():
    mech = PostProcessed(DiscreteLaplace(0.5, 1.0), nonnegative)
    eps = torch.tensor([[0.5], [2.0]])
    batched = mech.with_epsilon(eps)
    assert isinstance(batched, PostProcessed) and batched.step is nonnegative
    assert repr(batched) == (
        "PostProcessed(DiscreteLaplace(dim=1, epsilon=tensor(0.5, 2), sensitivity=1, scale=tensor(2, 0.5)), "
        "nonnegative)"
    )
    u = torch.tensor([[0.01], [0.01]], dtype=torch.float64)
    s = torch.full((2, 1), 3.0, dtype=torch.float64)
    rows = [mech.with_epsilon(float(e)).sample(s[i : i + 1], u[i : i + 1]) for i, e in enumerate(eps)]
    assert torch.equal(batched.sample(s, u), torch.cat(rows))


def test_log_prob_refuses_the_wrong_widths():
    mech = PostProcessed(Laplace(1.0, 1.0, dim=2), nonnegative)
    with pytest.raises(
        ValueError, match="^y must have last dimension 2 for PostProcessed, got shape \\(2, 1\\)$"
    ):
        mech.log_prob(torch.zeros(2, 1), torch.zeros(2, 2))


def test_privacy_levels_and_recalibration_follow_the_inner_mechanism():
    mech = PostProcessed(DiscreteLaplace(0.5, 1.0, dim=2), nonnegative)
    assert (mech.epsilon, mech.delta, mech.dim, mech.noise_dim) == (0.5, 0.0, 2, 2)
    again = mech.with_epsilon(2.0)
    assert (
        isinstance(again, PostProcessed)
        and again.inner.scale == pytest.approx(0.5)
        and again.step is nonnegative
    )
    gdp = PostProcessed(Gaussian.gdp(0.5, 1.0), rounded)
    assert gdp.mu == 0.5 and not hasattr(gdp, "sigma")
    task, _ = counting_task(
        PostProcessed(DiscreteGaussian.from_rho(0.3, dim=1), nonnegative), torch.tensor([[3.0]])
    )
    assert task.epsilon == task.mechanism.inner.epsilon
    with pytest.raises(ValueError, match="outside the support"):
        task.check_release(torch.tensor([[-1.0]]))
