"""Variance-stabilizing maps of releases: one-to-one maps of a release coordinate onto a scale where its noise has
about the same spread at every value of the statistic (:attr:`~dpsbi.mechanisms.Mechanism.stabilizing_map`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn


def arcsine(y: Tensor) -> Tensor:
    """``asin(sqrt(y))`` of a proportion ``y`` in ``[0, 1]`` (clamped there first): ``N y ~ Bin(N, p)`` has
    variance ``p (1 - p) / N``, its arcsine about ``1 / (4 N)``. Same shape as ``y``."""
    return torch.asin(y.clamp(0, 1).sqrt())


#: The named maps: ``name -> map`` elementwise on tensors; a name is what posterior files and checkpoints record.
STABILIZING_MAPS: dict[str, Callable[[Tensor], Tensor]] = {"arcsine": arcsine}


class Stabilizer(nn.Module):
    """Column ``j < len(names)`` of ``(..., width)`` through the map ``names[j]`` of :data:`STABILIZING_MAPS`
    (unchanged where it is ``None`` and past ``len(names)``), one ``torch.where`` per distinct map. The columns
    are non-persistent buffers: they move with the module and leave ``state_dict`` as it was."""

    def __init__(self, names: Sequence[str | None], width: int) -> None:
        super().__init__()
        unknown = sorted({n for n in names if n is not None} - set(STABILIZING_MAPS))
        if unknown:
            raise ValueError(
                f"unknown stabilizing map {unknown[0]!r}; named maps: {sorted(STABILIZING_MAPS)}"
            )
        if len(names) > width:
            raise ValueError(f"{len(names)} stabilizing maps for a context of {width} columns")
        self.names = tuple(names)
        self.maps = sorted({n for n in names if n is not None})
        for name in self.maps:
            columns = [n == name for n in self.names] + [False] * (width - len(self.names))
            self.register_buffer(f"columns_{name}", torch.tensor(columns), persistent=False)

    def forward(self, y: Tensor) -> Tensor:
        """``y (..., width)`` mapped column by column; same shape."""
        out = y
        for name in self.maps:
            out = torch.where(getattr(self, f"columns_{name}"), STABILIZING_MAPS[name](y), out)
        return out
