"""Seeded blocks of torch's (and numpy's) global random streams: their draws, what they restore, and threads."""

import threading

import numpy as np
import torch

from dpsbi.seeds import seeded_global_streams


def test_a_seeded_block_draws_its_seeds_stream_and_restores_the_global_ones():
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    with seeded_global_streams(7, numpy=True):
        inside = torch.randn(5), np.random.standard_normal(5)
    assert torch.equal(inside[0], torch.randn(5, generator=torch.Generator().manual_seed(7)))
    assert np.array_equal(inside[1], np.random.RandomState(7).standard_normal(5))
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), numpy_state))


def test_threads_never_interleave_their_seeded_draws():
    """A second thread's seeding waits for the first thread's block: without that it would reseed the stream
    between the first thread's two draws (the prior identity of two concurrent runs differed, and with it the
    key of the reference cache entry both wanted)."""
    started, draws = threading.Event(), {}

    def first():
        with seeded_global_streams(1):
            head = torch.randn(3)
            started.set()
            threading.Event().wait(0.3)  # time for the other thread to enter its block
            draws["first"] = torch.cat([head, torch.randn(3)])

    def second():
        started.wait()
        with seeded_global_streams(2):
            head = torch.randn(3)
            threading.Event().wait(0.6)  # still inside when the first thread draws again
            draws["second"] = torch.cat([head, torch.randn(3)])

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, seed in (("first", 1), ("second", 2)):
        assert torch.equal(draws[name], torch.randn(6, generator=torch.Generator().manual_seed(seed)))


def test_a_numpy_integer_or_a_zero_dimensional_tensor_seeds_as_its_int():
    for seed in (np.int64(5), torch.tensor(5)):
        with seeded_global_streams(seed):
            assert torch.equal(torch.randn(2), torch.randn(2, generator=torch.Generator().manual_seed(5)))


def test_a_seeded_block_may_hold_another_in_the_same_thread():
    with seeded_global_streams(3):
        with seeded_global_streams(4):
            inner = torch.randn(2)
        outer = torch.randn(2)
    assert torch.equal(inner, torch.randn(2, generator=torch.Generator().manual_seed(4)))
    assert torch.equal(outer, torch.randn(2, generator=torch.Generator().manual_seed(3)))
