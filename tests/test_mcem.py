"""MCEM (Gong, Sec. 4) against the exact likelihood of the Poisson-count release.

The oracle is ``dpsbi.tasks.poisson_counts.exact_log_likelihood``: its argmax on a 0.001 grid and its
numerical second derivative. MCEM's Monte Carlo error at the fixed point is that of a weighted mean of
``s | y, theta`` (sd / sqrt(ESS)), inflated by 1 / sqrt(1 - r^2) for the EM map's contraction rate
``r = 1 - I_obs / I_complete``; the estimate must be within 4 such standard errors.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Gamma, Independent

import dpsbi
from dpsbi.baselines import PoissonFamily, mcem
from dpsbi.mechanisms import Laplace
from dpsbi.tasks import Task
from dpsbi.tasks.poisson_counts import exact_log_likelihood

STAGES = ((1_000, 1e-3), (100_000, 1e-4))


def exact_mle_and_information(y: float, epsilon: float = 0.2) -> tuple[float, float]:
    """Grid argmax (step 0.001) of the exact log-likelihood and minus its second derivative there."""
    grid = torch.arange(max(y - 20, 1.0), y + 20, 0.001, dtype=torch.float64)[:, None]
    mle = float(grid[exact_log_likelihood(grid, torch.tensor([y]), epsilon).argmax()])
    h = 0.01
    points = torch.tensor([[mle - h], [mle], [mle + h]], dtype=torch.float64)
    ll = exact_log_likelihood(points, torch.tensor([y]), epsilon)
    return mle, float(-(ll[0] - 2 * ll[1] + ll[2]) / h**2)


def mc_tolerance(mle: float, information: float, ess: float) -> float:
    """4 Monte Carlo standard errors of a converged Poisson MCEM estimate (see the module docstring)."""
    complete = 1 / mle  # E[s | y, mle] / mle^2 with E[s | y, mle] = mle at the fixed point
    sd = mle * math.sqrt(complete - information)  # sd of s | y, mle, from Louis' identity
    rate = 1 - information / complete
    return 4 * sd / math.sqrt(ess) / math.sqrt(1 - rate**2)


@pytest.fixture(scope="module")
def oracle():
    return exact_mle_and_information(37.4)


def test_oracle_reproduces_gong(oracle):
    mle, information = oracle
    assert mle == pytest.approx(37.237, abs=1e-3)  # Gong, Sec. 4: 37.237 and 1.582e-2
    assert information == pytest.approx(1.582e-2, rel=1e-3)


def test_mcem_poisson_matches_exact_likelihood(oracle):
    mle, information = oracle
    task = dpsbi.tasks.load("poisson_counts", epsilon=0.2)
    result = mcem(task, theta0=torch.tensor([1.0]), stages=STAGES, max_iterations=50, seed=0, progress=False)
    ess = result.info["final_ess"]
    assert abs(result.estimate.item() - mle) < mc_tolerance(mle, information, ess)
    # Louis' information: its Monte Carlo error is ~1 % at this ESS (a variance estimate), far below 5 %.
    assert result.observed_information.item() == pytest.approx(information, rel=0.05)
    assert result.standard_error.item() == pytest.approx(information**-0.5, rel=0.05)
    # The observed score E[s | y, theta] / theta - 1 vanishes at the MLE, up to its Monte Carlo error.
    score_se = math.sqrt(1 / mle - information) / math.sqrt(ess)
    assert abs(result.score.item()) < 4 * score_se + 2 * information * abs(result.estimate.item() - mle)
    # Trace and bookkeeping: starts at theta0, the stages' draws increase, every draw is counted.
    draws = result.info["draws"]
    assert result.trace[0].item() == 1.0 and result.trace[-1].item() == result.estimate.item()
    assert len(result.trace) == len(draws) + 1 and draws[0] == 1_000 and draws[-1] == 100_000
    assert result.num_simulations == sum(draws) + 100_000
    assert result.info["converged"][0]


def test_mcem_custom_family_two_counts(oracle):
    """Two independent counts, each released with Laplace noise of scale 5, through a custom family: the
    information matrix is diagonal and each coordinate matches the one-count exact likelihood."""
    dtype = torch.get_default_dtype()
    task = Task(
        name="poisson_pair",
        prior=Independent(Gamma(torch.full((2,), 25.0, dtype=dtype), torch.ones(2, dtype=dtype)), 1),
        simulator=lambda theta, generator=None: torch.poisson(theta, generator=generator),
        mechanism=Laplace(epsilon=0.4, sensitivity=2.0, dim=2),
        epsilon=0.4,
        y_obs=torch.tensor([[37.4, 20.0]]),
    )
    with pytest.raises(ValueError, match="no exponential family registered"):
        mcem(task, progress=False)
    result = mcem(task, family=PoissonFamily(), stages=STAGES, seed=1, progress=False)
    ess = result.info["final_ess"]
    for j, y in enumerate((37.4, 20.0)):
        mle, information = oracle if j == 0 else exact_mle_and_information(y)
        assert abs(result.estimate[j].item() - mle) < mc_tolerance(mle, information, ess)
        assert result.observed_information[j, j].item() == pytest.approx(information, rel=0.05)
    off = result.observed_information[0, 1].item()
    assert abs(off) < 0.05 * result.observed_information.diagonal().min().item()


def test_mcem_bad_input():
    task = dpsbi.tasks.load("poisson_counts", epsilon=0.2)
    with pytest.raises(ValueError, match="stages"):
        mcem(task, stages=[], progress=False)
    with pytest.raises(ValueError, match="outside the prior's support"):
        mcem(task, theta0=torch.tensor([-1.0]), progress=False)
    with pytest.raises(ValueError, match="no exponential family registered"):
        mcem(dpsbi.tasks.load("regression", epsilon=10.0), progress=False)
