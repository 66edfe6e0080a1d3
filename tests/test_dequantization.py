"""SPLE on lattice releases: uniform dequantization in the loss, and the likelihood at a release as the flow's
mass on its lattice cell (a probability: the masses sum to one over the lattice)."""

import math

import pytest
import torch
from torch.distributions import Independent, Normal

import dpsbi
from dpsbi.inference.losses import inner_releases
from dpsbi.inference.posterior import LikelihoodPosterior
from dpsbi.mechanisms import BinomialCurve, Gaussian, RandomizedResponse

TRIALS, POPULATION = 10, 100


def lattice_task() -> dpsbi.tasks.Task:
    """theta ~ U(0.05, 0.95), confidential count s = round(100 theta), release Bin(10, (s + 1) / 102) / 10."""
    mechanism = BinomialCurve(TRIALS, POPULATION, 1, pseudo_count=1.0)
    return dpsbi.from_simulator(
        dpsbi.tasks.box(0.05, 0.95),
        lambda theta, rng=None: torch.round(theta * POPULATION),
        mechanism,
        [0.4],
        name="lattice",
    )


def test_lattice_spacings():
    assert BinomialCurve(1000, 10**6, 10, epsilon=1.0).lattice == pytest.approx(1e-3)
    assert RandomizedResponse(1.0).lattice == 1.0
    assert Gaussian(1.0, 1e-5, 1.0, 2).lattice is None


def test_dequantized_releases_fill_their_cells_with_the_mechanism_probabilities():
    """Cell index ~ Bin(N, p) and the offset within the cell is uniform: the RQMC point's extra coordinates."""
    mechanism = BinomialCurve(TRIALS, POPULATION, 1, pseudo_count=1.0)
    s = torch.full((4000, 1), 30.0)
    y = inner_releases(s, mechanism, 8, qmc=True, generator=torch.Generator().manual_seed(0), dequantize=True)
    cell = torch.floor(y * TRIALS + 1e-9)
    offset = y * TRIALS - cell
    p = float(mechanism.probability(torch.tensor(30.0)))
    n = y.numel()
    assert abs(float(cell.mean()) - TRIALS * p) < 4 * math.sqrt(TRIALS * p * (1 - p) / n)
    assert abs(float(offset.mean()) - 0.5) < 4 * math.sqrt(1 / 12 / n)
    assert float(offset.min()) >= 0 and float(offset.max()) < 1
    plain = inner_releases(s[:5], mechanism, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(
        plain * TRIALS, torch.round(plain * TRIALS)
    )  # without it, releases stay on the lattice


class StandardNormal(torch.nn.Module):
    """A stand-in likelihood flow: ``q(y | theta) = N(y; 0.3 + 0.1 theta, 0.2^2 I)`` in every coordinate."""

    dim = 2

    def log_prob(self, y, context):
        return Independent(Normal(0.3 + 0.1 * context.mean(-1, keepdim=True), 0.2), 1).log_prob(y)


def test_cell_masses_of_a_known_density_sum_to_one():
    """The mass rule itself (``h^dim`` times the mean over cell points) on a density known exactly."""
    mechanism = BinomialCurve(20, POPULATION, 2, pseudo_count=1.0)
    task = dpsbi.from_simulator(
        dpsbi.tasks.box([0, 0], [1, 1]),
        lambda theta, rng=None: torch.round(theta * POPULATION),
        mechanism,
        [0.4, 0.5],
    )
    posterior = LikelihoodPosterior(task, StandardNormal(), "SPLE", dequantized=True, cell_points=8)
    k = torch.arange(-40, 60, dtype=torch.get_default_dtype()) / 20  # cells covering 0.3 +- 10 sd
    grid = torch.cartesian_prod(k, k)  # (10000, 2) lattice points
    for theta in (0.0, 0.5):
        mass = posterior.log_likelihood_z(grid, torch.full((1, 2), theta)).exp().sum()
        assert float(mass) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
def test_sple_likelihood_on_a_lattice_is_a_proper_pmf_close_to_the_exact_one():
    """Trained with dequantization, the likelihood's masses over the 11 releases k / 10 sum to one (up to the
    flow's mass outside [0, 1.1)) and match the exact binomial pmf. Without it the same flow piles density on
    the lattice points: h * sum_k q(k / N) is far from one (measured 1.06-1.57 at these seeds)."""
    task = lattice_task()
    releases = (torch.arange(TRIALS + 1, dtype=torch.get_default_dtype()) / TRIALS)[
        :, None, None
    ]  # (11, 1, 1)
    theta = torch.tensor([[0.2], [0.5], [0.8]])
    exact = task.mechanism.log_prob(
        releases.expand(-1, 3, -1), torch.round(theta * POPULATION)
    ).exp()  # (11, 3)
    masses = {}
    for dequantize in (True, False):
        estimator = dpsbi.SPLE(
            task, 1, 1000, 8, dequantize=dequantize, training=dict(max_epochs=40), seed=1, progress=False
        )
        posterior = estimator.run()
        assert posterior.dequantized is dequantize
        log_q = posterior.log_likelihood_z(releases, posterior.space.to_z(theta).unsqueeze(0))  # (11, 3)
        masses[dequantize] = log_q.exp() * (1.0 if dequantize else task.mechanism.lattice)
    total = masses[True].sum(0)
    tv = 0.5 * (masses[True] - exact).abs().sum(0)
    print(
        f"dequantized: masses {total.tolist()}, TV to the exact pmf {tv.tolist()}; plain: h * sum q = {masses[False].sum(0).tolist()}"
    )
    assert ((total > 0.95) & (total < 1.01)).all(), total
    # 1000 training pairs spread over theta: a few hundred releases inform each theta; an empirical 11-cell pmf
    # from 250 draws is off by TV ~0.07 on average, so 0.1 fails only a much worse fit.
    assert (tv < 0.1).all(), tv
    assert (masses[False].sum(0) - 1).abs().max() > 0.05
