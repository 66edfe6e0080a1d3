"""No simulation lost or doubled: appended batches add up, a round interrupted (Ctrl-C, an exception) leaves
the estimator as it found it, and Ctrl-C during training is a ``KeyboardInterrupt`` with the finished rounds
kept and resumable from ``checkpoint_dir``."""

import dataclasses
import itertools
import signal

import numpy as np
import pytest
import torch

import dpsbi

#: ``cuda_graph=False``: the interruption is raised from the loss, which a step replayed as a CUDA graph calls
#: only when it is captured (on CUDA; a CPU fit is eager anyway).
TINY = dict(
    sims_per_round=100,
    inner_samples=2,
    flow=dict(transforms=1, hidden=8),
    training=dict(max_steps=20, batch_size=50, cuda_graph=False),
    progress=False,
)


def _task():
    return dpsbi.tasks.load("conjugate_gaussian", epsilon=10.0)


class Interrupted(dpsbi.SPPE):
    """SPPE whose training step ``step`` of the round at ``round_index`` (0-based), ``at = (round_index, step)``,
    raises ``KeyboardInterrupt`` once, as Ctrl-C would."""

    at: tuple[int, int] | None = None

    def loss(self, round_index):
        inner, steps = super().loss(round_index), itertools.count()

        def compute(flow, batch, draws):
            if flow.training and self.at == (round_index, next(steps)):
                self.at = None
                raise KeyboardInterrupt
            return inner.compute(flow, batch, draws)

        return dataclasses.replace(inner, compute=compute)


def _external(theta, seed):
    return theta.double().numpy() + np.random.default_rng(seed).normal(size=tuple(theta.shape))


def test_appended_batches_add_up():
    task = _task()
    estimator = dpsbi.SPPE(task, rounds=1, **TINY)
    for seed in (0, 1):
        theta = estimator.propose(100, seed=seed)
        estimator.append_simulations(theta, _external(theta, seed))
    estimator.run()
    assert estimator.num_simulations == 200
    assert estimator.data["theta"].unique(dim=0).shape[0] == 200


def test_the_same_batch_appended_twice_is_added_once_with_a_warning():
    task = _task()
    estimator = dpsbi.SPPE(task, rounds=1, **TINY)
    theta = estimator.propose(100, seed=0)
    estimator.append_simulations(theta, _external(theta, 0))
    with pytest.warns(UserWarning, match="already appended"):
        estimator.append_simulations(theta, _external(theta, 0))
    estimator.run()
    assert estimator.num_simulations == 100


def test_overlapping_batches_add_each_simulation_once_with_a_warning():
    """Rows 50-99 of the second batch were added a second time: only a batch held whole was recognized."""
    estimator = dpsbi.SPPE(_task(), rounds=1, **TINY)
    theta = estimator.propose(150, seed=0)
    s = torch.as_tensor(_external(theta, 0))
    estimator.append_simulations(theta[:100], s[:100])
    with pytest.warns(UserWarning, match="^50 of these 100 simulations are already appended"):
        estimator.append_simulations(theta[50:], s[50:])
    assert torch.equal(estimator.pending[0], theta) and torch.equal(
        estimator.pending[1], s.to(estimator.pending[1])
    )


@pytest.mark.parametrize("at", [(0, 3), (1, 3)])
def test_a_round_interrupted_and_run_again_keeps_each_simulation_once(at):
    task = _task()
    uninterrupted = dpsbi.SPPE(task, rounds=2, **TINY)
    expected = uninterrupted.run().sample((50,), seed=0)
    estimator = Interrupted(task, rounds=2, **TINY)
    estimator.at = at
    with pytest.raises(KeyboardInterrupt):
        estimator.run()
    assert len(estimator.history) == at[0] and estimator.num_simulations == 100 * at[0]
    posterior = estimator.run()
    assert estimator.num_simulations == 200
    for key, value in uninterrupted.data.items():
        assert torch.equal(estimator.data[key], value), key
    torch.testing.assert_close(posterior.sample((50,), seed=0), expected)


def test_appended_simulations_survive_an_interrupted_round():
    task = _task()
    estimator = Interrupted(task, rounds=1, **TINY)
    theta = estimator.propose(100, seed=0)
    estimator.append_simulations(theta, _external(theta, 0)).at = (0, 2)
    with pytest.raises(KeyboardInterrupt):
        estimator.run()
    with pytest.warns(UserWarning, match="already appended"):  # the notebook cell run again
        estimator.append_simulations(theta, _external(theta, 0))
    estimator.run()
    assert estimator.num_simulations == 100 and torch.equal(estimator.data["theta"], theta)


def test_ctrl_c_in_training_is_a_keyboard_interrupt_with_finished_rounds_kept(tmp_path):
    task = _task()
    handler = signal.getsignal(signal.SIGINT)
    estimator = Interrupted(task, rounds=3, checkpoint_dir=tmp_path, **TINY)
    estimator.at = (1, 3)  # in round 2
    with pytest.raises(KeyboardInterrupt):  # not a SystemExit, as Lightning made it
        estimator.run()
    assert signal.getsignal(signal.SIGINT) is handler  # SIGINT is not left ignored
    assert len(estimator.history) == 1
    resumed = dpsbi.SPPE(task, rounds=3, checkpoint_dir=tmp_path, **TINY)
    draws = resumed.run().sample((50,), seed=0)
    assert [row["round"] for row in resumed.history] == [1, 2, 3] and resumed.num_simulations == 300
    straight = dpsbi.SPPE(task, rounds=3, **TINY)
    torch.testing.assert_close(draws, straight.run().sample((50,), seed=0))
