"""MH with averaged acceptance ratios (Andrieu, Doucet, Yildirim & Chopin 2020; Alparslan & Yildirim, Alg. 6-8).

The state is ``(theta, latent)``. Each step proposes ``theta'`` and ``N`` exchangeable particles of the latent,
the first being the current one; with weights ``w_j`` under ``theta`` and ``w'_j`` under ``theta'`` it accepts
with ``prior ratio x sum_j w'_j / sum_j w_j`` and then draws the new latent among the particles with
probability ``prop. w'_k`` (accepted) or ``prop. w_k`` (rejected). Numerator and denominator are both fresh at
every step, which is what makes it mix better than PMMH at small ``N``. Modes:

- ``summary`` (Alg. 6): the latent is the summary ``u`` with a tractable law ``f(u | theta)``; particles come
  from the symmetric proposal ``f(. | (theta + theta') / 2)`` and ``w_j = f(u_j | theta) eta(y | u_j) / q(u_j)``.
- ``records`` (Alg. 7): the latent is the records' noise ``z_{1:n}`` (``x = phi_theta(z)``) and
  ``w_j = eta(y | S(phi_theta(z^(j))))``; particles redraw all records (full mode) or a random subset of
  ``m`` records (subset mode). For non-additive statistics (median, max with smooth sensitivity).
- ``sequential`` (Alg. 8): a release per record; particles per record, weights and the new latent record by
  record, and the ratio is ``prod_t sum_j h(y_t | z_t^(j), theta') / sum_j h(y_t | z_t^(j), theta)``.

The paper's Alg. 7 keeps the latent on rejection; here it is redrawn among the particles with weights under
``theta`` (as in Alg. 6 and 8), a conditional importance-sampling step that leaves the target invariant too.
"""

from __future__ import annotations

import abc

import torch
from torch import Tensor

from ..mechanisms import Mechanism
from ..mechanisms.base import check_integer, open_unit
from ..tasks import Task
from ..tasks.latent import (
    ReparameterizedRecords,
    SummaryModel,
    record_log_prob,
    record_model_of,
    summary_model_of,
)
from .exact_abc import target_release
from .noisy_mcmc import Carry, Move, run_metropolis
from .result import BaselineResult

MODES = ("summary", "records", "sequential")


def pick(particles: Tensor, log_w: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw one particle per group with probability ``prop. exp(log_w)`` (Gumbel-max).

    ``particles (C, N, *R, *E)`` and ``log_w (C, N, *R)``: returns ``(C, *R, *E)``.
    """
    u = open_unit(torch.rand(log_w.shape, generator=generator, device=log_w.device, dtype=log_w.dtype))
    k = (log_w - torch.log(-torch.log(u))).argmax(1, keepdim=True)  # (C, 1, *R)
    k = k.reshape(k.shape + (1,) * (particles.ndim - k.ndim)).expand(k.shape + particles.shape[k.ndim :])
    return particles.gather(1, k).squeeze(1)


class AveragedMove(Move):
    """Alg. 6-8: the particles and their log weights come from a subclass; ratio and redraw are shared."""

    def __init__(self, mechanism: Mechanism, y: Tensor, num_particles: int) -> None:
        # the current latent and fresh ones
        self.num_particles = check_integer("MHAAR's num_particles", num_particles, minimum=2)
        self.mechanism, self.y = mechanism, y
        self.simulations_per_step = self.num_particles - 1
        self.info = dict(num_particles=self.num_particles)

    def anchor(self, theta: Tensor, theta_prop: Tensor) -> Tensor:
        """The parameter the particles are proposed from; it must be symmetric in ``theta, theta_prop``."""
        return theta

    @abc.abstractmethod
    def particles(self, current: Tensor | None, anchor: Tensor, generator: torch.Generator | None) -> Tensor:
        """``(C, N, ...)`` particles: ``current`` first and ``N - 1`` fresh ones (all fresh when ``current`` is None)."""

    @abc.abstractmethod
    def log_weights(self, particles: Tensor, theta: Tensor, anchor: Tensor) -> Tensor:
        """Log weights ``(C, N, *R)`` of the particles under ``theta``."""

    def init(self, theta: Tensor, generator: torch.Generator | None) -> Carry:
        particles = self.particles(None, theta, generator)
        return (pick(particles, self.log_weights(particles, theta, theta), generator),)

    def __call__(self, theta, theta_prop, carry, generator):
        anchor = self.anchor(theta, theta_prop)
        particles = self.particles(carry[0], anchor, generator)
        log_w, log_w_prop = (
            self.log_weights(particles, theta, anchor),
            self.log_weights(particles, theta_prop, anchor),
        )
        log_ratio = (
            (torch.logsumexp(log_w_prop, 1) - torch.logsumexp(log_w, 1)).reshape(theta.shape[0], -1).sum(1)
        )
        return log_ratio, (pick(particles, log_w_prop, generator),), (pick(particles, log_w, generator),)


class SummaryAAR(AveragedMove):
    """Alg. 6: particles ``u_j ~ f(. | (theta + theta') / 2)`` of the summary."""

    def __init__(self, model: SummaryModel, mechanism: Mechanism, y: Tensor, num_particles: int) -> None:
        super().__init__(mechanism, y, num_particles)
        self.model = model

    def anchor(self, theta: Tensor, theta_prop: Tensor) -> Tensor:
        return (theta + theta_prop) / 2

    def particles(self, current, anchor, generator):
        fresh = self.num_particles - (current is not None)
        new = self.model.sample(anchor[:, None].expand(-1, fresh, -1).contiguous(), generator)
        return new if current is None else torch.cat([current[:, None], new], 1)

    def log_weights(self, particles, theta, anchor):
        log_f = self.model.log_prob(particles, theta[:, None]) - self.model.log_prob(
            particles, anchor[:, None]
        )
        return log_f + self.mechanism.log_prob(self.y, particles)


class RecordAAR(AveragedMove):
    """Alg. 7 (``per_record=False``; all records or a random subset of ``subset_size`` redrawn) and Alg. 8
    (``per_record=True``: weights and redraw record by record)."""

    def __init__(
        self,
        records: ReparameterizedRecords,
        mechanism: Mechanism,
        y: Tensor,
        num_particles: int,
        subset_size: int | None = None,
        per_record: bool = False,
    ) -> None:
        super().__init__(mechanism, y, num_particles)
        self.records, self.subset_size, self.per_record = records, subset_size, per_record
        self.info.update(subset_size=subset_size)

    def particles(self, current, anchor, generator):
        c, n = anchor.shape[0], self.records.n
        if current is None:
            return self.records.latent((c, self.num_particles, n), anchor, generator)
        if self.subset_size is None:
            new = self.records.latent((c, self.num_particles - 1, n), anchor, generator)
            return torch.cat([current[:, None], new], 1)
        m = self.subset_size
        subset = torch.rand(c, n, generator=generator, device=anchor.device).argsort(-1)[
            :, :m
        ]  # b, per chain
        new = self.records.latent((c, self.num_particles - 1, m), anchor, generator)
        out = current[:, None].repeat(1, self.num_particles, 1, 1)
        out[:, 1:].scatter_(2, subset[:, None, :, None].expand(new.shape), new)
        return out

    def log_weights(self, particles, theta, anchor):
        x = self.records.records(particles, theta[:, None])
        if self.per_record:
            return record_log_prob(self.mechanism, self.y[0], self.records.values(x))  # (C, N, n)
        return self.mechanism.log_prob(self.y, self.records.summary(x))  # (C, N)


def _mode(task: Task, mode: str, model: object, subset_size: int | None) -> str:
    """The MHAAR variant: ``mode`` itself, or from ``model`` / the task's models when ``'auto'``."""
    if mode != "auto":
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose 'auto' or one of {MODES}")
        return mode
    records = model if model is not None else getattr(task, "record_model", None)
    if isinstance(records, ReparameterizedRecords) and (
        model is not None or records.sequential or subset_size
    ):
        return "sequential" if records.sequential else "records"
    if model is not None or getattr(task, "summary_model", None) is not None:
        return "summary"
    return "records"


def mhaar(
    task: Task,
    num_iterations: int,
    num_particles: int,
    proposal_scale: float | Tensor,
    theta0: Tensor | None = None,
    *,
    mode: str = "auto",
    subset_size: int | None = None,
    model: SummaryModel | ReparameterizedRecords | None = None,
    y: Tensor | None = None,
    num_chains: int = 1,
    burn_in: int | None = None,
    thin: int = 1,
    generator: torch.Generator | None = None,
    progress: bool = True,
) -> BaselineResult:
    """MH with averaged acceptance ratios over ``N = num_particles`` latent particles (see the module).

    ``mode``: ``'summary'`` (Alg. 6; ``model`` or ``task.summary_model``), ``'records'`` (Alg. 7; ``model`` or
    ``task.record_model``; all records redrawn, or ``subset_size`` of them) or ``'sequential'`` (Alg. 8; a
    record model with ``sequential=True``). ``'auto'`` picks sequential for a sequential record model, records
    when ``subset_size`` is set or ``model`` is a record model, else summary when there is a summary model,
    else records. ``y`` defaults to ``task.y_obs``. ``proposal_scale``: random-walk standard deviation (number
    or per coordinate) or covariance in the unconstrained space of ``task.transform``. See
    :func:`~dpsbi.baselines.noisy_mcmc.run_metropolis` for chains, burn-in, thinning and ``info``;
    ``num_simulations`` counts fresh particles (summaries, or data sets of records).
    """
    task.require_mechanism_release("mhaar")
    y = target_release(task, y, "mhaar")
    mode = _mode(task, mode, model, subset_size)
    if subset_size is not None and mode != "records":
        raise ValueError(f"subset_size applies to mode='records' (Alg. 7) only, not {mode!r}")
    if mode == "summary":
        move: AveragedMove = SummaryAAR(
            summary_model_of(task, model, "mhaar"), task.mechanism, y, num_particles
        )
    else:
        records = record_model_of(task, model, f"mhaar (mode={mode!r})")
        if (mode == "sequential") != records.sequential:
            raise ValueError(
                f"mode={mode!r} needs a record model with sequential={mode == 'sequential'} (a release per record), "
                f"got {records!r}"
            )
        if subset_size is not None and not 1 <= subset_size <= records.n:
            raise ValueError(f"subset_size must lie in [1, n={records.n}], got {subset_size}")
        move = RecordAAR(
            records, task.mechanism, y, num_particles, subset_size, per_record=mode == "sequential"
        )
    move.info.update(mode=mode)
    return run_metropolis(
        task,
        move,
        num_iterations,
        proposal_scale,
        theta0,
        num_chains,
        burn_in,
        thin,
        generator,
        progress,
        "MHAAR",
    )
