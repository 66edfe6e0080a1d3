"""Sequential Private Posterior Estimation: a posterior flow ``q(theta | y)`` trained with atomic APT on
releases redrawn from the stored confidential summaries at every step."""

from __future__ import annotations

from torch import Tensor

from ..tasks import Task
from .estimator import SequentialEstimator
from .losses import sppe_loss
from .posterior import FlowPosterior
from .training import Loss


class SPPE(SequentialEstimator):
    """Sequential private posterior estimation (main paper, Alg. 1).

    Round 0 trains on prior draws with ``-mean log q(theta_i | y_ij)``; later rounds propose from
    ``q(. | y_obs)`` and train with atomic APT (``atoms`` contrasting parameters per pair). Each pair's
    ``inner_samples`` releases ``y_ij = G(s_i, u_ij)`` come from fresh RQMC (``qmc=True``) or MC uniforms.
    After one round the posterior is amortized (valid at any release). See
    :class:`~dpsbi.inference.estimator.SequentialEstimator` for the common arguments.
    """

    method = "SPPE"

    def __init__(self, task: Task, rounds: int = 10, sims_per_round: int = 1000, inner_samples: int = 32, qmc: bool = True, atoms: int = 10, **kwargs) -> None:
        super().__init__(task, rounds, sims_per_round, inner_samples, qmc, **kwargs)
        if int(atoms) < 2:
            raise ValueError(f"atomic APT needs atoms >= 2, got {atoms}")
        if int(atoms) > min(self.settings.batch_size, self.sims_per_round):
            raise ValueError(f"atoms={atoms} exceeds the batch size ({self.settings.batch_size}) or sims_per_round ({self.sims_per_round})")
        self.atoms = int(atoms)

    def options(self) -> dict:
        return {"atoms": self.atoms}

    def flow_data(self, z, s, generator):
        return z, self.task.release(s, generator=generator)

    def tensors(self, z: Tensor, s: Tensor) -> tuple[Tensor, ...]:
        return z, s, self.space.log_prior_z(z)

    def loss(self, round_index: int) -> Loss:
        atoms = 1 if round_index == 0 else self.atoms
        mechanism, m, qmc = self.task.mechanism, self.inner_samples, self.qmc

        def loss(flow, batch, generator):
            z, s, log_prior = batch
            return sppe_loss(flow, z, s, mechanism, m, qmc, generator, atoms=atoms, log_prior=log_prior)

        return loss

    def posterior(self, round_index: int) -> FlowPosterior:
        return FlowPosterior(self.task, self._posterior_flow(), self.method, amortized=round_index == 0)
