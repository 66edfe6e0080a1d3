"""The non-private baseline: neural posterior estimation that treats the release as the confidential
statistic, to show the bias of ignoring the privacy mechanism."""

from __future__ import annotations

from ..mechanisms.base import check_integer
from ..tasks import Task
from .estimator import SequentialEstimator, unexpected_keywords
from .losses import posterior_loss
from .posterior import FlowPosterior
from .training import Loss


def check_release_shaped_like_summary(task: Task) -> None:
    """Raise ``ValueError`` unless ``task``'s release has as many coordinates as its confidential summary: NaiveNPE
    conditions on the summary and is then evaluated at the release in its place."""
    if task.mechanism.input_dim != task.dim_s:
        raise ValueError(
            f"NaiveNPE conditions on the confidential summary in place of the release, but task {task.name!r} "
            f"releases {task.dim_s} number{'s' * (task.dim_s != 1)} from a summary of {task.mechanism.input_dim}"
        )


class NaiveNPE(SequentialEstimator):
    """NPE on ``(theta, s)`` pairs from the prior: the same flow as SPPE but trained on the confidential
    summaries and then evaluated at the release ``y_obs`` as if it were one. Its posterior ignores the
    mechanism's noise (overconfident, biased).

    It trains one round on ``num_simulations`` prior draws (the default, 10 000, is SPPE's 10 rounds x 1000,
    so that the two spend the same simulations); it takes no ``rounds`` or ``sims_per_round``. Takes the
    keyword arguments of :class:`~dpsbi.inference.estimator.SequentialEstimator` (``flow``, ``training``,
    ``seed``, ``budget``, ...); it uses one release per summary (``inner_samples=1``, no RQMC). Its
    posterior is amortized whatever ``amortized`` says (one round from the prior); a simulation ``budget`` cuts
    that round, a budget in seconds and ``stop_when_stable`` have no later round to stop."""

    method = "NaiveNPE"
    paper_settings = {"num_simulations": 10_000}
    unused_arguments = ("amortized", "epsilon_range", "stop_when_stable")

    def __init__(self, task: Task, num_simulations: int = 10_000, **kwargs) -> None:
        sequential = sorted({"rounds", "sims_per_round"} & set(kwargs))
        if sequential:
            raise TypeError(
                f"{unexpected_keywords(self.method, {k: kwargs[k] for k in sequential})}; NaiveNPE trains one "
                "round: give its total number of simulations as num_simulations (rounds x sims_per_round)"
            )
        if kwargs.get("epsilon_range") is not None:
            raise ValueError(
                "NaiveNPE ignores the mechanism, so its posterior does not depend on epsilon: it takes no epsilon_range"
            )
        check_release_shaped_like_summary(task)
        num_simulations = check_integer("num_simulations", num_simulations, minimum=2)
        super().__init__(task, 1, num_simulations, 1, False, **kwargs)

    def flow_data(self, z, s, generator, epsilon=None):
        return z, s

    def loss(self, round_index: int) -> Loss:
        return Loss(lambda flow, batch, draws: posterior_loss(flow, batch[0], batch[1].unsqueeze(-2)))

    def posterior(self, round_index: int) -> FlowPosterior:
        return FlowPosterior(
            self.task,
            self._posterior_flow(),
            self.method,
            amortized=True,
            training_releases=self.training_releases(),
        )

    def simulated_releases(self, s, generator, epsilon=None):
        return s  # the flow conditions on the summaries as if they were releases

    def __repr__(self) -> str:
        return f"{type(self).__name__}(task={self.task.name!r}, num_simulations={self.sims_per_round})"
