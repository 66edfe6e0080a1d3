"""Reproducible randomness: independent seeds derived from one run seed, and generators built from them."""

from __future__ import annotations

import zlib

import numpy as np
import torch

from ..seeds import check_seed


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed for the stream named by ``keys`` (e.g. ``(round, "simulate")``), independent of the
    streams of other keys. The same ``(seed, keys)`` always gives the same value, so a resumed run redraws
    exactly what an uninterrupted one would have."""
    words = [k if isinstance(k, int) else zlib.crc32(k.encode()) for k in keys]
    state = np.random.SeedSequence(int(seed), spawn_key=tuple(words)).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def make_generator(
    seed: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Generator | None:
    """``generator`` if given, else a new generator on ``device`` seeded with ``seed`` (checked:
    :func:`~dpsbi.seeds.check_seed`), else ``None`` (torch's global random stream)."""
    if generator is not None:
        if seed is not None:
            raise ValueError("pass either generator or seed, not both")
        return generator
    if seed is None:
        return None
    return torch.Generator(device=device if device is not None else torch.get_default_device()).manual_seed(
        check_seed(seed)
    )


def draw_seed(generator: torch.Generator | None) -> int:
    """A fresh 63-bit integer seed drawn from ``generator`` (or from torch's global stream)."""
    device = generator.device if generator is not None else torch.get_default_device()
    return int(torch.randint(0, 2**63 - 1, (), generator=generator, device=device))
