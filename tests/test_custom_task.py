"""Your own model: ``dpsbi.from_simulator`` wraps numpy or torch, per-row or vectorized simulators with
reproducible randomness, checks every input at construction, and trains SPPE and SPLE; ``Task.validate``
refuses an epsilon that is not the mechanism's."""

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch
from torch.distributions import ExpTransform, Independent, Normal, Poisson, SigmoidTransform

import dpsbi
from dpsbi.mechanisms import BinomialCurve, Gaussian, Laplace, RandomizedResponse
from dpsbi.tasks import Task, box, from_simulator, normal
from dpsbi.tasks.custom import takes_randomness

TINY = dict(
    sims_per_round=60,
    inner_samples=2,
    flow=dict(transforms=1, hidden=8),
    training=dict(max_epochs=1),
    progress=False,
)
RECORDS, LOW, HIGH = 50, -5.0, 5.0
#: Two clamped means of the same records: L1 sensitivity d (b - a) / n.
MECHANISM = Laplace(1.0, sensitivity=2 * (HIGH - LOW) / RECORDS, dim=2)
Y_OBS = [0.3, -0.2]


def numpy_row_simulator(theta, rng):
    """One parameter vector ``(2,)`` (float64 numpy) -> the two clamped means of 50 records ``(2,)``."""
    assert isinstance(theta, np.ndarray) and theta.shape == (2,) and theta.dtype == np.float64
    assert isinstance(rng, np.random.Generator)
    return rng.normal(theta, 1.0, size=(RECORDS, 2)).clip(LOW, HIGH).mean(0)


def numpy_global_simulator(theta):
    """Vectorized, on numpy's global stream (no rng argument): ``(n, 2) -> (n, 2)`` float64."""
    return (theta[:, None, :] + np.random.normal(size=(theta.shape[0], RECORDS, 2))).clip(LOW, HIGH).mean(1)


def torch_simulator(theta, generator):
    """Vectorized torch: ``(n, 2) -> (n, 2)``, drawing from the generator dpsbi passes."""
    assert generator is None or isinstance(generator, torch.Generator)
    noise = torch.randn(
        theta.shape[0], RECORDS, 2, generator=generator, device=theta.device, dtype=theta.dtype
    )
    return (theta[:, None, :] + noise).clamp(LOW, HIGH).mean(1)


SIMULATORS = {
    "numpy-per-row": (numpy_row_simulator, dict(vectorized=False, backend="numpy")),
    "numpy-global-stream": (numpy_global_simulator, dict(backend="numpy")),
    "torch-vectorized": (torch_simulator, {}),
}


def _task(kind: str = "numpy-per-row", **kwargs) -> Task:
    simulator, options = SIMULATORS[kind]
    return from_simulator(
        normal([0.0, 0.0], [1.0, 1.0]), simulator, MECHANISM, Y_OBS, **{**options, **kwargs}
    )


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("kind", ["numpy-per-row", "torch-vectorized"])
@pytest.mark.parametrize("method", ["SPPE", "SPLE"])
def test_a_user_simulator_trains_sppe_and_sple(kind, method):
    task = _task(kind)
    assert task.epsilon == 1.0 and task.parameter_names == ["theta_1", "theta_2"]
    draws = getattr(dpsbi, method)(task, rounds=1, **TINY).run().sample((10,), seed=0)
    assert draws.shape == (10, 2) and draws.dtype == torch.get_default_dtype() and torch.isfinite(draws).all()


def test_a_user_says_whether_the_simulator_is_costly():
    assert not _task().costly_simulator and _task(costly_simulator=True).costly_simulator
    assert dpsbi.SPPE(_task(costly_simulator=True), amortized=True).sims_per_round == 10_000


@pytest.mark.parametrize("kind", list(SIMULATORS))
def test_the_simulator_is_reproducible_from_the_generator(kind):
    task = _task(kind)
    theta = task.prior.sample((5,))
    first = task.simulate(theta, _generator(1))
    assert first.shape == (5, 2) and first.dtype == torch.get_default_dtype()
    assert torch.equal(task.simulate(theta, _generator(1)), first)
    assert not torch.equal(task.simulate(theta, _generator(2)), first)


def test_a_simulator_without_rng_leaves_the_global_streams_as_they_were():
    task = _task("numpy-global-stream")
    np.random.seed(5)
    torch.manual_seed(5)
    task.simulate(task.prior.sample((3,)), _generator(1))
    after = np.random.normal(), float(torch.randn(()))
    np.random.seed(5)
    torch.manual_seed(5)
    task.prior.sample((3,))  # the one use of torch's global stream above
    assert after == (np.random.normal(), float(torch.randn(())))


@pytest.mark.parametrize("kind", ["numpy-per-row", "numpy-global-stream"])
def test_a_resumed_run_of_a_numpy_simulator_is_accepted(kind, tmp_path):
    """Round 1, then a second estimator resumes for round 2: the stored simulations are reproduced (no
    warning) and the result is that of an uninterrupted run."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dpsbi.SPPE(_task(kind), rounds=1, atoms=3, checkpoint_dir=tmp_path / "split", **TINY).run()
        resumed = dpsbi.SPPE(_task(kind), rounds=2, atoms=3, checkpoint_dir=tmp_path / "split", **TINY)
        post = resumed.run()
    assert not [w for w in caught if "reproduce" in str(w.message)], [str(w.message) for w in caught]
    assert [h["round"] for h in resumed.history] == [1, 2]
    whole = dpsbi.SPPE(_task(kind), rounds=2, atoms=3, checkpoint_dir=tmp_path / "whole", **TINY).run()
    assert torch.equal(post.sample((20,), seed=3), whole.sample((20,), seed=3))


def test_a_simulator_that_is_not_reproducible_is_warned_about_at_construction():
    def unseeded(theta):
        return theta + torch.from_numpy(np.random.default_rng().normal(size=tuple(theta.shape))).to(theta)

    with pytest.warns(UserWarning, match="other summaries for the same generator seed"):
        from_simulator(normal([0.0, 0.0], [1.0, 1.0]), unseeded, MECHANISM, Y_OBS)


def test_construction_runs_the_simulator_on_two_prior_draws_only():
    rows = []

    def counting(theta, generator):
        rows.append(theta.shape[0])
        return torch_simulator(theta, generator)

    from_simulator(normal([0.0, 0.0], [1.0, 1.0]), counting, MECHANISM, Y_OBS)
    assert rows == [2, 2]  # the probe and its reproducibility check


def _nan_simulator(theta, generator):
    return theta * math.nan


def _failing_simulator(theta, generator):
    raise KeyError("column 'age'")


def _bits(theta, generator):
    return (theta > 0).to(theta.dtype)


class _NaNAboveOne(Independent):
    """A normal prior whose log density is NaN where theta_1 > 1 (a user's bug)."""

    def log_prob(self, value):
        return torch.where(value[..., 0] > 1, math.nan, super().log_prob(value))


BAD_INPUTS = {
    "release-length": (dict(y_obs=[0.1]), r"y_obs has 1 values but the mechanism releases 2"),
    "release-nan": (dict(y_obs=[math.nan, 0.0]), r"y_obs holds NaN/inf at positions \[0\]"),
    "release-inf": (dict(y_obs=[0.0, -math.inf]), r"y_obs holds NaN/inf at positions \[1\]"),
    "release-two-rows": (dict(y_obs=[[0.0, 0.1], [0.2, 0.3]]), r"y_obs must be one release"),
    "release-outside-support": (
        dict(mechanism=RandomizedResponse(1.0, dim=2), simulator=_bits, y_obs=[0.5, 1.0]),
        r"y_obs \[0.5, 1.0\] lies outside the support of RandomizedResponse",
    ),
    "prior-scalar": (
        dict(prior=Normal(0.0, 1.0)),
        r"prior must be over vectors \(event shape \(d,\)\), got event shape \(\)",
    ),
    "prior-batch-not-event": (
        dict(prior=Normal(torch.zeros(2), 1.0)),
        r"prior must be over vectors.*Independent\(prior, 1\)",
    ),
    "prior-not-a-distribution": (dict(prior=[0.0, 1.0]), r"prior must be a torch Distribution"),
    "prior-log-prob-nan": (  # SPLE used to drop theta_1 > 1 silently, SPPE to blame the simulator
        dict(prior=_NaNAboveOne(Normal(torch.zeros(2), torch.ones(2)), 1)),
        r"the prior _NaNAboveOne's log_prob is nan at its own draw theta=\[1\.\d+, ",
    ),
    "prior-discrete": (
        dict(prior=Independent(Poisson(torch.full((2,), 3.0)), 1)),
        r"the prior Independent is discrete \(support .*IntegerGreaterThan.*\); .*use a continuous prior",
    ),
    "transform-image-too-large": (
        dict(prior=box([0.0, 0.0], [1.0, 1.0]), transform=ExpTransform()),
        r"outside the prior's support.*its image is not the support",
    ),
    "transform-image-too-small": (
        dict(prior=box([0.0, 0.0], [10.0, 10.0]), transform=SigmoidTransform()),  # onto (0, 1) only
        r"does not map transform.inv\(theta\) back to theta for the prior draw .* the prior's support is larger than the transform's image",
    ),
    "transform-not-a-transform": (
        dict(transform=lambda z: z),
        r"transform must be a torch.distributions Transform",
    ),
    "true-theta-outside": (
        dict(prior=box([0.0, 0.0], [1.0, 1.0]), true_theta=[2.0, 0.5]),
        r"true_theta \[2.0, 0.5\] lies outside the prior's support",
    ),
    "true-theta-shape": (
        dict(true_theta=[0.1, 0.2, 0.3]),
        r"true_theta must have shape \(2,\) or \(1, 2\), got \(1, 3\)",
    ),
    "simulator-shape": (
        dict(simulator=lambda theta, g: theta[:, :1]),
        r"simulator returned shape \(2, 1\) for 2 prior draws, expected \(2, 2\)",
    ),
    "simulator-nan": (
        dict(simulator=_nan_simulator),
        r"simulator returned NaN/inf \[nan, nan\] at the prior draw theta=",
    ),
    "simulator-complex": (
        dict(simulator=lambda theta, g: theta.to(torch.complex64)),
        r"simulator fails on 2 prior draws .*: TypeError: complex numbers \(torch.complex64\); a summary is real",
    ),
    "simulator-fails": (
        dict(simulator=_failing_simulator),
        r"simulator fails on 2 prior draws .*: KeyError: \"column 'age'\"",
    ),
    "simulator-not-callable": (
        dict(simulator=3.0),
        r"simulator must be a function of theta \(and rng\), got float",
    ),
    "backend": (dict(backend="jax"), r"backend must be one of \('torch', 'numpy'\), got 'jax'"),
    "mechanism": (dict(mechanism="laplace"), r"mechanism must be a dpsbi mechanism"),
    "parameter-names": (
        dict(parameter_names=["mu"]),
        r"parameter_names must be 2 distinct strings, got \['mu'\]",
    ),
}


@pytest.mark.parametrize("change, match", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_each_bad_input_is_refused_at_construction_in_one_line(change, match):
    arguments = {
        **dict(
            prior=normal([0.0, 0.0], [1.0, 1.0]), simulator=torch_simulator, mechanism=MECHANISM, y_obs=Y_OBS
        ),
        **change,
    }
    with pytest.raises(ValueError, match=match) as refused:
        from_simulator(**arguments)
    assert str(refused.value).startswith("task 'custom': ") and "\n" not in str(refused.value)


def test_every_problem_is_listed_at_once_one_line_each():
    with pytest.raises(ValueError) as refused:
        from_simulator(
            box([0.0, 0.0], [1.0, 1.0]),
            _nan_simulator,
            MECHANISM,
            [0.1],
            true_theta=[2.0, 0.5],
            parameter_names=["a"],
            name="mine",
        )
    lines = str(refused.value).splitlines()
    assert lines[0] == "task 'mine' has 4 problems:"
    for line, expected in zip(
        lines[1:],
        [
            "y_obs has 1 values",
            "true_theta [2.0, 0.5] lies outside",
            "parameter_names must be 2",
            "simulator returned NaN/inf",
        ],
    ):
        assert line.startswith(f"  - {expected}")


def test_the_default_transform_maps_onto_a_bounded_prior():
    task = from_simulator(
        box([0.0, 1.0], [1.0, 3.0]),
        torch_simulator,
        MECHANISM,
        Y_OBS,
        true_theta=[0.5, 2.0],
        parameter_names=["p", "q"],
    )
    theta = task.transform(10 * torch.randn(100, 2))
    assert task.dim_unconstrained == 2 and bool(task.prior.support.check(theta).all())
    assert task.true_theta.shape == (1, 2) and task.parameter_names == ["p", "q"]


def test_the_task_epsilon_is_the_mechanism_target():
    """The binomial curve mechanism's exact epsilon is a little below the target it was built from."""
    mechanism = BinomialCurve(trials=100, population=1000, dim=3, epsilon=2.0)
    task = from_simulator(
        box([0.0], [1.0]), lambda theta, g: 1000 * theta.expand(-1, 3), mechanism, [0.01, 0.05, 0.02]
    )
    assert task.epsilon == 2.0 and mechanism.epsilon < 2.0


def test_a_hand_built_task_with_another_epsilon_than_its_mechanism_is_refused():
    prior = normal([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(
        ValueError, match=r"task 'mine': epsilon=2 disagrees with its mechanism Laplace.*\(epsilon=1\)"
    ):
        Task("mine", prior, torch_simulator, Laplace(1.0, 1.0, dim=2), epsilon=2.0)
    with pytest.raises(ValueError, match="epsilon=5 disagrees"):
        dataclasses.replace(dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0), epsilon=5.0)
    assert (
        Task(
            "observed",
            prior,
            torch_simulator,
            Laplace(1.0, 1.0, dim=2),
            epsilon=2.0,
            release_from_mechanism=False,
        ).epsilon
        == 2.0
    )
    gdp = Gaussian.gdp(0.5, 1.0, dim=2)  # a mu-GDP mechanism states mu; its epsilon is that at delta
    assert Task("gdp", prior, torch_simulator, gdp, epsilon=0.5).epsilon == 0.5


def test_a_hand_built_task_checks_its_prior_on_the_priors_own_draws():
    """Before any simulation: a log density that is NaN on part of the prior's draws, and a discrete prior."""
    nan_prior = _NaNAboveOne(Normal(torch.zeros(2), torch.ones(2)), 1)
    with pytest.raises(
        ValueError, match=r"task 'mine': the prior _NaNAboveOne's log_prob is nan at its own draw"
    ):
        Task("mine", nan_prior, torch_simulator, MECHANISM, epsilon=1.0)
    poisson = Independent(Poisson(torch.full((2,), 3.0)), 1)
    with pytest.raises(ValueError, match=r"task 'mine': the prior Independent is discrete") as refused:
        Task("mine", poisson, torch_simulator, MECHANISM, epsilon=1.0)
    assert "\n" not in str(refused.value)


def test_prior_shorthands_are_vector_distributions():
    prior = box(0.0, [1.0, 2.0])
    assert prior.event_shape == (2,) and prior.log_prob(torch.tensor([0.5, 1.0])).item() == pytest.approx(
        -math.log(2.0)
    )
    assert normal([1.0, 2.0, 3.0], 0.5).event_shape == (3,)
    assert isinstance(normal(0.0, 1.0), Independent) and normal(0.0, 1.0).event_shape == (1,)
    with pytest.raises(ValueError, match=r"box: need low < high in every coordinate"):
        box([0.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"box: lengths differ: low has 2, high has 3"):
        box([0.0, 0.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"normal: need sd > 0"):
        normal([0.0, 0.0], [1.0, 0.0])
    with pytest.raises(ValueError, match=r"normal: mean must be a finite number"):
        normal([0.0, math.nan], 1.0)


def test_the_randomness_argument_is_recognized_by_the_signature():
    assert not takes_randomness(lambda theta: theta)
    assert takes_randomness(lambda theta, rng: theta)
    assert takes_randomness(lambda theta, rng=None: theta)
    assert not takes_randomness(lambda theta, records=100: theta)  # a setting with a default, not randomness
