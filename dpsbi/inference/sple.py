"""Sequential Private Likelihood Estimation: a likelihood flow ``q(y | theta)`` of the release, with the
posterior ``prior x q(y_obs | .)`` sampled by MCMC."""

from __future__ import annotations

from ..tasks import Task
from .estimator import SequentialEstimator
from .losses import sple_loss
from .mcmc import MCMCConfig
from .posterior import LikelihoodPosterior
from .training import Loss


class SPLE(SequentialEstimator):
    """Sequential private likelihood estimation (main paper, Alg. 2).

    Trains ``q(y | theta)`` on ``-mean log q(y_ij | theta_i)`` with ``inner_samples`` fresh releases per
    stored summary; each later round proposes from ``prior(theta) q(y_obs | theta)`` by slice sampling
    (``mcmc``: an :class:`~dpsbi.inference.mcmc.MCMCConfig` or a dict of its fields). See
    :class:`~dpsbi.inference.estimator.SequentialEstimator` for the common arguments.
    """

    method = "SPLE"

    def __init__(self, task: Task, rounds: int = 10, sims_per_round: int = 1000, inner_samples: int = 32, qmc: bool = True, mcmc: MCMCConfig | dict | None = None, **kwargs) -> None:
        super().__init__(task, rounds, sims_per_round, inner_samples, qmc, **kwargs)
        self.mcmc = MCMCConfig.coerce(mcmc)

    def options(self) -> dict:
        return {"mcmc": self.mcmc.to_dict()}

    def flow_data(self, z, s, generator):
        return self.task.release(s, generator=generator), z

    def loss(self, round_index: int) -> Loss:
        mechanism, m, qmc = self.task.mechanism, self.inner_samples, self.qmc

        def loss(flow, batch, generator):
            z, s = batch
            return sple_loss(flow, z, s, mechanism, m, qmc, generator)

        return loss

    def posterior(self, round_index: int) -> LikelihoodPosterior:
        return LikelihoodPosterior(self.task, self._posterior_flow(), self.method, self.mcmc, progress=self.progress)
