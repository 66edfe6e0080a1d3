"""What every classical baseline returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..mechanisms.base import check_integer


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
        """Unweighted draws ``(num_samples, dim_theta)``: multinomial resampling when weighted; else a random
        subset without repeats, drawn from all chains alike (an MCMC result's draws are chain after chain: the
        first ones would be one chain's)."""
        num_samples = check_integer("num_samples", num_samples)
        if self.weights is None:
            if num_samples > self.samples.shape[0]:
                raise ValueError(
                    f"asked for {num_samples} draws but the result holds {self.samples.shape[0]}"
                )
            index = torch.randperm(
                self.samples.shape[0], generator=generator, device=generator.device if generator else None
            )
            return self.samples[index[:num_samples].to(self.samples.device)]
        idx = torch.multinomial(self.weights, num_samples, replacement=True, generator=generator)
        return self.samples[idx]

    def to_arviz(
        self,
        task=None,
        method: str | None = None,
        y: Tensor | None = None,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        predictive: bool = False,
    ):
        """The draws in ArviZ's format (:func:`dpsbi.diagnostics.baseline_inference_data`: an
        ``arviz.InferenceData`` under ArviZ 0.x, an xarray ``DataTree`` under 1.x), with a posterior variable
        ``(chain, draw)`` per parameter, named after ``task.parameter_names`` when ``task`` is given (else
        ``theta[i]``):

        - MCMC (``info["chains"]``: PMMH, MHAAR, MH-CLT, DA-MCMC): the chains as chains, all their kept draws;
        - importance weights (ABC-IS, SMC-ABC): ``num_samples`` (default: as many as there are weighted draws)
          multinomially resampled draws in one chain, since every ArviZ function takes draws as equally
          weighted (a weight per draw in ``sample_stats`` would be silently ignored by ``arviz.summary`` and the
          plots); the weighted draws stay on this result, and the attributes say ``kish_ess``;
        - other draws (rejection ABC, ABCDP): one chain (the first ``num_samples`` if given).

        Attributes: ``method`` (default ``info["method"]``, else ``"baseline"``), ``num_simulations``,
        ``sampler``, ``num_chains``, ``settings`` (the scalar entries of ``info``, JSON), and with ``task``:
        ``task``, ``epsilon`` and the ``release`` (``y``, default ``task.y_obs``, also ``observed_data.release``).
        ``predictive=True`` (needs ``task``) adds a release simulated from every draw as
        ``posterior_predictive.release``. ``generator`` drives the resampling and the simulations."""
        from ..diagnostics import baseline_inference_data

        return baseline_inference_data(self, task, method, y, num_samples, generator, predictive)
