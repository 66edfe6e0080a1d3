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
