"""Sequential Private Likelihood Estimation: a likelihood flow ``q(y | theta)`` of the release, with the
posterior ``prior x q(y_obs | .)`` sampled by MCMC."""

from __future__ import annotations

import torch
from torch import Tensor

from ..mechanisms.base import check_flag, check_integer, lattice_cells
from ..seeds import seeded_global_streams
from ..tasks import Task
from .estimator import SequentialEstimator
from .losses import dequantized, likelihood_log_prob, noise_uniforms, sple_loss
from .mcmc import MCMCSettings
from .posterior import LikelihoodPosterior
from .seeding import derive_seed
from .sppe import SPPE
from .training import Loss
from .widening import Widening, ancillary_directions, resolve_widening

#: Prior simulations that find the statistic's ancillary directions for ``widening`` at construction (naive Bayes'
#: three constraints: spread ~1e-7 of the largest over 1000 tables); not counted in a ``budget``.
ANCILLARY_PROBE = 1000


class SPLE(SequentialEstimator):
    """Sequential private likelihood estimation (main paper, Alg. 2).

    Trains ``q(y | theta)`` on ``-mean log q(y_ij | theta_i)`` with ``inner_samples`` fresh releases per
    stored summary; each later round proposes from ``prior(theta) q(y_obs | theta)`` by slice sampling
    (``mcmc``: an :class:`~dpsbi.inference.mcmc.MCMCSettings` or a dict of its fields). Releases on a lattice
    (binomial counts, randomized response) are dequantized (``dequantize=True``, the default): the flow models
    ``y + h v`` with ``v`` uniform on the cell, drawn from the same RQMC points as the mechanism noise, and the
    likelihood of ``y_obs`` is the flow's mass on its cell (``cell_points`` quadrature points). See
    :class:`~dpsbi.inference.estimator.SequentialEstimator` for the common arguments.

    ``amortized=True``: every round draws from the prior, so the likelihood is learnt over the whole prior and
    the posterior is valid at any release (it is at releases near ``y_obs`` already after sequential rounds);
    with ``epsilon_range=(low, high)`` the flow is ``q(y | theta, log epsilon)`` and the posterior takes any
    epsilon in the range. An amortized fit draws SPPE's amortized simulations a round (100 000 where they are
    cheap: :meth:`default_sims_per_round`) on batches of 1000 without weight decay, with M = 4 inner releases
    (:meth:`default_inner_samples`), where the call leaves them out.

    ``widening`` (as SPPE's: a :class:`~dpsbi.inference.widening.Widening`, a dict of its fields, ``True`` or
    ``False``; amortized fits on Laplace or Gaussian noise of a statistic with linear constraints): training
    releases take widened noise, weighted back by the ratio of their ancillary part only (the release along the
    directions in which the statistic never varies, found on :data:`ANCILLARY_PROBE` prior simulations), so that
    releases whose noise lies far out are common in training while ``prior x q(y_obs | .)`` stays the exact
    posterior's optimum (:mod:`~dpsbi.inference.widening`). ``None``: :meth:`default_widening` (naive Bayes: on).

    Defaults, from the accuracy-per-second frontier on one CPU core (docs/RESULTS.md, "Fast by default"): 7
    rounds of 1000 simulations (6 left SIR at epsilon 10 at C2ST 0.552-0.561 in 2 of 3 seeds; the 7th round
    brings all three to 0.532-0.538), M = 8 RQMC releases per simulation (on SIR's lattice release M = 1 plain
    MC stalled at C2ST 0.58; 4 in an amortized fit: :meth:`default_inner_samples`), 500 gradient steps a round
    with a cosine learning rate from 1e-3. :meth:`paper` gives the paper's settings (10 rounds, M = 32,
    open-ended rounds).
    """

    method = "SPLE"
    release_is_context = False
    settings_groups = {**SequentialEstimator.settings_groups, "mcmc": MCMCSettings}
    #: ``batch_size=None`` and ``weight_decay=None``: chosen per fit, as SPPE's (:meth:`default_batch_size`).
    training_defaults = {"batch_size": None, "weight_decay": None}
    default_batch_size = staticmethod(SPPE.default_batch_size)
    default_weight_decay = staticmethod(SPPE.default_weight_decay)

    def __init__(
        self,
        task: Task,
        rounds: int = 7,
        sims_per_round: int | None = None,
        inner_samples: int | None = None,
        qmc: bool = True,
        mcmc: MCMCSettings | dict | None = None,
        dequantize: bool = True,
        cell_points: int = 8,
        widening: Widening | dict | bool | None = None,
        **kwargs,
    ) -> None:
        task.mechanism.require_likelihood_flow(self.method)  # a density or a lattice, not an atom on one
        amortized = bool(kwargs.get("amortized", False))
        if sims_per_round is None:
            sims_per_round = self.default_sims_per_round(amortized, task, rounds)
        if inner_samples is None:
            inner_samples = self.default_inner_samples(amortized)
        super().__init__(task, rounds, sims_per_round, inner_samples, qmc, **kwargs)
        self.mcmc = MCMCSettings.coerce(mcmc)
        self.dequantize = check_flag("dequantize", dequantize) and bool(
            lattice_cells(task.mechanism)[0]
        )  # some coordinate's lattice
        self.cell_points = check_integer("cell_points", cell_points)
        if self.cell_points & (self.cell_points - 1):
            raise ValueError(f"cell_points must be a power of two, got {cell_points}")
        self.widening = resolve_widening(
            widening, self.default_widening(self.amortized, task), self.amortized, task.mechanism
        )
        # without a simulator the directions are found on round 1's data; asked for, none is refused in one line
        if self.widening is not None and task.simulator is not None:
            self.ancillary = self._ancillary_basis(required=widening is not None)
            if self.ancillary is None:  # the default met no usable constraints: trained plain
                self.widening = None

    def _ancillary_basis(self, required: bool) -> Tensor | None:
        """The directions ``(k, dim_s)`` in which :data:`ANCILLARY_PROBE` prior simulations never vary (under seeds
        derived from the fit's), checked against the mechanism's noise at the largest epsilon trained on; where
        there are none, refused in one line (``required``) or ``None``."""
        with seeded_global_streams(derive_seed(self.seed, "ancillary prior")):
            theta = self.task.prior.sample((ANCILLARY_PROBE,))
        generator = torch.Generator(device=theta.device).manual_seed(
            derive_seed(self.seed, "ancillary simulate")
        )
        s = self.task.simulate(theta, generator)
        return ancillary_directions(
            self.task.mechanism, s, self.smallest_noise(), generator, required=required
        )

    @staticmethod
    def default_sims_per_round(amortized: bool, task: Task, rounds: int) -> int:
        """``sims_per_round`` where the call leaves it out: 1000 for a fit at ``y_obs``, SPPE's amortized rule for
        an amortized fit (:meth:`SPPE.default_sims_per_round`: 100 000 where the simulator is cheap). Measured on
        naive Bayes over epsilon 1-10, 20 prior-predictive releases at each of 1.5, 4 and 9 (docs/RESULTS.md,
        "Amortized SPLE, first scored"): 7 x 1000 on batches of 100 scored mean C2ST 0.555 / 0.560 / 0.584 and worst
        0.644-0.688 (seed 0); 7 x 100 000 on batches of 1000 without weight decay 0.524 / 0.511 / 0.517, worst 0.606
        / 0.547 / 0.542, sds within 2 %, SBC and TARP passing (seed 0; in seeds 1-2 means 0.515-0.522 at every
        epsilon, worst 0.609 and 0.653 at 1.5, the one release whose noise draw lies far out, and 0.546-0.606 at 4
        and 9), for 2234 CPU s of fit against 259."""
        return SPPE.default_sims_per_round(amortized, task, rounds)

    @staticmethod
    def default_widening(amortized: bool, task: Task) -> bool:
        """``widening`` where the call leaves it out: on where SPPE's is (:meth:`SPPE.default_widening`: an amortized
        fit of a task whose missed releases are far noise draws, naive Bayes) and the task has a simulator to find
        the statistic's constraints on before the fit (quietly off where it has no usable ones). Measured on
        naive Bayes over epsilon 1-10, 20 prior-predictive releases at 1.5, 4 and 9 (docs/RESULTS.md, "Amortized SPLE,
        first scored"): the worst release 0.567-0.570 at 1.5 in three seeds (plain 0.623-0.643) and 0.531-0.549 at 9
        (plain 0.560-0.614), at 4, where no release lies far out, 0.554-0.582 (plain 0.550-0.564), means within
        0.006, SBC and TARP passing, for 1922-1946 CPU s of fit (plain 1594, timed a session earlier)."""
        return SPPE.default_widening(amortized, task) and task.simulator is not None

    @staticmethod
    def default_inner_samples(amortized: bool) -> int:
        """``inner_samples`` where the call leaves it out: 8 RQMC releases a simulation for a fit at ``y_obs``, 4 for
        an amortized one, whose 100 000 simulations a round already cover the noise. Measured on naive Bayes over
        epsilon 1-10, 20 prior-predictive releases at each of 1.5, 4 and 9 (docs/RESULTS.md, "Four inner releases
        instead of eight"): the fit in 1594-1757 CPU s against M = 8's 2234 (under 30 minutes of one core), mean
        C2ST 0.512-0.524 in every cell of three seeds (M = 8: 0.511-0.524), the worst release as M = 8's within 0.04
        (the far-noise release 8 at 1.5: 0.623-0.643 against 0.606-0.653)."""
        return 4 if amortized else 8

    def options(self) -> dict:
        dequantization = {"dequantize": True, "cell_points": self.cell_points} if self.dequantize else {}
        return {
            "mcmc": self.mcmc.to_dict(),
            **dequantization,
            **({"widening": self.widening.to_dict()} if self.widening is not None else {}),
        }  # a continuous mechanism's: as before dequantization

    def flow_data(self, z, s, generator, epsilon=None):
        y = self.releases(s, generator, epsilon)
        if self.dequantize:
            y = dequantized(
                y,
                self.task.mechanism,
                torch.rand(  # one offset per lattice coordinate
                    y.shape[:-1] + (len(lattice_cells(self.task.mechanism)[0]),),
                    generator=generator,
                    device=y.device,
                    dtype=y.dtype,
                ),
            )
        return y, self.context(z, epsilon)

    def loss(self, round_index: int) -> Loss:
        mechanism, m, qmc, dequantize = self.task.mechanism, self.inner_samples, self.qmc, self.dequantize
        if self.widening is not None:
            return self.widened_loss(likelihood_log_prob)

        def compute(flow, batch, draws):
            z, s, *epsilon = batch  # epsilon: with epsilon_range
            return sple_loss(
                flow,
                z,
                s,
                mechanism,
                m,
                qmc,
                dequantize=dequantize,
                epsilon=epsilon[0] if epsilon else None,
                u=draws[0],
            )

        def draw(rows: int, generator: torch.Generator) -> tuple[Tensor, ...]:
            return (noise_uniforms(rows, mechanism, m, qmc, generator, dequantize),)

        return Loss(compute, draw)

    def posterior(self, round_index: int) -> LikelihoodPosterior:
        flow = self._posterior_flow()
        # no sampler bars (a fit shows one bar over its rounds); a call can ask: sample(..., show_progress_bars=True)
        return LikelihoodPosterior(
            self.task,
            flow,
            self.method,
            self.mcmc,
            False,
            self.dequantize,
            self.cell_points,
            epsilon_range=self.epsilon_range,
            training_releases=self.training_releases(),
        )
