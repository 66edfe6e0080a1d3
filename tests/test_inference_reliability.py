"""Nothing silently wrong in the estimators: checkpoints refuse another model, settings and tasks are
checked before any simulation, a non-finite loss is an error, foreign simulators' dtypes are accepted, and
atomic batches always have their atoms."""

import dataclasses
import math
import os

import numpy as np
import pytest
import torch

import dpsbi
from dpsbi.inference.losses import sppe_loss
from dpsbi.inference.training import NonFiniteLossError, _deterministic, batches
from dpsbi.mechanisms import Gaussian, Laplace

TINY = dict(
    sims_per_round=60,
    inner_samples=2,
    flow=dict(transforms=1, hidden=8),
    training=dict(max_epochs=1),
    progress=False,
)


def _task(**kwargs):
    return dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0, **kwargs)


@pytest.fixture
def checkpoint(tmp_path):
    """A finished two-round SPPE checkpoint of the conjugate toy at epsilon 10."""
    dpsbi.SPPE(_task(), rounds=2, atoms=3, checkpoint_dir=tmp_path, **TINY).run()
    return tmp_path


def _resume(task, directory, **kwargs):
    return dpsbi.SPPE(task, atoms=3, checkpoint_dir=directory, **{**TINY, "rounds": 2, **kwargs}).run()


def test_a_checkpoint_resumes_with_the_same_task(checkpoint):
    assert _resume(_task(), checkpoint).sample((3,), seed=0).shape == (3, 2)


@pytest.mark.parametrize(
    "change, match",
    [
        (
            lambda t: dataclasses.replace(t, simulator=lambda th, g=None: t.simulator(th, g) + 0.5),
            "another simulator",
        ),
        (lambda t: dataclasses.replace(t, simulator=_task(noise_sd=2.0).simulator), "another simulator"),
        (
            lambda t: dataclasses.replace(
                t,
                prior=torch.distributions.Independent(
                    torch.distributions.Normal(torch.zeros(2), 2 * torch.ones(2)), 1
                ),
            ),
            "prior",
        ),
        (lambda t: dataclasses.replace(t, mechanism=Gaussian(5.0, 1e-5, 1.0, dim=2), epsilon=5.0), "epsilon"),
        (
            lambda t: dataclasses.replace(t, mechanism=Laplace(10.0, 1.0, dim=2)),
            "mechanism.type: 'Gaussian' vs 'Laplace'",
        ),
        (lambda t: dataclasses.replace(t, y_obs=t.y_obs + 1), "y_obs"),
    ],
    ids=["simulator-shift", "simulator-noise", "prior", "epsilon", "mechanism", "release"],
)
def test_a_checkpoint_of_another_model_is_refused(checkpoint, change, match):
    with pytest.raises(ValueError, match=match):
        _resume(change(_task()), checkpoint)


def test_fewer_rounds_than_a_checkpoint_holds_are_refused(checkpoint):
    with pytest.raises(ValueError, match="holds 2 finished rounds, more than rounds=1"):
        _resume(_task(), checkpoint, rounds=1)


def test_a_simulator_that_ignores_its_generator_resumes_with_a_warning(tmp_path):
    task = dataclasses.replace(_task(), simulator=lambda th, g=None: th + torch.randn(th.shape))
    dpsbi.SPPE(task, rounds=1, atoms=3, checkpoint_dir=tmp_path, **TINY).run()
    with pytest.warns(UserWarning, match="does not reproduce its output"):
        dpsbi.SPPE(task, rounds=2, atoms=3, checkpoint_dir=tmp_path, **TINY)._resume()


def test_two_estimators_never_share_a_checkpoint_directory(tmp_path):
    from dpsbi.files import BusyError, exclusive

    with exclusive(tmp_path / "checkpoint.lock", "held by a test"):
        with pytest.raises(BusyError, match="in use by another process"):
            dpsbi.SPPE(_task(), rounds=1, checkpoint_dir=tmp_path, **TINY).run()


@pytest.mark.parametrize(
    "y_obs, match",
    [([[0.1, 0.2, 0.3]], r"shape \(n, 2\)"), ([[float("nan"), 0.0]], "holds NaN")],
    ids=["wrong-length", "nan"],
)
def test_a_bad_release_is_refused_at_construction(y_obs, match):
    task = _task()
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(task, y_obs=torch.tensor(y_obs))
    task.y_obs = torch.tensor(y_obs)  # set after construction: refused by the estimator before simulating
    with pytest.raises(ValueError, match=match):
        dpsbi.SPPE(task, rounds=1, **TINY)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rounds=0), "rounds must be an integer >= 1"),
        (dict(sims_per_round=-5), "sims_per_round must be an integer >= 2"),
        (dict(inner_samples=3, qmc=True), "power of two"),
        (dict(flow=dict(hidden=0)), "hidden must be a positive integer"),
        (dict(atoms=101), "exceeds the batch size"),
        (dict(training=dict(batch_size=0)), "batch_size"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dpsbi.SPPE(_task(), **{**TINY, "rounds": 2, **kwargs})


def test_a_checkpoint_dir_that_is_no_path_is_named():
    with pytest.raises(
        TypeError, match=r"^checkpoint_dir must be a path \(a string or os.PathLike\), got 123$"
    ):
        dpsbi.SPPE(_task(), checkpoint_dir=123, **TINY)


def test_numpy_float64_simulators_train_sppe_and_sple():
    """A numpy simulator returning float64 arrays (and seeding itself from the torch generator)."""
    base = _task()

    def simulator(theta, generator=None):
        seed = int(torch.randint(0, 2**31 - 1, (), generator=generator))
        return theta.numpy().astype(np.float64) + np.random.default_rng(seed).normal(size=tuple(theta.shape))

    task = dataclasses.replace(base, simulator=simulator)
    assert task.simulate(base.prior.sample((4,))).dtype == torch.get_default_dtype()
    for method in (dpsbi.SPPE, dpsbi.SPLE):
        draws = method(task, rounds=1, **TINY).run().sample((10,), seed=0)
        assert draws.dtype == torch.get_default_dtype() and torch.isfinite(draws).all()


def test_a_non_finite_loss_is_an_error_naming_the_round():
    task = dataclasses.replace(
        _task(), simulator=lambda th, g=None: torch.where(th[:, :1] > 1.5, math.inf, 0.0) + th
    )
    task.simulate = lambda theta, generator=None: task.simulator(
        theta, generator
    )  # skip the finiteness check
    with pytest.raises(NonFiniteLossError, match="SPPE round 1, epoch 1: the training loss at step"):
        dpsbi.SPPE(task, rounds=1, **TINY).run()


def test_the_gaussian_quantile_is_finite_down_to_the_smallest_uniform():
    mechanism = Gaussian(1.0, 1e-5, 1.0)
    u = torch.tensor([[2.0**-30], [2.0**-60], [1e-38]], dtype=torch.float32)
    y = mechanism.sample(torch.zeros(3, 1), u)
    assert torch.isfinite(y).all() and (y < -5 * mechanism.sigma).all()


@pytest.mark.parametrize("size, batch", [(7, 3), (6, 3), (2, 5), (201, 100)])
def test_batches_cover_every_row_once_and_none_is_short(size, batch):
    cut = list(batches(torch.randperm(size, generator=torch.Generator().manual_seed(0)), batch))
    assert sorted(torch.cat(cut).tolist()) == list(range(size))
    assert all(len(b) >= min(batch, size) for b in cut)


def test_the_atomic_loss_keeps_its_atoms_in_the_last_batch():
    """Before the fix a trailing batch of one row had atomic loss exactly 0 (one atom, log softmax of one logit)."""
    task = _task()
    theta = task.prior.sample((101,))
    s = task.simulate(theta)
    flow = dpsbi.inference.ConditionalFlow(dpsbi.inference.FlowSettings(transforms=1, hidden=8), theta, s)
    log_prior = task.prior.log_prob(theta)
    losses = [
        float(
            sppe_loss(
                flow, theta[r], s[r], task.mechanism, 2, True, None, atoms=10, log_prior=log_prior[r]
            ).detach()
        )
        for r in batches(torch.arange(101), 50)
    ]
    assert len(losses) == 2 and min(losses) > 0.5


# ---- simulations made elsewhere -------------------------------------------------------------------------
def _external(theta, seed):
    """The conjugate toy's summaries, simulated 'elsewhere' (numpy, float64)."""
    return theta.double().numpy() + np.random.default_rng(seed).normal(size=tuple(theta.shape))


def test_appended_simulations_train_a_task_without_a_simulator(tmp_path):
    task = dataclasses.replace(_task(), simulator=None)
    estimator = dpsbi.SPPE(task, rounds=2, atoms=3, checkpoint_dir=tmp_path, **TINY)
    for r in range(2):
        theta = estimator.propose(60, seed=r)
        estimator.append_simulations(theta, _external(theta, r))
        estimator.rounds = r + 1
        posterior = estimator.run()
    assert estimator.num_simulations == 120 and len(estimator.history) == 2
    assert torch.isfinite(posterior.sample((10,), seed=0)).all()
    rerun = dpsbi.SPPE(task, rounds=2, atoms=3, checkpoint_dir=tmp_path, **TINY).append_simulations(
        theta, _external(theta, 1)
    )
    rerun.run()  # the same script run again: the checkpoint already holds these simulations
    assert rerun.num_simulations == 120 and len(rerun.history) == 2


def test_a_task_without_a_simulator_needs_appended_simulations():
    with pytest.raises(ValueError, match="has no simulator"):
        dpsbi.SPPE(dataclasses.replace(_task(), simulator=None), rounds=1, **TINY).run()


@pytest.mark.parametrize(
    "s, match", [(np.zeros((60, 3)), r"shape \(60, 3\)"), (np.full((60, 2), np.nan), "NaN")]
)
def test_bad_appended_summaries_are_refused(s, match):
    task = _task()
    with pytest.raises(RuntimeError, match=match):
        dpsbi.SPPE(task, rounds=1, **TINY).append_simulations(task.prior.sample((60,)), s)


def test_a_fit_on_cuda_uses_deterministic_kernels_and_restores_the_flag(monkeypatch):
    """Only the flag is set, so this runs without a GPU; the bit-identical resumes on CUDA are checked by
    test_no_simulation_lost and test_a_killed_run_resumes_from_its_last_round_without_resimulating there."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert not torch.are_deterministic_algorithms_enabled()
    with _deterministic(torch.device("cpu")):
        assert not torch.are_deterministic_algorithms_enabled()  # the CPU's kernels are deterministic
    with _deterministic(torch.device("cuda", 0)):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
