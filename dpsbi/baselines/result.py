"""What every classical baseline returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class BaselineResult:
    """Draws of a baseline: ``samples (n, dim_theta)``, optional normalized ``weights (n,)`` (importance
    sampling), the number of simulator calls used, and method-specific diagnostics in ``info``."""

    samples: Tensor
    num_simulations: int
    weights: Tensor | None = None
    info: dict = field(default_factory=dict)

    @property
    def ess(self) -> float:
        """Effective sample size (Kish) of the weights; the number of draws when unweighted."""
        if self.weights is None:
            return float(self.samples.shape[0])
        return float(1.0 / (self.weights**2).sum())

    def resample(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        """Unweighted draws ``(num_samples, dim_theta)``: multinomial resampling when weighted."""
        if self.weights is None:
            if num_samples > self.samples.shape[0]:
                raise ValueError(
                    f"asked for {num_samples} draws but the result holds {self.samples.shape[0]}"
                )
            return self.samples[:num_samples]
        idx = torch.multinomial(self.weights, num_samples, replacement=True, generator=generator)
        return self.samples[idx]
