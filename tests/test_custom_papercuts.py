"""A new user's papercuts with their own model: a numpy simulator without ``backend="numpy"``, a scalar
release of a one-dimensional mechanism, NaN in a release, a hand-built ``Task`` without parameter names run
by ``dpsbi-run`` (and a failing figure, which must not discard the run), and simulations in worker
processes (``workers=N``) that do not depend on N."""

import math
import os
import threading
import warnings

import numpy as np
import pytest
import torch

from dpsbi.mechanisms import Laplace
from dpsbi.seeds import seeded_global_streams
from dpsbi.tasks import Task, from_simulator, normal

MECHANISM = Laplace(1.0, sensitivity=0.4, dim=2)
Y_OBS = [0.3, -0.2]


def numpy_simulator(theta, rng):
    """Vectorized numpy: ``(n, 2) -> (n, 2)``, drawing from a ``numpy.random.Generator``."""
    return rng.normal(theta, 1.0, size=(20, *theta.shape)).mean(0)


def numpy_row_simulator(theta, rng):
    """One row ``(2,) -> (2,)`` in numpy."""
    return rng.normal(theta, 1.0, size=(20, 2)).mean(0)


def torch_simulator(theta, generator):
    """Vectorized torch: ``(n, 2) -> (n, 2)``."""
    return theta + torch.randn(theta.shape, generator=generator, dtype=theta.dtype) / 5


def global_stream_simulator(theta):
    """Vectorized numpy on numpy's global stream (no rng argument)."""
    return theta + np.random.normal(size=theta.shape) / 5


def process_id(theta, rng):
    """The id of the process that simulates each row: ``(n, 1)``."""
    return np.full((len(theta), 1), float(os.getpid()))


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- papercuts of from_simulator and Task -----------------------------------------------------------------


def test_a_numpy_simulator_without_backend_numpy_is_recognized():
    prior = normal([0.0, 0.0], [1.0, 1.0])
    guessed = from_simulator(prior, numpy_simulator, MECHANISM, Y_OBS)
    stated = from_simulator(prior, numpy_simulator, MECHANISM, Y_OBS, backend="numpy")
    assert guessed.simulator.backend == "numpy"
    theta = prior.sample((4,))
    assert torch.equal(guessed.simulate(theta, _generator(1)), stated.simulate(theta, _generator(1)))
    assert from_simulator(prior, torch_simulator, MECHANISM, Y_OBS).simulator.backend == "torch"


def test_a_simulator_failing_as_torch_and_as_numpy_names_both_errors_and_backend_numpy():
    def broken(theta, rng):
        return rng.normal(theta, 1.0)[:, 5]  # numpy's generator, then an index error

    with pytest.raises(ValueError) as refused:
        from_simulator(normal([0.0, 0.0], [1.0, 1.0]), broken, MECHANISM, Y_OBS)
    message = str(refused.value)
    assert "AttributeError" in message and 'backend="numpy"' in message and "IndexError" in message, message
    assert "\n" not in message


@pytest.mark.parametrize("release", [0.3, torch.tensor(0.3), np.float64(0.3), [0.3], [[0.3]]], ids=str)
def test_a_scalar_release_of_a_one_dimensional_mechanism_is_accepted(release):
    mechanism = Laplace(1.0, sensitivity=0.1, dim=1)
    prior = normal([0.0], [1.0])
    task = from_simulator(prior, lambda theta, g: theta, mechanism, release)
    assert task.y_obs.shape == (1, 1) and float(task.y_obs) == pytest.approx(0.3)
    hand_built = Task("t", prior, None, mechanism, 1.0, y_obs=release)
    assert hand_built.check_release(release).shape == (1, 1) and hand_built.y_obs.shape == (1, 1)


def test_a_scalar_release_of_a_two_dimensional_mechanism_names_the_expected_shape():
    with pytest.raises(ValueError, match=r"y_obs must be one release, of shape \(2,\) or \(1, 2\)"):
        from_simulator(normal([0.0, 0.0], [1.0, 1.0]), torch_simulator, MECHANISM, 0.3)
    with pytest.raises(ValueError, match=r"release must have shape \(2,\) or \(n, 2\), got a scalar"):
        Task("t", normal([0.0, 0.0], [1.0, 1.0]), None, MECHANISM, 1.0, y_obs=0.3)


def test_nan_in_a_release_is_called_nan_not_outside_the_support():
    task = Task("t", normal([0.0, 0.0], [1.0, 1.0]), None, MECHANISM, 1.0)
    with pytest.raises(
        ValueError, match=r"task 't': release holds NaN at position \[1, 1\] \(row 1, coordinate 1\)"
    ):
        task.check_release([[0.1, 0.2], [0.3, math.nan]])
    with pytest.raises(ValueError, match=r"release holds inf at position \[0\]"):
        task.check_release([math.inf, 0.2])
    with pytest.raises(ValueError, match=r"task 't': release holds NaN at position \[1\]"):
        Task("t", normal([0.0, 0.0], [1.0, 1.0]), None, MECHANISM, 1.0, y_obs=[0.1, math.nan])


def test_a_hand_built_task_gets_parameter_names_and_wrong_names_are_refused():
    prior = normal([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    mechanism = Laplace(1.0, 1.0, dim=3)
    assert Task("t", prior, None, mechanism, 1.0).parameter_names == ["theta_1", "theta_2", "theta_3"]
    with pytest.raises(
        ValueError, match=r"task 't': parameter_names must be 3 distinct strings, got \['a'\]"
    ):
        Task("t", prior, None, mechanism, 1.0, parameter_names=["a"])
    with pytest.raises(ValueError, match=r"parameter_names must be 3 distinct strings"):
        Task("t", prior, None, mechanism, 1.0, parameter_names=["a", "a", "b"])


# --- dpsbi-run of a user's factory: names, and a figure that fails ---------------------------------------

FACTORY = '''
import torch
import dpsbi


def make_task():
    """A hand-built Task without parameter names."""
    def simulate(theta, generator):
        return theta + torch.randn(theta.shape, generator=generator) / 10
    return dpsbi.tasks.Task(
        name="mine",
        prior=dpsbi.tasks.normal([0.0, 0.0], [1.0, 1.0]),
        simulator=simulate,
        mechanism=dpsbi.mechanisms.Laplace(1.0, 0.2, dim=2),
        epsilon=1.0,
        y_obs=torch.tensor([[0.3, -0.2]]),
    )
'''

RUN = [
    "task=custom",
    "task.factory=nameless:make_task",
    "method=rejection_abc",
    "method.num_samples=100",
    "reference.method=none",
    "companions=[]",
    "progress=false",
    "trainer=cpu",
    "evaluation.num_samples=100",
    "evaluation.metrics=[lmd]",
    "evaluation.lmd_draws=20",
]


@pytest.fixture
def nameless(tmp_path, monkeypatch):
    """A user's factory module ``nameless`` in the working directory, and Hydra's configs. (The experiment
    layer is imported here, not by the module, so that worker processes, which import this module for its
    simulators, start fast.)"""
    from hydra import initialize_config_dir

    from dpsbi.experiment import config_dir

    (tmp_path / "nameless.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        yield tmp_path


def _run(run, *overrides: str) -> list[dict]:
    """``dpsbi-run`` with the settings :data:`RUN` and ``overrides`` into ``run``."""
    from hydra import compose

    from dpsbi.experiment import run_experiment

    return run_experiment(compose("config", overrides=[*RUN, *overrides]), run)


def test_dpsbi_run_of_a_task_without_parameter_names_draws_its_pair_plot(nameless):
    run = nameless / "run"
    _run(run, "plots=true")
    assert (run / "pairplot.png").is_file() and (run / "summary.json").is_file()
    assert (run / "rejection_abc" / "samples.csv").read_text().startswith("theta_1,theta_2")


def test_a_failing_figure_warns_in_one_line_and_keeps_the_run(nameless, monkeypatch):
    from dpsbi.experiment import runner

    def broken(*args, **kwargs):
        raise ValueError("Number of rows must be a positive integer, not 0")

    monkeypatch.setattr(runner, "pair_plot", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (row,) = _run(nameless / "run", "plots=true")
    (warning,) = [str(w.message) for w in caught if "pairplot.png" in str(w.message)]
    assert "not drawn" in warning and "Number of rows" in warning and "\n" not in warning
    assert row["method"] == "rejection_abc" and (nameless / "run" / "summary.json").is_file()
    assert (nameless / "run" / "metrics.png").is_file()  # the other figure is still drawn


# --- workers: the same draws in one process or several ---------------------------------------------------

WORKER_CASES = {
    "numpy-vectorized": (numpy_simulator, dict(backend="numpy")),
    "numpy-per-row": (numpy_row_simulator, dict(backend="numpy", vectorized=False)),
    "torch-vectorized": (torch_simulator, {}),
    "numpy-global-stream": (global_stream_simulator, dict(backend="numpy")),
}


@pytest.mark.parametrize("kind", list(WORKER_CASES))
def test_workers_give_the_same_draws_for_one_and_two_processes(kind):
    simulator, options = WORKER_CASES[kind]
    prior = normal([0.0, 0.0], [1.0, 1.0])
    theta = torch.zeros(23, 2)  # identical rows: only the per-chunk seeds tell them apart
    draws = {
        workers: from_simulator(
            prior, simulator, MECHANISM, Y_OBS, workers=workers, chunk_size=5, **options
        ).simulate(theta, _generator(3))
        for workers in (1, 2)
    }
    assert draws[1].shape == (23, 2) and torch.equal(draws[1], draws[2])
    assert len({tuple(row) for row in draws[1].tolist()}) == 23  # every chunk has its own seed
    again = from_simulator(prior, simulator, MECHANISM, Y_OBS, workers=2, chunk_size=5, **options)
    assert torch.equal(again.simulate(theta, _generator(3)), draws[1])
    assert not torch.equal(again.simulate(theta, _generator(4)), draws[1])


def test_two_workers_simulate_in_other_processes():
    task = from_simulator(
        normal([0.0], [1.0]),
        process_id,
        Laplace(1.0, 1.0, dim=1),
        0.0,
        backend="numpy",
        workers=2,
        chunk_size=4,
    )
    pids = set(task.simulate(torch.zeros(16, 1), _generator()).flatten().tolist())
    assert float(os.getpid()) not in pids and len(pids) >= 1


def test_workers_follow_joblibs_active_backend():
    """The hook a Dask or Ray cluster uses (``joblib.parallel_config(backend="dask")``), here with threads:
    the chunks run where the backend puts them, with the same draws."""
    import joblib

    task = from_simulator(
        normal([0.0], [1.0]),
        process_id,
        Laplace(1.0, 1.0, dim=1),
        0.0,
        backend="numpy",
        workers=2,
        chunk_size=4,
    )
    with joblib.parallel_config(backend="threading"):
        pids = set(task.simulate(torch.zeros(16, 1), _generator()).flatten().tolist())
    assert pids == {float(os.getpid())}
    simulator, options = WORKER_CASES["numpy-vectorized"]
    prior, theta = normal([0.0, 0.0], [1.0, 1.0]), torch.zeros(23, 2)
    one, two = (
        from_simulator(prior, simulator, MECHANISM, Y_OBS, workers=n, chunk_size=5, **options) for n in (1, 2)
    )
    with joblib.parallel_config(backend="threading"):
        assert torch.equal(two.simulate(theta, _generator(3)), one.simulate(theta, _generator(3)))


def test_a_global_stream_simulator_under_a_backend_of_threads_runs_its_chunks_here():
    """Its chunks seed the process's global streams, which threads share and a seeded block holds: under joblib's
    threading backend they run one after another in the calling thread, with the same draws, also inside a seeded
    block (where a pool of threads would wait for the block forever)."""
    import joblib

    simulator, options = WORKER_CASES["numpy-global-stream"]
    prior, theta = normal([0.0, 0.0], [1.0, 1.0]), torch.zeros(23, 2)
    one, two = (
        from_simulator(prior, simulator, MECHANISM, Y_OBS, workers=n, chunk_size=5, **options) for n in (1, 2)
    )
    expected, found = one.simulate(theta, _generator(3)), {}

    def in_a_seeded_block():
        with joblib.parallel_config(backend="threading"), seeded_global_streams(0):
            found["draws"] = two.simulate(theta, _generator(3))

    thread = threading.Thread(target=in_a_seeded_block, daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the pool's threads waited for the seeded block"
    assert torch.equal(found["draws"], expected)


def test_bad_workers_and_an_unpicklable_simulator_are_refused_at_construction():
    prior = normal([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"workers must be a positive integer or -1 \(every core\), got 0"):
        from_simulator(prior, torch_simulator, MECHANISM, Y_OBS, workers=0)
    with pytest.raises(ValueError, match=r"chunk_size must be a positive integer, got 0"):
        from_simulator(prior, torch_simulator, MECHANISM, Y_OBS, workers=2, chunk_size=0)
    lock = __import__("threading").Lock()

    def holding_a_lock(theta, generator):
        assert lock is not None
        return theta

    with pytest.raises(ValueError, match=r"workers=2: the simulator cannot be sent to worker processes"):
        from_simulator(prior, holding_a_lock, MECHANISM, Y_OBS, workers=2)
