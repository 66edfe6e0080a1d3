"""MCMC on an unnormalized log density with sbi's vectorized slice sampler, seeded and device-agnostic."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
import torch
from sbi.samplers.mcmc.slice_numpy import SliceSamplerVectorized
from torch import Tensor

from .settings import Settings

METHODS = ("slice_np_vectorized",)


@dataclass(frozen=True)
class MCMCConfig(Settings):
    """Slice sampling settings: ``num_chains`` chains started by resampling ``init_candidates`` prior draws
    in proportion to the target density (sbi's "resample" strategy); after sbi's bracket tuning, ``warmup``
    steps per chain are discarded and every ``thin``-th step is kept."""

    label: ClassVar[str] = "mcmc"
    method: str = "slice_np_vectorized"
    num_chains: int = 100
    thin: int = 2
    warmup: int = 50
    init_candidates: int = 1000

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown MCMC method {self.method!r}; available: {list(METHODS)}")
        for name in ("num_chains", "thin", "init_candidates"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"mcmc {name} must be a positive integer, got {getattr(self, name)}")
        if int(self.warmup) < 0:
            raise ValueError(f"mcmc warmup must be >= 0, got {self.warmup}")


def resample_init(candidates: Tensor, log_density: Tensor, num_chains: int, generator: torch.Generator | None) -> Tensor:
    """``num_chains`` rows of ``candidates (K, d)`` drawn with probabilities ``softmax(log_density)``."""
    finite = torch.where(torch.isfinite(log_density), log_density, -math.inf)
    if not torch.isfinite(finite).any():
        raise RuntimeError("the target density is zero or not finite at every initial candidate")
    probs = torch.softmax(finite.double(), 0).to(candidates.device)
    return candidates[torch.multinomial(probs, num_chains, replacement=True, generator=generator)]


def slice_sample(
    log_density: Callable[[Tensor], Tensor],
    init: Tensor,
    num_samples: int,
    config: MCMCConfig,
    seed: int,
    width: Tensor | float = 1.0,
    progress: bool = False,
) -> Tensor:
    """``(num_samples, d)`` draws from the unnormalized ``log_density`` (``(C, d) -> (C,)`` torch function)
    by vectorized slice sampling of the ``C`` chains started at ``init (C, d)``; draws of the chains are
    interleaved. ``width`` (scalar or ``(d,)``) is the initial bracket width, best on the wide side (a
    too wide bracket shrinks geometrically, a too narrow one grows linearly). ``seed`` fixes the
    sampler's numpy stream (the global numpy state is untouched)."""
    dtype, device = init.dtype, init.device

    def numpy_log_density(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            values = log_density(torch.as_tensor(x, dtype=dtype).to(device))
        return values.double().cpu().numpy()

    chains, dim = init.shape
    per_chain = math.ceil(num_samples / chains)
    sampler = SliceSamplerVectorized(
        log_prob_fn=numpy_log_density,
        init_params=init.double().cpu().numpy(),
        num_chains=chains,
        thin=1,
        verbose=progress,
        init_width=torch.as_tensor(width, dtype=torch.float64).expand(dim).cpu().numpy(),
    )
    sampler.rng = np.random.RandomState(seed % 2**32)
    draws = sampler.run(config.warmup + per_chain * config.thin)  # (C, steps, d)
    kept = torch.as_tensor(draws[:, config.warmup :: config.thin][:, :per_chain], dtype=dtype)
    return kept.transpose(0, 1).reshape(-1, dim)[:num_samples].to(device)
