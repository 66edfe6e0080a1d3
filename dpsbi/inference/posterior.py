"""Trained posteriors: sampling and densities at releases, saved to and rebuilt from a posterior file
(its format: :mod:`dpsbi.inference.posterior_file`)."""

from __future__ import annotations

import abc
import contextlib
import copy
import dataclasses
import math
import numbers
import os
import warnings
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor

from .. import tasks
from ..mechanisms.base import check_integer, lattice_cells
from ..mechanisms.epsilon import epsilons, nominal_epsilon
from ..qmc import cell_points
from ..seeds import seeded_global_streams
from ..tasks import Task
from ..tasks.identity import identity, simulator_probe
from . import posterior_file
from .flows import ConditionalFlow, FlowSettings
from .losses import dequantized, with_log_epsilon
from .mcmc import MCMCSettings, resample_init, slice_sample_groups
from .parameters import ParameterSpace
from .proposal import DefensiveProposal
from .release_check import ReleaseOutsideTraining, TrainingReleases
from .seeding import draw_seed, make_generator

#: Most rows per flow call when sampling or evaluating densities (a flow call takes ~1.3 KB per row).
CHUNK_ROWS = 100_000


class Posterior(abc.ABC):
    """A posterior over a task's parameters given releases ``y``, built on a trained conditional flow.

    ``sample(sample_shape, y=None, generator=None, seed=None)`` returns parameters in the prior's space,
    shape ``sample_shape + (dim_theta,)`` (``sample_shape``: a tuple of integers >= 0, or one integer ``n`` for
    ``(n,)``); ``log_prob(theta, y=None)`` returns ``theta.shape[:-1]`` (NaN parameters are refused);
    ``sample_batched`` and ``log_prob_batched`` do the same for a batch of releases ``(B, dim_s)`` and
    ``map`` finds the mode. ``y`` defaults to the release set by :meth:`set_default_x`, else ``task.y_obs``;
    every release is validated with ``task.check_release``. Results live on the flow's device.

    ``epsilon``: the privacy level of the release(s), for a posterior trained over a range of epsilons
    (``epsilon_range``, see :class:`~dpsbi.inference.estimator.SequentialEstimator`): a number, or one per
    release (a tensor ``(B,)``) in the batched methods. Left out, it is the one set by :meth:`set_default_epsilon`,
    else the task's own epsilon (its mechanism's, the target epsilon of a ``BinomialCurve``) when that lies in the
    range, else it must be given; an epsilon
    outside the range is refused (``ValueError``). A posterior trained at one epsilon takes only that one.

    sbi's keywords are accepted too, so that sbi's ``run_sbc``, ``run_tarp``, ``get_nltp`` and plots take a
    dpsbi posterior unchanged: ``x`` is ``y`` under sbi's name (both, with different values, is a
    ``TypeError``); ``show_progress_bars`` shows or hides the slice sampler's bars of a
    :class:`LikelihoodPosterior` for the call (``None``: its ``progress`` setting; a :class:`FlowPosterior`
    has none); ``max_sampling_batch_size`` and ``reject_outside_prior`` are accepted and change nothing (at
    most :data:`CHUNK_ROWS` flow rows go through at once already, and every draw lies in the prior's support:
    the flow works in the unconstrained space); ``track_gradients`` lets a density's gradient reach ``theta``.

    ``training_releases``: the statistics of the simulated releases the flow was trained on
    (:class:`~dpsbi.inference.release_check.TrainingReleases`, set by the estimators and kept in posterior files);
    a release given to :meth:`sample`, :meth:`sample_batched`, :meth:`log_prob` (and the other methods taking
    ``y``) or :meth:`set_default_x` that lies outside them gets one
    :class:`~dpsbi.inference.release_check.ReleaseOutsideTraining` warning naming its coordinates (``None``: files
    written before the check, which are not checked).
    """

    kind: ClassVar[str]

    def __init__(
        self,
        task: Task,
        flow: ConditionalFlow,
        method: str,
        epsilon_range: tuple[float, float] | None = None,
        training_releases: TrainingReleases | None = None,
    ) -> None:
        self.task, self.flow, self.method = task, flow.eval(), method
        self.training_releases = training_releases
        self.space = ParameterSpace(task)
        self._device_space: tuple[torch.device, ParameterSpace] | None = None
        self._default_x: Tensor | None = None
        self._default_epsilon: float | None = None
        #: ``(low, high)``: the flow also conditions on ``log epsilon``, trained for epsilons in that range.
        self.epsilon_range = None if epsilon_range is None else tuple(float(v) for v in epsilon_range)

    @property
    def device(self) -> torch.device:
        return next(self.flow.parameters()).device

    @property
    def device_space(self) -> ParameterSpace:
        """:attr:`space` with its prior on the flow's device (:meth:`ParameterSpace.on`: densities read nothing back
        to the host), made once per device."""
        device = self.device
        if self._device_space is None or self._device_space[0] != device:
            self._device_space = (device, self.space.on(device))
        return self._device_space[1]

    @property
    def default_x(self) -> Tensor | None:
        """The release ``(1, dim_s)`` used when none is given: the one set by :meth:`set_default_x`, else ``task.y_obs``."""
        return self._default_x if self._default_x is not None else self.task.y_obs

    @torch.no_grad()
    def set_default_x(self, y: Tensor) -> Posterior:
        """Use release ``y`` (``(dim_s,)`` or ``(1, dim_s)``, validated now) where no ``y`` is given; returns ``self``."""
        self._default_x = self._releases(y, single=True).cpu()
        return self

    def set_default_epsilon(self, epsilon: float) -> Posterior:
        """Use ``epsilon`` (checked against the trained range now) where none is given; returns ``self``. With
        :meth:`set_default_x`, tools that pass only releases (sbi's ``run_sbc`` / ``run_tarp``, ArviZ exports)
        see an epsilon-amortized posterior at one privacy level."""
        checked = self._epsilons(float(epsilon), 1)  # None: trained at the task's epsilon, which it is
        self._default_epsilon = float(epsilon) if checked is None else float(checked[0])
        return self

    def to(self, device: torch.device | str) -> Posterior:
        """Move the flow to ``device`` (in place); returns ``self``."""
        self.flow.to(device)
        return self

    @torch.no_grad()
    def sample(
        self,
        sample_shape=(),
        y: Tensor | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        *,
        epsilon: float | None = None,
        x: Tensor | None = None,
        show_progress_bars: bool | None = None,
        max_sampling_batch_size: int | None = None,
        reject_outside_prior: bool = True,
    ) -> Tensor:
        """Draws ``sample_shape + (dim_theta,)`` at release ``y`` (``(dim_s,)`` or ``(1, dim_s)``) and ``epsilon``
        (class docstring); ``seed`` or ``generator`` fix them. Raises ``RuntimeError`` rather than return a
        NaN/inf draw. ``x`` and the other keywords: sbi's (class docstring)."""
        shape = _sample_shape(sample_shape)
        y = self._conditions(_release_or_x(y, x, "sample"), epsilon, single=True)
        with self._progress_bars(show_progress_bars):
            return self._draw(shape, y, self._noise_generator(generator, seed))[..., 0, :]

    @torch.no_grad()
    def sample_batched(
        self,
        sample_shape,
        y: Tensor | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        *,
        epsilon: float | Tensor | None = None,
        x: Tensor | None = None,
        show_progress_bars: bool | None = None,
        max_sampling_batch_size: int | None = None,
        reject_outside_prior: bool = True,
    ) -> Tensor:
        """Draws ``sample_shape + (B, dim_theta)`` at each of the releases ``y (B, dim_s)`` (required, as ``y`` or
        sbi's ``x``), independent across releases (sbi's ``sample_batched``); ``epsilon``: one for all releases
        or one per release, ``(B,)`` (class docstring); ``seed`` or ``generator`` fix them. With one release the
        draws are those of :meth:`sample` under the same seed. A
        :class:`FlowPosterior` maps all of them in one vectorized flow pass (in chunks of :data:`CHUNK_ROWS`
        flow rows); a :class:`LikelihoodPosterior` runs every release's MCMC chains in one run (its sequential
        calls as for one release, each call ``B`` times as large). sbi's keywords: class
        docstring."""
        shape = _sample_shape(sample_shape)
        y = self._conditions(_release_or_x(y, x, "sample_batched", required=True), epsilon, single=False)
        with self._progress_bars(show_progress_bars):
            return self._draw(shape, y, self._noise_generator(generator, seed))

    @torch.no_grad()
    def log_prob(
        self,
        theta: Tensor,
        y: Tensor | None = None,
        *,
        epsilon: float | None = None,
        x: Tensor | None = None,
        track_gradients: bool = False,
    ) -> Tensor:
        """Log density ``theta.shape[:-1]`` of ``theta (..., dim_theta)`` at release ``y`` (or sbi's ``x``) and
        ``epsilon`` (class docstring); ``-inf`` outside the prior's support. ``track_gradients``: differentiable
        in ``theta``."""
        y = self._conditions(_release_or_x(y, x, "log_prob"), epsilon, single=True)
        with torch.set_grad_enabled(track_gradients):
            return self._log_prob(theta, y)

    def potential(
        self,
        theta: Tensor,
        y: Tensor | None = None,
        *,
        epsilon: float | None = None,
        x: Tensor | None = None,
        track_gradients: bool = False,
    ) -> Tensor:
        """sbi's ``potential``: the log posterior density up to a constant in ``theta``, here :meth:`log_prob`
        itself (normalized for a :class:`FlowPosterior`), shape ``theta.shape[:-1]``. It exists because sbi's
        ``get_nltp`` calls ``posterior.potential(theta, x=x)`` on any posterior but sbi's own
        ``DirectPosterior``."""
        return self.log_prob(
            theta, _release_or_x(y, x, "potential"), epsilon=epsilon, track_gradients=track_gradients
        )

    @torch.no_grad()
    def log_prob_batched(
        self,
        theta: Tensor,
        y: Tensor | None = None,
        *,
        epsilon: float | Tensor | None = None,
        x: Tensor | None = None,
        track_gradients: bool = False,
    ) -> Tensor:
        """Log densities ``(..., B)`` of ``theta (..., B, dim_theta)``, column ``b`` at release ``y[b]`` of
        ``y (B, dim_s)`` (required, as ``y`` or sbi's ``x``; sbi's ``log_prob_batched``) and ``epsilon`` (one, or
        one per release); ``-inf`` outside the prior's support. ``track_gradients``: differentiable in ``theta``."""
        y = self._conditions(_release_or_x(y, x, "log_prob_batched", required=True), epsilon, single=False)
        theta = torch.as_tensor(theta)
        if theta.ndim < 2 or theta.shape[-2] != y.shape[0]:
            raise ValueError(
                f"theta must have shape (..., {y.shape[0]}, {self.task.dim_theta}) for {y.shape[0]} releases, got {tuple(theta.shape)}"
            )
        with torch.set_grad_enabled(track_gradients):
            return self._log_prob(theta, y)

    @torch.no_grad()
    def map(
        self,
        y: Tensor | None = None,
        num_init: int = 1000,
        num_to_optimize: int = 10,
        steps: int = 200,
        lr: float = 0.05,
        seed: int | None = None,
        *,
        epsilon: float | None = None,
        x: Tensor | None = None,
        show_progress_bars: bool | None = None,
    ) -> Tensor:
        """The posterior's mode ``(dim_theta,)`` at release ``y`` (or sbi's ``x``) and ``epsilon``, as sbi finds it: the
        ``num_to_optimize`` best of ``num_init`` posterior draws, each moved by ``steps`` Adam steps of rate
        ``lr`` up the log density (of ``theta``, in the prior's space) in the unconstrained space; the best
        point seen is returned. ``seed`` fixes the draws; ``show_progress_bars``: those of the draws (class
        docstring). The defaults take a few seconds on a CPU (sbi's, 100 points x 1000 steps at rate 0.01,
        took 40 s for a 2-parameter posterior)."""
        if min(num_init, num_to_optimize) < 1 or steps < 0 or not lr > 0:
            raise ValueError(
                f"map needs num_init, num_to_optimize >= 1, steps >= 0 and lr > 0, got {num_init}, {num_to_optimize}, {steps}, {lr}"
            )
        y = self._conditions(_release_or_x(y, x, "map"), epsilon, single=True)
        with self._progress_bars(show_progress_bars):
            theta = self._draw(torch.Size((num_init,)), y, self._noise_generator(None, seed))[:, 0]
        z = self.space.to_z(theta[self._log_prob(theta, y).topk(min(num_to_optimize, num_init)).indices])
        best, best_value = z.clone(), torch.full(z.shape[:-1], -math.inf, device=z.device)
        z.requires_grad_(True)
        optimizer = torch.optim.Adam([z], lr=lr)
        for step in range(steps + 1):
            with torch.enable_grad():
                value = self._log_prob_z(z, y)
                total = value.sum()
            better = value > best_value  # NaN (a point off the flow's range) is never better
            best, best_value = torch.where(better[:, None], z, best), torch.where(better, value, best_value)
            if step < steps:  # ascend: the gradient in z only, never in the flow's weights
                (gradient,) = torch.autograd.grad(total, z)
                z.grad = -gradient
                optimizer.step()
        return self.space.to_theta(best[best_value.argmax()])

    @contextlib.contextmanager
    def _progress_bars(self, show: bool | None):
        """Within it, a :class:`LikelihoodPosterior`'s slice-sampler bars are shown or hidden as ``show`` (sbi's
        ``show_progress_bars``) says; with ``None``, or for a posterior without bars, nothing changes."""
        if show is None or not hasattr(self, "progress"):
            yield
            return
        kept, self.progress = self.progress, bool(show)
        try:
            yield
        finally:
            self.progress = kept

    def _draw(self, shape: torch.Size, y: Tensor, generator: torch.Generator | None) -> Tensor:
        """Draws ``shape + (B, dim_theta)`` at the checked releases ``y (B, dim_s)``, refused if any is NaN/inf."""
        if shape.numel() == 0:
            return torch.empty(shape + (y.shape[0], self.task.dim_theta), device=self.space.device)
        z = self._sample_z(shape.numel(), y, generator)
        return self._finite(self.space.to_theta(z).reshape(shape + (y.shape[0], self.task.dim_theta)))

    def _log_prob(self, theta: Tensor, y: Tensor) -> Tensor:
        """Log density ``(...)`` of ``theta (..., B, dim_theta)`` at the checked releases ``y (B, dim_s)`` (with
        ``B = 1``, any ``theta (..., dim_theta)``); ``-inf`` outside the prior's support."""
        theta, inside = self._check_theta(theta)
        rows = theta.reshape(-1, y.shape[0], self.task.dim_theta)
        value = _in_chunks(lambda chunk: self._log_prob_z(self.space.to_z(chunk), y), rows, width=y.shape[0])
        return torch.where(inside, value.reshape(theta.shape[:-1]), -math.inf)

    @abc.abstractmethod
    def _sample_z(self, n: int, y: Tensor, generator: torch.Generator | None) -> Tensor:
        """``n`` draws ``(n, B, dim_unconstrained)`` in the unconstrained space at each checked release of ``y (B, dim_s)``."""

    @abc.abstractmethod
    def _log_prob_z(self, z: Tensor, y: Tensor) -> Tensor:
        """Log density of ``theta = T(z)`` in the prior's space (no Jacobian of ``T``) for ``z (..., dim_unconstrained)``
        on the flow's device at checked releases ``y (..., dim_s)`` broadcasting with it; shape of the broadcast
        batch, differentiable in ``z``."""

    def _finite(self, theta: Tensor) -> Tensor:
        """``theta (..., dim_theta)`` unchanged, or a ``RuntimeError`` if any draw holds a NaN or inf."""
        bad = ~torch.isfinite(theta).all(-1)
        if bad.any():
            raise RuntimeError(
                f"{self.method} posterior of task {self.task.name!r}: {int(bad.sum())} of {bad.numel()} draws are NaN/inf "
                "(a diverged or damaged flow); refusing to return them"
            )
        return theta

    def _releases(self, y: Tensor | None, single: bool, stacklevel: int = 4) -> Tensor:
        """``y`` (default: :attr:`default_x`) as checked releases ``(B, dim_s)`` on the flow's device; ``single``
        demands exactly one. Warns where the posterior is not valid at a given release (:meth:`_caveat`) and
        where a given release lies outside the training releases (:meth:`outside_training`)."""
        if y is None:
            if self.default_x is None:
                raise ValueError(
                    f"task {self.task.name!r} has no observed release; pass y= or call set_default_x"
                )
            return self.task.check_release(self.default_x).to(self.device, torch.get_default_dtype())
        y = self.task.check_release(y)
        if single and y.shape[0] != 1:
            raise ValueError(f"give one release of shape (1, {self.task.dim_s}), got {y.shape[0]} rows")
        if y.shape[0] == 0:
            raise ValueError(f"give at least one release of shape (B, {self.task.dim_s}), got none")
        caveat = self._caveat(y)
        if caveat:
            warnings.warn(caveat, stacklevel=stacklevel)
        outside = self.outside_training(y)
        if outside:
            warnings.warn(outside, ReleaseOutsideTraining, stacklevel=stacklevel)
        return y.to(self.device, torch.get_default_dtype())

    def _caveat(self, y: Tensor) -> str | None:
        """Why this posterior may not be valid at the checked releases ``y``, or ``None``."""
        return None

    def outside_training(self, y: Tensor, what: str = "the release") -> str | None:
        """One line about the checked releases ``y (B, dim_s)`` that lie outside the simulated releases this
        posterior was trained on, naming their coordinates (``task.release_names``) and how far out they are
        (:mod:`~dpsbi.inference.release_check`); ``None`` if none does or the posterior has no statistics."""
        if self.training_releases is None:
            return None
        return self.training_releases.warning(y, self.task.release_names, f"{self.method} posterior", what)

    def _conditions(self, y: Tensor | None, epsilon, single: bool) -> Tensor:
        """What the flow conditions on: the checked releases ``(B, dim_s)`` (:meth:`_releases`), for a posterior
        trained over an epsilon range with each one's ``log epsilon`` appended, ``(B, dim_s + 1)``."""
        y = self._releases(y, single, stacklevel=5)  # a caveat points at the caller of the public method
        return with_log_epsilon(y, self._epsilons(epsilon, y.shape[0]))

    def _epsilons(self, epsilon, batch: int) -> Tensor | None:
        """The checked epsilons ``(batch,)`` of ``batch`` releases (class docstring), or ``None`` for a posterior
        trained at one epsilon (where only that one is accepted)."""
        own = nominal_epsilon(self.task.mechanism)
        if epsilon is None and self._default_epsilon is not None:
            epsilon = self._default_epsilon
        if epsilon is not None:
            epsilon = epsilons(epsilon).double().flatten()
        if self.epsilon_range is None:
            if epsilon is not None and not torch.allclose(epsilon, torch.tensor(own).double(), rtol=1e-6):
                raise ValueError(
                    f"this {self.method} posterior was trained at the task's epsilon = {own:g} only, not at epsilon="
                    f"{float(epsilon[~torch.isclose(epsilon, torch.tensor(own).double(), rtol=1e-6)][0]):g}; "
                    "train with amortized=True, epsilon_range=(low, high) for others"
                )
            return None
        low, high = self.epsilon_range
        if epsilon is None:
            if not low * (1 - 1e-9) <= own <= high * (1 + 1e-9):
                raise ValueError(
                    f"this {self.method} posterior answers over epsilon in [{low:g}, {high:g}], which does not "
                    f"hold the task's epsilon = {own:g}: pass epsilon="
                )
            epsilon = torch.tensor([own], dtype=torch.float64)
        if epsilon.numel() == 1:
            epsilon = epsilon.expand(batch)
        elif epsilon.numel() != batch:
            raise ValueError(f"give one epsilon, or one per release ({batch}), got {epsilon.numel()}")
        outside = (epsilon < low * (1 - 1e-9)) | (epsilon > high * (1 + 1e-9))
        if outside.any():
            raise ValueError(
                f"epsilon={float(epsilon[outside][0]):g} lies outside the range [{low:g}, {high:g}] this "
                f"{self.method} posterior was trained for; refusing it"
            )
        return epsilon.to(self.device, torch.get_default_dtype())

    def _epsilon_options(self) -> dict:
        """The epsilon range for :meth:`options` (absent for a posterior trained at one epsilon: older files)."""
        return {} if self.epsilon_range is None else {"epsilon_range": list(self.epsilon_range)}

    def _check_theta(self, theta: Tensor) -> tuple[Tensor, Tensor]:
        """``theta`` as a float tensor on the flow's device and a mask of rows inside the prior's support; a
        ``ValueError`` for the wrong last dimension or a NaN."""
        theta = torch.as_tensor(theta, dtype=torch.get_default_dtype()).to(self.device)
        if theta.ndim == 0 or theta.shape[-1] != self.task.dim_theta:
            raise ValueError(f"theta must have shape (..., {self.task.dim_theta}), got {tuple(theta.shape)}")
        nan = torch.isnan(theta).any(-1)
        if nan.any():
            where = nan.nonzero()[0].tolist()
            raise ValueError(
                f"theta holds NaN at index {where}: {theta[tuple(where)].tolist()}; a density needs parameter values, "
                "drop or fill those rows"
            )
        inside = self.task.prior.support.check(theta.to(self.space.device)).to(self.device)
        return theta, inside.all(-1) if inside.ndim == theta.ndim else inside

    def _noise_generator(self, generator: torch.Generator | None, seed: int | None) -> torch.Generator | None:
        """The generator for this call. A seed starts a stream on the task's device, so that samples do
        not depend on the device the flow sits on."""
        return make_generator(seed, generator, device=self.space.device)

    def to_arviz(
        self,
        num_samples: int | None = None,
        y: Tensor | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        predictive: bool = False,
        *,
        epsilon: float | None = None,
    ):
        """Draws at release ``y`` and ``epsilon`` (class docstring) in ArviZ's format
        (:func:`dpsbi.diagnostics.posterior_inference_data`): an ``arviz.InferenceData`` under ArviZ 0.x, an
        xarray ``DataTree`` under ArviZ 1.x, with the same content. A posterior variable ``(chain, draw)`` per
        parameter, named after ``task.parameter_names``; the release as ``observed_data.release``; attributes
        ``method``, ``task``, ``epsilon``, ``release``, ``settings`` (JSON), ``sampler``, ``num_chains``. A
        :class:`LikelihoodPosterior` (SPLE) gives MCMC chains (:meth:`LikelihoodPosterior.sample_chains`), at
        most ``floor(sqrt(num_samples))`` of them so that each is at least as long as their count, as ArviZ
        expects (:func:`dpsbi.diagnostics.export_chains`: 44 chains of 46 draws for 2000 draws, where
        :meth:`sample` runs 4 draws in each of 500); a :class:`FlowPosterior` gives one chain of independent
        draws. ``num_samples`` defaults to 4000. ``predictive=True`` adds a release simulated from every draw
        as ``posterior_predictive.release`` (for ArviZ's posterior predictive plots). ``seed`` or
        ``generator`` fix the draws as in :meth:`sample`."""
        from ..diagnostics import posterior_inference_data

        if num_samples is not None:
            num_samples = check_integer("num_samples", num_samples)
        return posterior_inference_data(self, num_samples, y, generator, seed, predictive, epsilon)

    # ---- saving -------------------------------------------------------------------------------------
    def metadata(self) -> dict:
        """JSON-able description from which :func:`load_posterior` rebuilds this posterior."""
        return {
            "kind": self.kind,
            "method": self.method,
            "task": posterior_file.task_spec(self.task),
            "identity": identity(self.task),
            "simulator": {k: v.tolist() for k, v in simulator_probe(self.task).items()},
            "y_obs": None if self.task.y_obs is None else self.task.y_obs.tolist(),
            "default_x": None if self._default_x is None else self._default_x.tolist(),
            "default_epsilon": self._default_epsilon,
            "flow": {
                "config": self.flow.config.to_dict(),
                "dim": self.flow.dim,
                "context_dim": self.flow.context_dim,
                "epsilon_context": self.flow.epsilon_context,
                "stabilizing_maps": list(self.flow.stabilizing_maps),
            },
            "options": self.options(),
            "training_releases": None if self.training_releases is None else self.training_releases.to_dict(),
        }

    def options(self) -> dict:
        return {}

    def save(self, path: str | os.PathLike) -> None:
        """Write the flow's ``state_dict`` and JSON metadata (no pickled objects) to ``path``, sealed with a checksum."""
        posterior_file.write(path, self.metadata(), self.flow.state_dict())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(method={self.method!r}, task={self.task.name!r}, device={self.device})"


class FlowPosterior(Posterior):
    """``q(theta | y)``: a posterior flow in the unconstrained space, ``theta = T(z)`` with its log-det.

    ``amortized`` says whether it was trained on prior draws (valid at any release) or sequentially
    for ``task.y_obs`` (then other releases trigger a warning).
    """

    kind = "flow"

    def __init__(
        self,
        task: Task,
        flow: ConditionalFlow,
        method: str,
        amortized: bool,
        epsilon_range: tuple[float, float] | None = None,
        training_releases: TrainingReleases | None = None,
    ) -> None:
        super().__init__(task, flow, method, epsilon_range, training_releases)
        self.amortized = bool(amortized)

    def options(self) -> dict:
        return {"amortized": self.amortized, **self._epsilon_options()}

    def _caveat(self, y: Tensor) -> str | None:
        if self.amortized or (
            self.task.y_obs is not None
            and torch.allclose(y.cpu(), self.task.y_obs.cpu().to(y.dtype).expand_as(y))
        ):
            return None
        return (
            f"this {self.method} posterior was trained sequentially for task.y_obs; at another release it is "
            "not a valid posterior (train with amortized=True for one valid at every release)"
        )

    def proposal(
        self, y: Tensor | None = None, *, epsilon: float | None = None, defensive: float = 0.1
    ) -> DefensiveProposal:
        """This flow at release ``y`` (default: :attr:`default_x`) and ``epsilon`` mixed with the prior at weight
        ``defensive``: a torch ``Distribution`` over ``(dim_theta,)`` for importance sampling the exact private
        posterior, ``dpsbi.baselines.corrected(posterior, n, y=y, epsilon=e)``
        (:mod:`dpsbi.inference.proposal`). The release and epsilon are checked now."""
        self._conditions(y, epsilon, single=True)
        return DefensiveProposal(self, y, epsilon, defensive)

    @torch.no_grad()
    def sample_and_log_prob(
        self,
        sample_shape=(),
        y: Tensor | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        *,
        epsilon: float | None = None,
        x: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """:meth:`sample`'s draws ``sample_shape + (dim_theta,)`` (the same ones under the same seed) and their
        :meth:`log_prob` ``sample_shape``, in about the time of :meth:`sample` alone: each density comes from the
        pass that draws it (equal to :meth:`log_prob`'s to float rounding), except where rounding ``theta`` to its
        dtype moved it off the point drawn (at the edge of the prior's support, where ``log_prob`` of the rounded
        ``theta`` can be many nats away, or ``-inf``): there it is :meth:`log_prob`'s own."""
        shape = _sample_shape(sample_shape)
        y = self._conditions(_release_or_x(y, x, "sample_and_log_prob"), epsilon, single=True)
        if shape.numel() == 0:
            empty = torch.empty(shape + (self.task.dim_theta,), device=self.space.device)
            return empty, empty[..., 0]
        z, log_q = self._z_and_log_prob(shape.numel(), y, self._noise_generator(generator, seed))
        z, log_q = z[:, 0], log_q[:, 0] - self.device_space.log_abs_det(z[:, 0])
        theta = self._finite(self.space.to_theta(z))
        moved = ~torch.isclose(self.space.to_z(theta), z, rtol=1e-5, atol=1e-5).all(-1)
        if moved.any():
            log_q[moved] = self._log_prob(theta[moved], y)
        return theta.reshape(shape + theta.shape[-1:]), log_q.reshape(shape)

    def _sample_z(self, n: int, y: Tensor, generator: torch.Generator | None) -> Tensor:
        return self._z_and_log_prob(n, y, generator)[0]

    def _z_and_log_prob(self, n: int, y: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """Draws ``z (n, B, dim)`` at each checked release of ``y (B, dim_s)`` and the flow's log densities of them
        ``(n, B)`` (of ``z``: without :meth:`_log_prob_z`'s log-determinant of ``theta = T(z)``). All the base noise
        first, then mapped chunk by chunk: the chunking changes the draws by float round-off at most (matrix
        products round differently with the number of rows), never the noise."""
        noise = torch.randn(
            n, y.shape[0], self.flow.dim, generator=generator, device=generator.device if generator else None
        )
        return _in_chunks(
            lambda chunk: self.flow.sample_and_log_prob(chunk.to(self.device), y), noise, width=y.shape[0]
        )

    def _log_prob_z(self, z: Tensor, y: Tensor) -> Tensor:
        return self.flow.log_prob(z, y) - self.device_space.log_abs_det(z)


class LikelihoodPosterior(Posterior):
    """``prior(theta) q(y | theta)`` for a likelihood flow ``q``, sampled by slice sampling in the
    unconstrained space; ``log_prob`` is unnormalized (exact up to a constant in ``theta``).

    ``dequantized``: ``q`` was trained on lattice releases spread over their cells (``y + h v``, see
    :func:`~dpsbi.inference.losses.dequantized`), and the likelihood of a release ``y`` is ``q``'s mass on
    its cell, ``h^dim mean_k q(y + h v_k | theta)`` over ``cell_points`` fixed points ``v_k``
    (:func:`~dpsbi.qmc.cell_points`): a probability, summing to one over the lattice.
    """

    kind = "likelihood"

    def __init__(
        self,
        task: Task,
        flow: ConditionalFlow,
        method: str,
        mcmc: MCMCSettings | dict | None = None,
        progress: bool = False,
        dequantized: bool = False,
        cell_points: int = 8,
        epsilon_range: tuple[float, float] | None = None,
        training_releases: TrainingReleases | None = None,
    ) -> None:
        super().__init__(task, flow, method, epsilon_range, training_releases)
        self.mcmc = MCMCSettings.coerce(mcmc)
        self.progress = progress
        self.dequantized, self.cell_points = bool(dequantized), int(cell_points)
        if self.dequantized and not lattice_cells(task.mechanism)[0]:
            raise ValueError(
                f"a dequantized likelihood needs a lattice mechanism; {task.mechanism!r} has none"
            )

    def options(self) -> dict:
        return {
            "mcmc": self.mcmc.to_dict(),
            "dequantized": self.dequantized,
            "cell_points": self.cell_points,
            **self._epsilon_options(),
        }

    def log_likelihood_z(self, y: Tensor, z: Tensor) -> Tensor:
        """``log q(y | z)`` for releases ``y (..., dim_s)`` broadcasting with ``z (..., dim)``; with a dequantized
        flow, the log of its mass on ``y``'s lattice cell. For a likelihood trained over an epsilon range, ``y``
        holds each release's ``log epsilon`` as a last coordinate (:meth:`_conditions`), which joins ``z`` in the
        flow's context."""
        if self.epsilon_range is not None:
            dim = self.task.dim_s
            shape = torch.broadcast_shapes(y.shape[:-1], z.shape[:-1])
            y = y.expand(shape + y.shape[-1:])
            z = torch.cat([z.expand(shape + z.shape[-1:]), y[..., dim:].to(z)], -1)
            y = y[..., :dim]
        if not self.dequantized:
            return self.flow.log_prob(y, z)
        _, spacing = lattice_cells(self.task.mechanism)  # the coordinates on a lattice: all, or some blocks'
        dim = y.shape[-1]
        v = cell_points(
            self.cell_points, len(spacing), device=y.device, dtype=y.dtype
        )  # (K, lattice coordinates)
        shape = torch.broadcast_shapes(y.shape[:-1], z.shape[:-1])
        cells = dequantized(y.expand(shape + (dim,)).unsqueeze(-2), self.task.mechanism, v)  # (..., K, dim)
        log_q = self.flow.log_prob(cells, z.expand(shape + z.shape[-1:]).unsqueeze(-2))  # (..., K)
        lattice = self.task.mechanism.lattice  # one spacing for every coordinate, or None where they differ
        volume = dim * math.log(lattice) if lattice is not None else sum(math.log(h) for h in spacing)
        return torch.logsumexp(log_q, -1) - math.log(self.cell_points) + volume

    def log_density_z(self, z: Tensor, y: Tensor) -> Tensor:
        """Unnormalized log posterior in ``z``: ``log p_z(z) + log q(y | z)``, shape ``z.shape[:-1]``."""
        return self.device_space.log_prior_z(z) + self.log_likelihood_z(y, z)

    def _sample_z(self, n: int, y: Tensor, generator: torch.Generator | None) -> Tensor:
        """``(n, B, dim)`` draws at the ``B`` rows of ``y``: the torch sampler runs every release's chains in one
        run; sbi's numpy sampler (older files) one run per release."""
        if self.mcmc.method == "elliptical_slice":
            return self._slice_sample(n, y, generator)
        return torch.cat([self._slice_sample(n, y[b : b + 1], generator) for b in range(y.shape[0])], dim=1)

    @torch.no_grad()
    def sample_chains(
        self,
        num_samples: int,
        y: Tensor | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        *,
        epsilon: float | None = None,
        num_chains: int | None = None,
    ) -> Tensor:
        """The MCMC chains behind :meth:`sample` at release ``y`` (and ``epsilon``, as in :meth:`sample`): ``(num_chains, ceil(num_samples / num_chains),
        dim_theta)``. Under the same ``seed`` (or generator state), their draws taken step by step across the
        chains (``chains.transpose(0, 1).reshape(-1, dim_theta)``) and cut to ``num_samples`` rows are
        ``sample((num_samples,))``'s; a longer run continues the same chains (a shorter run's draws are the
        first of each chain). ``num_chains`` (default ``mcmc.num_chains``) runs that many chains instead, with
        the posterior's other MCMC settings (``to_arviz`` runs fewer, longer chains than :meth:`sample`).
        Raises ``RuntimeError`` rather than return a NaN/inf draw."""
        if int(num_samples) < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        mcmc = self.mcmc if num_chains is None else dataclasses.replace(self.mcmc, num_chains=num_chains)
        y = self._conditions(y, epsilon, single=True)
        info: dict = {}
        self._slice_sample(int(num_samples), y, self._noise_generator(generator, seed), info, mcmc)
        return self._finite(self.space.to_theta(info["draws"][:, 0])).transpose(0, 1)  # draws: (S, 1, C, dim)

    def _slice_sample(
        self,
        n: int,
        y: Tensor,
        generator: torch.Generator | None,
        info: dict | None = None,
        mcmc: MCMCSettings | None = None,
    ) -> Tensor:
        """``n`` draws ``(n, B, dim)`` at the releases ``y (B, dim_s)``: slice sampling from ``num_chains`` chains
        per release, started among ``init_candidates`` prior draws (shared by the releases) resampled by each
        release's density, as ``mcmc`` (default: the posterior's settings) says; ``info`` as in
        :func:`~dpsbi.inference.mcmc.slice_sample_groups`."""
        mcmc = self.mcmc if mcmc is None else mcmc
        run_seed = draw_seed(generator)
        with seeded_global_streams(run_seed):
            candidates = self.space.to_z(self.task.prior.sample((mcmc.init_candidates,))).to(self.device)
        init_gen = torch.Generator(device=self.device).manual_seed(run_seed)
        releases = len(y)
        log_density = _in_chunks(lambda chunk: self.log_density_z(chunk[:, None], y), candidates, releases)
        init = resample_init(candidates, log_density.T, mcmc.num_chains, init_gen)  # (B, C, dim)
        width = candidates.std(0)  # the prior's spread: wider than the posterior's, as the sampler likes it

        def density(z: Tensor, group: Tensor) -> Tensor:  # z (m, k, dim) at the releases y[group] -> (m, k)
            rows = torch.arange(len(z), device=z.device)
            return _in_chunks(lambda i: self.log_density_z(z[i], y[group[i], None]), rows, z.shape[1])

        return slice_sample_groups(density, init, n, mcmc, run_seed, width, self.progress, info=info)

    def _log_prob_z(self, z: Tensor, y: Tensor) -> Tensor:
        return self.task.prior.log_prob(self.space.to_theta(z.to(self.space.device))).to(
            self.device
        ) + self.log_likelihood_z(y, z)


_KINDS = {cls.kind: cls for cls in (FlowPosterior, LikelihoodPosterior)}


def _release_or_x(y, x, method: str, required: bool = False):
    """The release given as dpsbi's ``y`` or under sbi's name ``x`` (``None`` if neither, unless ``required``);
    a ``TypeError`` if both are given with different values."""
    if x is not None and y is not None:
        a, b = (
            torch.atleast_2d(torch.as_tensor(v, dtype=torch.get_default_dtype()).detach().cpu())
            for v in (y, x)
        )
        if a.shape != b.shape or not torch.equal(a, b):
            raise TypeError(
                f"{method}: give the release as y= or as sbi's x=, not both with different values"
            )
    if required and x is None and y is None:
        raise TypeError(f"{method} needs the releases (B, dim_s): pass y= (or sbi's x=)")
    return y if x is None else x


def _sample_shape(sample_shape) -> torch.Size:
    """``sample_shape`` (a tuple of integers >= 0, or one integer ``n`` for ``(n,)``) as a ``torch.Size``, or a
    ``ValueError`` naming it."""

    def count(d) -> bool:
        return isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0

    try:
        dims = (sample_shape,) if count(sample_shape) else tuple(sample_shape)
    except TypeError:
        dims = None
    if dims is None or not all(count(d) for d in dims):
        raise ValueError(f"sample_shape must be a tuple of integers >= 0, e.g. (2000,), got {sample_shape!r}")
    return torch.Size(int(d) for d in dims)


def _in_chunks(fn: Callable[[Tensor], Tensor | tuple[Tensor, ...]], rows: Tensor, width: int = 1):
    """``fn`` applied to ``rows (n, ...)`` in chunks, the results ``(chunk, ...)`` (or each of a tuple of them)
    concatenated to ``(n, ...)``. A row stands for ``width`` flow rows (one per release), so a chunk holds at most
    ``max(CHUNK_ROWS, width)`` flow rows."""
    parts = [fn(chunk) for chunk in rows.split(max(1, CHUNK_ROWS // width))]
    return tuple(map(torch.cat, zip(*parts))) if isinstance(parts[0], tuple) else torch.cat(parts)


def _as_trained(task: Task, recorded: dict | None) -> Task:
    """``task`` rebuilt with its amortized recipe's ``task_options`` where the file records a task built with
    them (SIR's default amortized fit trains on its tau-leaping model: :meth:`dpsbi.SPPE.resolve_arguments`), else
    ``task``."""
    options = task.amortized_recipe.get("task_options", {})
    kwargs = (recorded or {}).get("kwargs", {})
    if options and all(key in kwargs and kwargs[key] == value for key, value in options.items()):
        return tasks.with_options(task, options)
    return task


def _at_release(task: Task, recorded: Tensor, path, given: bool) -> Task:
    """A copy of ``task`` whose ``y_obs`` is the release ``recorded`` in the posterior file at ``path`` (its other
    fields shared); where ``task`` was ``given`` by the caller and holds another release, a warning names both. The
    copy's confidential summary ``s_obs`` is kept only where the release is the task's own."""
    recorded = task.check_release(recorded)
    same = task.y_obs is not None and torch.equal(task.y_obs, recorded.to(task.y_obs.dtype))
    if given and task.y_obs is not None and not same:
        warnings.warn(
            f"{path} was trained at the release y_obs = {_release_text(recorded)}, not the given task's "
            f"{_release_text(task.y_obs)}: the loaded posterior samples at the file's release unless given y= (the task "
            "passed in is left as it was)",
            stacklevel=3,
        )
    copied = copy.copy(task)
    copied.y_obs = recorded
    if not same:
        copied.s_obs = None
    return copied


def _release_text(release: Tensor) -> str:
    """A release ``(1, d)`` as ``[v1, v2, ...]``, each to 6 significant digits."""
    return "[" + ", ".join(f"{v:.6g}" for v in release.flatten().tolist()) + "]"


def load_posterior(
    path: str | os.PathLike, device: torch.device | str | None = None, task: Task | None = None
) -> Posterior:
    """Rebuild a posterior written by ``Posterior.save``, with its flow on ``device`` (default: torch's
    default device). Only tensors and plain containers are read (``weights_only=True``), and only from an
    intact file (checksum). The task is rebuilt from its recorded name and arguments unless ``task`` is
    given; either way its model must match the one recorded in the file, or a ``ValueError`` names every
    differing field, and its simulator must reproduce the recorded probe (``"was simulated by another
    simulator"``; a file written before the probe was recorded loads with a warning). The posterior's task holds
    the release the file was trained at as ``y_obs``: a given ``task`` is copied for it, never changed, and a
    warning says so where its own ``y_obs`` differs (the posterior samples at the file's release by default). A
    release set by ``set_default_x`` and an epsilon set by ``set_default_epsilon`` before saving are the defaults
    again."""
    device = torch.device(device) if device is not None else torch.get_default_device()
    meta, state = posterior_file.read(path, device, _KINDS)
    which = "the given task"
    given = task is not None
    if task is None:
        if meta["task"] is None:
            raise ValueError(
                f"{path} does not record how to build its task (not made by dpsbi.tasks.load); pass task="
            )
        task = tasks.load(meta["task"]["name"], **meta["task"]["kwargs"])
        which = "the task as dpsbi.tasks.load builds it now"
    else:
        task = _as_trained(task, meta["task"])
    posterior_file.check_identity(path, meta["identity"], task, which)
    posterior_file.check_simulator(path, meta.get("simulator"), task)
    if meta["y_obs"] is not None:
        task = _at_release(task, torch.tensor(meta["y_obs"], dtype=torch.get_default_dtype()), path, given)
    spec = meta["flow"]
    flow = ConditionalFlow.blank(
        FlowSettings.recorded(spec["config"]),
        spec["dim"],
        spec["context_dim"],
        spec.get("epsilon_context", False),  # absent from files written before release_scaling existed
        spec.get("stabilizing_maps", ()),  # absent from files written before stabilize_release existed
    )
    try:
        flow.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"{path}: the stored weights do not fit the recorded flow ({error})") from None
    posterior = _KINDS[meta["kind"]](
        task, flow.to(device), meta["method"], **meta["options"], training_releases=meta["training_releases"]
    )
    if meta.get("default_x") is not None:  # absent from files written before set_default_x existed
        posterior.set_default_x(torch.tensor(meta["default_x"], dtype=torch.get_default_dtype()))
    if (
        meta.get("default_epsilon") is not None
    ):  # absent from files written before set_default_epsilon existed
        posterior.set_default_epsilon(meta["default_epsilon"])
    return posterior
