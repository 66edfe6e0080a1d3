"""The non-private baseline: neural posterior estimation that treats the release as the confidential
statistic, to show the bias of ignoring the privacy mechanism."""

from __future__ import annotations

from ..tasks import Task
from .estimator import SequentialEstimator
from .losses import posterior_loss
from .posterior import FlowPosterior
from .training import Loss


class NaiveNPE(SequentialEstimator):
    """NPE on ``(theta, s)`` pairs from the prior (``sims`` of them, one round): the same flow as SPPE
    but trained on the confidential summaries and then evaluated at the release ``y_obs`` as if it were
    one. Its posterior ignores the mechanism's noise (overconfident, biased). Takes the training
    arguments of :class:`~dpsbi.inference.estimator.SequentialEstimator`."""

    method = "NaiveNPE"

    def __init__(self, task: Task, sims: int = 1000, **kwargs) -> None:
        if task.mechanism.input_dim != task.dim_s:
            raise ValueError(
                f"NaiveNPE conditions on the confidential summary in place of the release, but task {task.name!r} "
                f"releases {task.dim_s} numbers from a summary of {task.mechanism.input_dim}"
            )
        super().__init__(task, rounds=1, sims_per_round=sims, inner_samples=1, qmc=False, **kwargs)

    def flow_data(self, z, s, generator):
        return z, s

    def loss(self, round_index: int) -> Loss:
        return lambda flow, batch, generator: posterior_loss(flow, batch[0], batch[1].unsqueeze(-2))

    def posterior(self, round_index: int) -> FlowPosterior:
        return FlowPosterior(self.task, self._posterior_flow(), self.method, amortized=True)
