"""Per-row calibrations by table: a smooth function of ``log epsilon`` (or ``log rho``) computed once on a grid, per
kind and ``delta``, on the CPU by the slow, exact search (bisection, golden section), copied once to each device,
and linearly interpolated at every row's value (:func:`tabled`), or read at the two grid points around it
(:func:`table`, :func:`cell`). A training step over a range of epsilons then re-calibrates its mechanism in a few
kernels (no fixed-count search of ~1000, and no value read on the host)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

#: The tables: ``(kind, delta, device) -> values on the grid`` (float64).
_TABLES: dict[tuple[str, float, torch.device], Tensor] = {}


def table(
    kind: str,
    delta: float,
    grid: tuple[float, float, int],
    build: Callable[[Tensor], Tensor],
    device: torch.device,
) -> Tensor:
    """``build``'s values on ``grid = (low, high, points)`` on ``device``: ``build`` maps the grid's points
    ``(points,)``, float64, to ``(points, ...)``, and is called once per ``(kind, delta)``; a copy is made once per
    device."""
    low, high, points = grid
    cpu = (kind, delta, torch.device("cpu"))
    if cpu not in _TABLES:
        _TABLES[cpu] = build(torch.linspace(low, high, points, dtype=torch.float64))
    key = (kind, delta, torch.device(device))
    if key not in _TABLES:  # a copy on the device, made once
        _TABLES[key] = _TABLES[cpu].to(device)
    return _TABLES[key]


def cell(grid: tuple[float, float, int], x: Tensor) -> tuple[Tensor, Tensor]:
    """Where ``x`` (any shape, float64) lies on ``grid``: the index ``i`` of the grid point at or below it (long,
    ``0 .. points - 2``) and its weight ``w`` in ``[0, 1]`` towards point ``i + 1``, clamped to the grid's ends (a
    NaN: index 0, weight NaN)."""
    low, high, points = grid
    position = (x.clamp(low, high) - low) / (high - low) * (points - 1)
    index = position.nan_to_num(0.0).floor().clamp(0, points - 2)
    return index.long(), position - index


def tabled(
    kind: str, delta: float, grid: tuple[float, float, int], build: Callable[[Tensor], Tensor], x: Tensor
) -> Tensor:
    """``build``'s values on ``grid`` (:func:`table`; ``(points,)`` here) interpolated linearly at ``x`` (any shape,
    float64, on any device), clamped to the grid's ends."""
    values = table(kind, delta, grid, build, x.device)
    index, weight = cell(grid, x)
    return values[index] * (1 - weight) + values[index + 1] * weight
