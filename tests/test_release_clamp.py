"""Clamping releases to the statistic's range: lossless under Laplace-type noise (checked on exact posteriors),
kept to the coordinates where it is, applied by posterior flows in training, sampling, the release check and
saved files, and refused in one line where the bounds are malformed or the simulator leaves them."""

import math
import warnings

import pytest
import torch

import dpsbi
from dpsbi.inference.flows import FlowSettings
from dpsbi.inference.release_check import ReleaseOutsideTraining
from dpsbi.mechanisms import Composition, Gaussian, Laplace

TINY = dict(flow=dict(transforms=1, hidden=8), training=dict(max_steps=5), progress=False)


@pytest.mark.parametrize("noise", ["laplace", "discrete_laplace"])
def test_a_release_below_every_count_has_the_posterior_of_one_at_zero(noise):
    """Gong's Poisson count (exact Gamma-mixture posterior): a release of -5 (-4 for integer noise) says what
    one of 0 says, for Laplace and discrete Laplace noise, while one among the likely counts says more."""
    task = dpsbi.tasks.load("poisson_counts", noise=noise, epsilon=0.5, y_obs="simulate")
    low, high = task.release_bounds()
    assert (float(low[0]), float(high[0])) == (0.0, math.inf)

    def moments(y: float) -> tuple[float, float]:
        posterior = task.exact_posterior(torch.tensor([[y]], dtype=torch.float64))
        return float(posterior.mean.reshape(())), float(posterior.variance.reshape(()))

    far = -5.0 if noise == "laplace" else -4.0
    assert moments(far) == pytest.approx(moments(0.0), rel=1e-9)
    assert moments(15.0)[0] > moments(0.0)[0] * 1.05


def test_only_coordinates_with_laplace_type_noise_are_clamped():
    assert Laplace(1.0, 1.0, dim=2).clamps_lossless == (True, True)
    assert Gaussian(1.0, 1e-5, 1.0, dim=2).clamps_lossless == (False, False)
    mixed = Composition([Laplace(1.0, 1.0, dim=2), Gaussian(1.0, 1e-5, 1.0, dim=1)])
    assert mixed.clamps_lossless == (True, True, False)
    prior = dpsbi.tasks.box([0.0], [1.0])
    bounds = [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    task = dpsbi.from_simulator(
        prior, lambda t, rng: t.repeat(1, 3), mixed, [0.5, 0.5, 0.5], statistic_bounds=bounds
    )
    assert task.release_bounds().tolist() == [[0.0, 0.0, -math.inf], [1.0, 1.0, math.inf]]
    gaussian = dpsbi.from_simulator(
        prior, lambda t, rng: t, Gaussian(1.0, 1e-5, 1.0, dim=1), [0.5], statistic_bounds=[[0.0], [1.0]]
    )
    assert gaussian.release_bounds() is None  # nothing to clamp: Gaussian noise is not lossless to clamp
    # one (low, high) holds for every coordinate, as a proportion's (0, 1)
    shared = dpsbi.from_simulator(
        prior, lambda t, rng: t.repeat(1, 3), mixed, [0.5] * 3, statistic_bounds=(0, 1)
    )
    assert shared.statistic_bounds.tolist() == bounds


@pytest.mark.parametrize(
    "bounds, message",
    [
        ([[0.0, 0.0]], "two numbers for every coordinate, or two sequences of 1 numbers"),
        ([0.0, 1.0, 2.0], "two numbers for every coordinate"),
        ([[1.0], [0.0]], "with low < high"),
        ([[0.0], [float("nan")]], "with low < high"),
        ([[0.0], [1.0, 2.0]], "statistic_bounds must be (low, high), two sequences of numbers"),
    ],
)
def test_malformed_bounds_are_refused_in_one_line(bounds, message):
    with pytest.raises(ValueError) as error:
        dpsbi.from_simulator(
            dpsbi.tasks.box([0.0], [1.0]),
            lambda t, rng: t,
            Laplace(1.0, 1.0, dim=1),
            [0.5],
            statistic_bounds=bounds,
        )
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_simulator_that_leaves_its_bounds_is_an_error():
    task = dpsbi.from_simulator(
        dpsbi.tasks.box([0.0], [1.0]),
        lambda t, rng: t + 2.0,
        Laplace(1.0, 1.0, dim=1),
        [0.5],
        statistic_bounds=[[0.0], [1.0]],
    )
    with pytest.raises(RuntimeError, match="statistics outside statistic_bounds for theta rows"):
        task.simulate(torch.full((3, 1), 0.5))


def _share(theta, rng):
    """A proportion: the share of 50 records with a trait of probability theta."""
    return torch.binomial(torch.full_like(theta, 50.0), theta, generator=rng) / 50


@pytest.fixture(scope="module")
def shares():
    task = dpsbi.from_simulator(
        dpsbi.tasks.box([0.0], [1.0]),
        _share,
        Laplace(1.0, 0.02, dim=1),
        [0.3],
        statistic_bounds=[[0.0], [1.0]],
    )
    fits = {}
    for clamp in (True, False):
        flow = {**TINY["flow"], "clamp_release": clamp}
        estimator = dpsbi.SPPE(task, rounds=1, sims_per_round=200, seed=0, **{**TINY, "flow": flow})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ReleaseOutsideTraining)
            fits[clamp] = estimator.run()
    return task, fits


def test_a_posterior_flow_sees_the_clamped_release_in_sampling_checking_and_files(shares, tmp_path):
    task, fits = shares
    clamped, raw = fits[True], fits[False]
    far, zero = torch.tensor([[-3.0]]), torch.tensor([[0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReleaseOutsideTraining)  # clamped to 0, which training releases reach
        draws = clamped.sample((50,), y=far, seed=1)
    message = clamped.training_releases.warning(torch.tensor([[-3.0], [5.0]]), ["y0"], "SPPE posterior")
    assert "row 1: y0 = 5, clamped to 1 (training releases span" in message and "row 0" not in message
    assert torch.equal(draws, clamped.sample((50,), y=zero, seed=1))
    assert clamped.log_prob(draws[:5], y=far).tolist() == clamped.log_prob(draws[:5], y=zero).tolist()
    with pytest.warns(ReleaseOutsideTraining, match=r"y0 = -3 \(training releases span"):
        unclamped = raw.sample((50,), y=far, seed=1)  # the same release reaches an unclamped flow as it is
    assert not torch.equal(unclamped, raw.sample((50,), y=zero, seed=1))
    path = tmp_path / "clamped.pt"
    clamped.save(path)
    loaded = dpsbi.load_posterior(path, task=task)
    assert torch.equal(loaded.sample((50,), y=far, seed=1), draws)
    assert loaded.training_releases.clamp[0, 0].item() == 0.0


def test_files_written_before_clamping_existed_load_unclamped():
    assert FlowSettings.recorded({}).clamp_release is False
    assert FlowSettings().clamp_release is True
