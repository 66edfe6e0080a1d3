"""Per-row calibrations by table: a smooth function of ``log epsilon`` (or ``log rho``) computed once on a grid, per
kind and ``delta``, on the CPU by the slow, exact search (bisection, golden section), copied once to each device,
and linearly interpolated at every row's value. A training step over a range of epsilons then re-calibrates its
mechanism in a few kernels (no fixed-count search of ~1000, and no value read on the host)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

#: The tables: ``(kind, delta, device) -> values on the grid`` (float64).
_TABLES: dict[tuple[str, float, torch.device], Tensor] = {}


def tabled(
    kind: str, delta: float, grid: tuple[float, float, int], build: Callable[[Tensor], Tensor], x: Tensor
) -> Tensor:
    """``build``'s values on ``grid = (low, high, points)`` (``build`` maps the grid's points ``(points,)``, float64,
    to ``(points,)``; called once per ``(kind, delta)``), interpolated linearly at ``x`` (any shape, float64, on any
    device), clamped to the grid's ends."""
    low, high, points = grid
    cpu = (kind, delta, torch.device("cpu"))
    if cpu not in _TABLES:
        _TABLES[cpu] = build(torch.linspace(low, high, points, dtype=torch.float64))
    key = (kind, delta, x.device)
    if key not in _TABLES:  # a copy on the device, made once
        _TABLES[key] = _TABLES[cpu].to(x.device)
    position = (x.clamp(low, high) - low) / (high - low) * (points - 1)
    index = position.floor().clamp(0, points - 2)
    weight = position - index
    index = index.long()
    table = _TABLES[key]
    return table[index] * (1 - weight) + table[index + 1] * weight
