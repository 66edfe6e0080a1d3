"""Conditional neural spline flows (sbi's NSF builder on nflows) with z-scoring of inputs and context."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

import torch
from sbi.neural_nets.net_builders.flow import build_nsf
from torch import Tensor, nn

from .settings import Settings

# nflows' LU transform (inside sbi's spline flows) calls torch.triangular_solve, deprecated by torch; not our
# call, so it is silenced here, narrowly: that message, from that module only.
warnings.filterwarnings("ignore", r"torch\.triangular_solve is deprecated", module=r"nflows\.transforms\.lu")


@dataclass(frozen=True)
class FlowConfig(Settings):
    """Architecture of a conditional neural spline flow; the defaults are the paper's: 8 coupling
    transforms, each conditioned by a residual net of 2 blocks of 50 ReLU units, 10 bins, tail bound 5."""

    label: ClassVar[str] = "flow"
    transforms: int = 8
    hidden: int = 50
    blocks: int = 2
    bins: int = 10
    tail_bound: float = 5.0

    def __post_init__(self) -> None:
        for name in ("transforms", "hidden", "blocks", "bins"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"flow {name} must be a positive integer, got {getattr(self, name)}")
        if not self.tail_bound > 0:
            raise ValueError(f"flow tail_bound must be > 0, got {self.tail_bound}")


class ConditionalFlow(nn.Module):
    """A density ``q(x | c)`` over ``x`` of shape ``(dim,)`` given a context ``c`` of shape ``(context_dim,)``.

    Built by sbi's ``build_nsf`` from example batches ``inputs (n, dim)`` and ``context (n, context_dim)``,
    whose per-dimension means and standard deviations z-score ``x`` (a first affine layer, so densities
    stay those of ``x``) and ``c`` (a standardizing embedding). Both statistics are buffers: they are
    part of the ``state_dict`` and come back with it.
    """

    def __init__(self, config: FlowConfig, inputs: Tensor, context: Tensor) -> None:
        super().__init__()
        if inputs.ndim != 2 or context.ndim != 2 or len(inputs) != len(context) or len(inputs) < 2:
            raise ValueError(
                f"flow needs example batches (n, dim) and (n, context_dim) with n >= 2, "
                f"got {tuple(inputs.shape)} and {tuple(context.shape)}"
            )
        self.config = config
        self.dim, self.context_dim = int(inputs.shape[1]), int(context.shape[1])
        self.net = build_nsf(
            inputs,
            context,
            z_score_x="independent",
            z_score_y="independent",
            hidden_features=config.hidden,
            num_transforms=config.transforms,
            num_bins=config.bins,
            tail_bound=float(config.tail_bound),
            num_blocks=config.blocks,
        ).net

    @classmethod
    def blank(cls, config: FlowConfig, dim: int, context_dim: int) -> ConditionalFlow:
        """A flow of the right shape whose weights and z-scoring are to come from ``load_state_dict``."""
        inputs, context = torch.eye(2, dim), torch.eye(2, context_dim)
        return cls(config, inputs, context)

    def log_prob(self, x: Tensor, context: Tensor) -> Tensor:
        """``log q(x | c)`` for ``x (..., dim)`` and ``context (..., context_dim)`` whose batch shapes
        broadcast; returns the broadcast batch shape."""
        x, context, batch = self._broadcast(x, context)
        return self.net.log_prob(x, context=context).reshape(batch)

    def sample(self, noise: Tensor, context: Tensor) -> Tensor:
        """The deterministic map from base noise ``(..., dim)`` (standard normal draws) to samples of
        ``q(. | c)``, for ``context (..., context_dim)`` broadcasting with it."""
        noise, context, batch = self._broadcast(noise, context)
        x, _ = self.net._transform.inverse(noise, context=self.net._embedding_net(context))
        return x.reshape(batch + (self.dim,))

    def _broadcast(self, x: Tensor, context: Tensor) -> tuple[Tensor, Tensor, torch.Size]:
        if x.shape[-1] != self.dim or context.shape[-1] != self.context_dim:
            raise ValueError(
                f"flow expects inputs (..., {self.dim}) and context (..., {self.context_dim}), "
                f"got {tuple(x.shape)} and {tuple(context.shape)}"
            )
        batch = torch.broadcast_shapes(x.shape[:-1], context.shape[:-1])
        x = x.expand(batch + (self.dim,)).reshape(-1, self.dim)
        context = context.to(x.dtype).expand(batch + (self.context_dim,)).reshape(-1, self.context_dim)
        return x, context, batch
