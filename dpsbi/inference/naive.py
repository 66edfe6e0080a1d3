"""The non-private baseline: neural posterior estimation that treats the release as the confidential
statistic, to show the bias of ignoring the privacy mechanism."""

from __future__ import annotations

from ..tasks import Task
from .estimator import SequentialEstimator
from .losses import posterior_loss
from .posterior import FlowPosterior
from .training import Loss


class NaiveNPE(SequentialEstimator):
    """NPE on ``(theta, s)`` pairs from the prior: the same flow as SPPE but trained on the confidential
    summaries and then evaluated at the release ``y_obs`` as if it were one. Its posterior ignores the
    mechanism's noise (overconfident, biased).

    ``rounds`` and ``sims_per_round`` are the simulation budget of the sequential methods, spent at once:
    NaiveNPE trains one round on ``rounds * sims_per_round`` prior draws (the defaults, 10 x 1000, match
    SPPE's), so that one budget gives every neural method the same number of simulations. Takes
    the keyword arguments of :class:`~dpsbi.inference.estimator.SequentialEstimator` (``flow``,
    ``training``, ``seed``, ``budget``, ...); it uses one release per summary (``inner_samples=1``, no RQMC). Its
    posterior is amortized whatever ``amortized`` says (one round from the prior); a simulation ``budget`` cuts
    that round, a budget in seconds and ``stop_when_stable`` have no later round to stop."""

    method = "NaiveNPE"
    paper_settings = {"rounds": 10, "sims_per_round": 1000}
    unused_arguments = ("amortized", "epsilon_range", "stop_when_stable")

    def __init__(self, task: Task, rounds: int = 10, sims_per_round: int = 1000, **kwargs) -> None:
        if kwargs.get("epsilon_range") is not None:
            raise ValueError(
                "NaiveNPE ignores the mechanism, so its posterior does not depend on epsilon: it takes no epsilon_range"
            )
        if task.mechanism.input_dim != task.dim_s:
            raise ValueError(
                f"NaiveNPE conditions on the confidential summary in place of the release, but task {task.name!r} "
                f"releases {task.dim_s} numbers from a summary of {task.mechanism.input_dim}"
            )
        if int(rounds) < 1 or int(sims_per_round) < 2:
            raise ValueError(f"need rounds >= 1 and sims_per_round >= 2, got {rounds}, {sims_per_round}")
        super().__init__(task, 1, int(rounds) * int(sims_per_round), 1, False, **kwargs)

    def flow_data(self, z, s, generator, epsilon=None):
        return z, s

    def loss(self, round_index: int) -> Loss:
        return lambda flow, batch, generator: posterior_loss(flow, batch[0], batch[1].unsqueeze(-2))

    def posterior(self, round_index: int) -> FlowPosterior:
        return FlowPosterior(self.task, self._posterior_flow(), self.method, amortized=True)
