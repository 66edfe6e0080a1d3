"""Seeds as dpsbi takes them: integers from 0 to 2**63 - 1 (numpy's ``SeedSequence`` refuses negative ones,
torch wraps them), checked before any compute; and torch's global random streams seeded for a block, one thread
at a time."""

from __future__ import annotations

import contextlib
import numbers
import os
import threading
from collections.abc import Iterator

import numpy as np
import torch

#: The largest seed accepted (the seeds dpsbi derives are 63-bit).
MAX_SEED = 2**63 - 1


def check_seed(seed, what: str = "seed") -> int:
    """``seed`` as an ``int``, or a ``ValueError`` naming ``what`` when it is not an integer in ``[0, MAX_SEED]``
    (a bool, a float, a string or a negative number)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{what} must be an integer from 0 to 2**63 - 1, got {seed!r}; pass e.g. {what}=0")
    return int(seed)


#: Held by the thread inside :func:`seeded_global_streams` (reentrant: a seeded block may hold another).
_GLOBAL_STREAMS = threading.RLock()


def _new_lock_in_child() -> None:
    """A forked child starts with a free lock (the thread that held it in the parent does not exist there)."""
    global _GLOBAL_STREAMS
    _GLOBAL_STREAMS = threading.RLock()


if hasattr(os, "register_at_fork"):  # POSIX: where a process can fork
    os.register_at_fork(after_in_child=_new_lock_in_child)


@contextlib.contextmanager
def seeded_global_streams(seed: int, numpy: bool = False, start_cuda: bool = False) -> Iterator[None]:
    """Torch's global random streams seeded with the integer ``seed`` inside the block and restored after it: the
    CPU's, and every CUDA device's once CUDA is running (``start_cuda``: started here where there is a GPU, for
    code that may first use it inside the block; CUDA started inside without it is neither seeded nor restored);
    with ``numpy``, numpy's global ``np.random`` stream too. For code that draws only from them
    (``Distribution.sample``, sbi's diagnostics, a simulator without a generator argument).

    One thread at a time is inside such a block (another waits for it), so the threads of one process never
    interleave their seeded draws; code outside dpsbi that draws from the global streams meanwhile still shares
    them."""
    seed = int(seed)
    with _GLOBAL_STREAMS:
        cuda = list(range(torch.cuda.device_count())) if start_cuda or torch.cuda.is_initialized() else []
        numpy_state = np.random.get_state() if numpy else None
        with torch.random.fork_rng(devices=cuda):
            torch.random.default_generator.manual_seed(seed)
            if cuda:
                torch.cuda.manual_seed_all(seed)
            if numpy:
                np.random.seed(seed % 2**32)
            try:
                yield
            finally:
                if numpy_state is not None:
                    np.random.set_state(numpy_state)
