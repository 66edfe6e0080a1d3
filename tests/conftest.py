"""Shared test settings."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Most tensors in the tests are small: one intra-op thread is faster than two (and much faster on a
    shared machine), and leaves the second core to numba's simulator threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def float64():
    """Double precision for a module's statistical checks (use with ``pytestmark = pytest.mark.usefixtures``)."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)


def _step_traces_whole(estimator, round_index: int = 0) -> None:
    """The estimator's training loss of round ``round_index`` on 20 stored rows traces whole
    (``torch.compile(fullgraph=True)``, tracing only), equals the eager loss and has a gradient."""
    loss = estimator.loss(round_index)
    batch = tuple(t[:20] for t in estimator._dataset(False))
    draws = loss.draw(20, torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    traced = torch.compile(loss.compute, backend="eager", fullgraph=True)(estimator.flow, batch, draws)
    eager = loss.compute(estimator.flow, batch, draws)
    assert torch.isfinite(eager) and torch.allclose(traced, eager, rtol=1e-5, atol=1e-5)
    traced.backward()


@pytest.fixture
def step_traces_whole():
    """:func:`_step_traces_whole`: a training step makes no data-dependent host decision."""
    return _step_traces_whole


@pytest.fixture
def cuda_synchronizations():
    """``scripts/bench_step.py``'s ``synchronizations``: the messages of what ``run()`` reads back to the host on
    CUDA (imported on use: the benchmark module imports dpsbi)."""
    from bench_step import synchronizations

    return synchronizations


@pytest.fixture
def operator_count():
    """``scripts/bench_step.py``'s ``OperatorCount``: a context manager counting the torch operators run inside it
    (``with operator_count() as count``, ``count.calls``), a step's kernels on a GPU counted on the CPU or torch's
    meta device (imported on use, as ``cuda_synchronizations``)."""
    from bench_step import OperatorCount

    return OperatorCount
