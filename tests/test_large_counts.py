"""Counts beyond 2^24 (a state's population, up to 2^31 and on to 2^53) stay exact wherever they travel: the
discrete mechanisms' noise and densities, simulated summaries, releases, the census task at a state's total,
and the z-scoring at the flows' float32 boundary."""

import math

import numpy as np
import pytest
import torch

import dpsbi
from dpsbi.inference.flows import ConditionalFlow, FlowSettings
from dpsbi.mechanisms import DiscreteGaussian, DiscreteLaplace, PostProcessed, nonnegative

CALIFORNIA = 39_538_223  # the 2020 Census count of California
COUNTS = [CALIFORNIA, 2**31 - 5]
P = math.exp(-1.0)  # DiscreteLaplace(1, 1): scale t = 1, P(n = k) = (1 - p) / (1 + p) p^|k|
LOG_P0 = math.log((1 - P) / (1 + P))


def _noise_moments() -> tuple[float, float]:
    """Exact variance and fourth central moment of the discrete Laplace noise at scale 1."""
    k = np.arange(-200, 201, dtype=np.float64)
    pmf = np.exp(LOG_P0 - np.abs(k))
    return float(pmf @ k**2), float(pmf @ k**4)


@pytest.mark.parametrize("count", COUNTS)
def test_discrete_laplace_noise_on_a_large_count_has_its_exact_distribution(count):
    mech, n = DiscreteLaplace(1.0, 1.0), 200_000
    y = mech.sample(torch.full((n, 1), count, dtype=torch.int64), generator=torch.Generator().manual_seed(0))
    assert y.dtype == torch.float64
    noise = (y - count).flatten()
    var, mu4 = _noise_moments()
    assert abs(float(noise.mean())) < 4 * math.sqrt(var / n)
    assert abs(float(noise.var()) - var) < 4 * math.sqrt((mu4 - var**2) / n)  # sd 1.36, not 1.17 or 0
    frequencies = torch.bincount((noise + 3).clamp(0, 6).long(), minlength=7)[1:6] / n  # k = -2..2
    expected = torch.tensor([math.exp(LOG_P0 - abs(k)) for k in range(-2, 3)], dtype=torch.float64)
    assert (frequencies - expected).abs().max() < 4 * math.sqrt(0.25 / n)  # every integer, not every 4th


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("mech", [DiscreteLaplace(1.0, 1.0), DiscreteGaussian(sigma=2.0)])
def test_log_prob_of_a_release_two_away_is_exact(count, mech):
    exact = mech.noise_log_prob(torch.tensor([2.0], dtype=torch.float64)).item()
    for y, s in [
        (torch.tensor([[count + 2]]), torch.tensor([[count]])),
        (torch.tensor([[count + 2.0]], dtype=torch.float64), torch.tensor([[count]], dtype=torch.float64)),
        (mech.validate_release([count + 2]), mech.as_values(torch.tensor([[count]]))),
    ]:
        assert mech.log_prob(y, s).item() == pytest.approx(exact, abs=1e-12)
    if isinstance(mech, DiscreteLaplace):
        assert exact == pytest.approx(LOG_P0 - 2)  # -2.77


@pytest.mark.parametrize("count", COUNTS)
def test_a_task_keeps_large_counts_exact_from_simulator_to_release(count):
    def simulator(theta, generator=None):
        return torch.full((theta.shape[0], 1), count, dtype=torch.int64)

    task = dpsbi.from_simulator(
        dpsbi.tasks.box([0.0], [1.0]), simulator, DiscreteLaplace(1.0, 1.0), y_obs=count
    )
    assert task.y_obs.dtype == torch.float64 and int(task.y_obs.item()) == count
    assert int(task.check_release(torch.tensor([count + 1])).item()) == count + 1
    s = task.simulate(torch.full((3, 1), 0.5))
    assert s.dtype == torch.float64 and (s == count).all()
    y = task.simulate_release(torch.full((1000, 1), 0.5), torch.Generator().manual_seed(1))
    assert set((y - count).flatten().tolist()) >= {-1.0, 0.0, 1.0}
    posterior_y = task.mechanism.log_prob(task.y_obs + 2, s[:1]).item()
    assert posterior_y == pytest.approx(LOG_P0 - 2, abs=1e-12)


def test_counts_a_dtype_cannot_hold_are_refused_in_one_line():
    mech = DiscreteLaplace(1.0, 1.0)
    rounded = torch.tensor([[float(CALIFORNIA)]], dtype=torch.float32)  # already 39538224
    for call in (lambda: mech.validate_release(rounded), lambda: mech.sample(rounded)):
        with pytest.raises(
            ValueError, match=r"float32, which holds integers exactly only up to 16777216 \(2\^24\)"
        ):
            call()
    with pytest.raises(ValueError, match="2\\^53"):
        mech.validate_release(torch.tensor([[2.0**60]], dtype=torch.float64))

    def float32_simulator(theta, generator=None):
        return torch.full((theta.shape[0], 1), float(CALIFORNIA), dtype=torch.float32)

    task = dpsbi.from_simulator(dpsbi.tasks.box([0.0], [1.0]), lambda t, g=None: t.round(), mech, y_obs=1)
    task.simulator = float32_simulator
    with pytest.raises(RuntimeError, match="simulator returned: 39538224 in torch.float32.*int64 or float64"):
        task.simulate(torch.zeros(2, 1))


def test_the_census_task_at_a_state_sized_total():
    task = dpsbi.tasks.load("census_table", population=CALIFORNIA)
    assert task.y_obs.dtype == torch.float64 and torch.equal(task.y_obs, task.y_obs.round())
    theta, rows = task.true_theta.expand(400, 3), 400
    s = task.simulate(theta, torch.Generator().manual_seed(0))
    assert s.dtype == torch.float64 and (s.sum(1) == CALIFORNIA).all()  # the invariant total, to the person
    p = dpsbi.tasks.census.cell_log_probs(task.true_theta.double(), dpsbi.tasks.census.age_edges(None)).exp()[
        0
    ]
    for cell in (0, 22, 45):  # multinomial margins: Binomial(N, p_i)
        mean, var = CALIFORNIA * p[cell].item(), CALIFORNIA * p[cell].item() * (1 - p[cell].item())
        assert abs(s[:, cell].mean().item() - mean) < 4 * math.sqrt(var / rows)
        assert abs(s[:, cell].var().item() / var - 1) < 4 * math.sqrt(2 / rows)
    y = task.release(s, generator=torch.Generator().manual_seed(1))
    inner = task.mechanism.inner
    assert ((y - s).abs() <= inner.half_width).all() and torch.equal(y, y.round())
    assert bool((y != s).any()) and float((y - s).std()) == pytest.approx(inner.sigma, rel=0.05)
    assert not hasattr(
        task, "exact_log_likelihood"
    )  # its table would be 46 x 39.5M: simulated references instead
    released = task.check_release(task.y_obs.tolist())
    assert torch.equal(released, task.y_obs)


@pytest.mark.parametrize("side", ["context", "inputs"])
def test_flows_z_score_large_counts_before_float32(side):
    """SPPE's flow takes releases as context, SPLE's as inputs: one count apart must stay one count apart."""
    torch.manual_seed(0)
    counts = CALIFORNIA + torch.randint(-3, 4, (200, 1)).double()
    theta = torch.randn(200, 1)
    inputs, context = (theta, counts) if side == "context" else (counts, theta)
    flow = ConditionalFlow(FlowSettings(transforms=1, hidden=8), inputs, context)
    assert flow.dtype == torch.get_default_dtype()
    pair = torch.tensor([[CALIFORNIA], [CALIFORNIA + 1]], dtype=torch.float64)
    other = torch.zeros(2, 1)
    log_q = flow.log_prob(other, pair) if side == "context" else flow.log_prob(pair, other)
    assert log_q.dtype == flow.dtype and torch.isfinite(log_q).all()
    assert log_q[0] != log_q[1]


def test_sppe_and_sple_train_on_state_sized_counts():
    mech = PostProcessed(DiscreteLaplace(1.0, 1.0), nonnegative)

    def simulator(theta, generator=None):
        return torch.round(CALIFORNIA + 10 * theta).to(torch.int64)

    task = dpsbi.from_simulator(dpsbi.tasks.box([0.0], [1.0]), simulator, mech, y_obs=CALIFORNIA + 5)
    small = dict(
        rounds=1,
        sims_per_round=200,
        inner_samples=2,
        flow=dict(transforms=1, hidden=8),
        training=dict(max_epochs=2),
        progress=False,
    )
    for method in (dpsbi.SPPE, dpsbi.SPLE):
        settings = dict(small, mcmc=dict(num_chains=2, warmup=10, thin=1)) if method is dpsbi.SPLE else small
        draws = method(task, **settings).run().sample((20,), seed=0)
        assert draws.shape == (20, 1) and torch.isfinite(draws).all()
