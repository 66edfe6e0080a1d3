"""The sequential round loop shared by SPPE, SPLE and NaiveNPE: simulate from the current proposal, keep
every simulation, train the flow on all of them, checkpoint, repeat."""

from __future__ import annotations

import abc
import contextlib
import copy
import inspect
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from ..files import exclusive
from ..mechanisms.base import check_flag, check_integer
from ..mechanisms.epsilon import (
    at_epsilons,
    epsilon_limits,
    epsilon_range_problem,
    log_uniform,
    nominal_epsilon,
)
from ..seeds import check_seed, seeded_global_streams
from ..tasks import Task
from ..tasks.identity import check_simulator, identity, simulator_probe
from . import checkpoint
from .flows import ConditionalFlow, FlowSettings
from .losses import with_log_epsilon
from .parameters import ParameterSpace
from .posterior import Posterior
from .posterior_file import task_spec
from .progress import FitProgress
from .release_check import ReleaseOutsideTraining, TrainingReleases
from .seeding import derive_seed
from .settings import Settings
from .training import (
    DEVICE_FIELDS,
    Loss,
    StepKind,
    TrainingSettings,
    fit_flow,
    planned_steps,
    shaped_steps,
    training_device,
    training_threads,
)
from .widening import ReleaseRatio, Widening, ancillary_directions, fit_release_ratio, widened_loss

#: Stored parameters re-simulated on resumption to check that the simulator is the one that made the data.
PROBE_ROWS = 2
#: Release numbers drawn at once where a fit draws a release of every simulation (the release check, the flow's
#: z-scoring: :meth:`SequentialEstimator.releases`): a discrete Gaussian release of census tables' 46 cells over a
#: range of rho holds ~26 float64 temporaries a number, so a round of a million in one call needed ~25 GB
#: (docs/RESULTS.md, "SIR's amortized default").
RELEASE_CHUNK_NUMBERS = 2**21

#: ``on_round_end(round_number, posterior, num_simulations)``, after every finished round; ``round_number``
#: counts from 1, as ``history``'s ``"round"`` does.
RoundCallback = Callable[[int, Posterior, int], None]
#: Draws of the posterior at ``y_obs`` (under a fixed seed) compared between rounds by ``stop_when_stable``.
STABILITY_DRAWS = 2000


@dataclass(frozen=True)
class Budget(Settings):
    """What a fit may spend, beside its ``rounds``: ``simulations`` in all (never exceeded: the round that would
    pass it is cut to the simulations left, and a fit with fewer than a round's minimum left stops) and
    ``seconds`` of wall time over its rounds (simulating, training and the stop rule, summed over the rounds in
    ``history``, so kept across resumptions). Before each round after the first, a fit that expects the round to end
    past ``seconds`` (taking as long as the previous round did) stops instead: it does not overshoot by a
    round; it can overshoot by the misestimate (a round slower than the one before), and its first round always
    runs. ``None``: no limit."""

    label: ClassVar[str] = "budget"
    simulations: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.simulations is not None and (isinstance(self.simulations, bool) or int(self.simulations) < 2):
            raise ValueError(f"budget simulations must be an integer >= 2 or None, got {self.simulations!r}")
        if self.seconds is not None and not 0 < float(self.seconds) < math.inf:
            raise ValueError(f"budget seconds must be a finite number > 0 or None, got {self.seconds!r}")

    @property
    def limited(self) -> bool:
        return self.simulations is not None or self.seconds is not None


#: The main paper's training (docs/DESIGN.md): Adam at constant 5e-4, early stopping after 20 epochs without
#: improvement of the validation loss, no epoch or step limit (see :meth:`SequentialEstimator.paper`).
PAPER_TRAINING = {
    "lr": 5e-4,
    "lr_schedule": "constant",
    "patience": 20,
    "max_epochs": None,
    "max_steps": None,
}


def _held_rows(stored: Tensor, theta: Tensor) -> Tensor:
    """Boolean ``(n,)``: whether each row of ``theta (n, d)`` equals, bit for bit, a row of ``stored (N, d)``."""
    stored, theta = stored.detach().cpu().contiguous(), theta.detach().cpu().to(stored.dtype).contiguous()
    key = np.dtype((np.void, stored.dtype.itemsize * stored.shape[-1]))
    return torch.from_numpy(np.isin(theta.numpy().view(key).ravel(), stored.numpy().view(key).ravel()))


def unexpected_keywords(estimator: str, keywords: dict) -> str:
    """The error for keywords an estimator does not take; a training setting is pointed to ``training=``."""
    training = {k: v for k, v in keywords.items() if k in TrainingSettings.field_names()}
    message = f"{estimator} got unexpected keyword arguments {sorted(keywords)}"
    if training:
        message += (
            f"; training settings go in training=dict({', '.join(f'{k}={v!r}' for k, v in training.items())})"
        )
    return message


class SequentialEstimator(abc.ABC):
    """Base of the neural estimators. Subclasses say what the flow models (:meth:`flow_data`), which loss
    trains it in a round (:meth:`loss`), and which posterior it gives (:meth:`posterior`).

    Rounds are numbered from 1 (``history``, ``on_round_end``, messages). A round draws ``sims_per_round``
    parameters from the prior (the first round) or from the current posterior at ``task.y_obs``, simulates
    their confidential summaries, holds out ``training.validation_fraction`` of them for validation, and
    trains the flow (continuing from the previous round's weights) on all simulations so far. With ``checkpoint_dir`` the state after each round
    is written there and :meth:`run` resumes from the last finished round with the stored simulations, after
    checking that the checkpoint was made by the same settings and the same task (prior, mechanism, epsilon,
    release, and the simulator: a few stored parameters are re-simulated with their stored seed).
    ``on_round_end(round_number, posterior, num_simulations)`` is called after each round (``round_number``
    from 1).

    Arguments (each estimator's defaults are measured to reach the reference fast on a CPU; :meth:`paper`
    gives the paper's settings): ``rounds`` x ``sims_per_round`` simulations;
    ``inner_samples`` releases per stored summary at every step, from scrambled Sobol points
    (``qmc=True``, a power of two) or plain uniforms. The grouped settings, each an instance or a dict of
    its fields: ``flow`` (:class:`~dpsbi.inference.flows.FlowSettings`: the flow's architecture) and
    ``training`` (:class:`~dpsbi.inference.training.TrainingSettings`: optimizer, early stopping, validation
    split, device). ``seed`` fixes every random draw; ``progress`` shows bars.

    Amortized by design (``amortized=True``, SPPE and SPLE): every round draws from the prior (no proposal at
    ``y_obs``, which may be ``None``), the budget is ``rounds x sims_per_round``, and the posterior is valid at
    any release. ``epsilon_range=(low, high)`` (needs ``amortized=True``): every simulation also draws its own
    epsilon, log-uniformly in the range (kept with it, a column ``"epsilon"`` of :attr:`data`), its releases are
    drawn by the task's mechanism re-calibrated there (``with_epsilon``, vectorized over the rows:
    :func:`~dpsbi.mechanisms.epsilon.at_epsilons`; a family without it is refused), and the flow conditions on
    ``log epsilon`` too: the posterior takes ``epsilon=`` per release (:class:`~dpsbi.inference.posterior.Posterior`).
    ``epsilon_margin=m`` (>= 1; ``None``: 1, or the task's amortized recipe's in SPPE) trains over ``(low / m,
    high * m)`` so that the range's ends lie inside what the flow has seen; the posterior is valid over
    ``epsilon_range`` as asked (at a range's end SIR's flow missed, from inside it was at the reference:
    docs/RESULTS.md, "SIR's flow alone: a context-shifted flow").

    Fits that end when they are done: ``budget`` (a :class:`Budget` or a dict of its fields: ``simulations``,
    ``seconds``) caps what the fit spends beside ``rounds``; ``stop_when_stable=tol`` ends the fit after a round
    whose posterior at ``y_obs`` changed by less than ``tol`` from the previous round's. The change is
    measured on :data:`STABILITY_DRAWS` draws under a fixed seed, in the unconstrained space, as the largest
    over parameters of ``|mean_r - mean_{r-1}| / sd_{r-1}`` and ``|log(sd_r / sd_{r-1})|``: the shift of each
    marginal's location in its own standard deviations, and its relative change of spread (a sequential fit
    mostly shrinks). It is cheap (a flow posterior maps the same base noise through both rounds' flows, so the
    statistic carries no Monte Carlo noise; SPLE's MCMC draws carry ~0.03-0.05 of it at 2000 draws: keep
    ``tol`` above that, e.g. 0.1), scale-free, and it moves with the first two moments that dominate the C2ST
    of near-Gaussian posteriors; a C2ST between successive rounds would need a classifier per round and has a
    noise floor of its own. Every round's ``history`` entry holds its ``"change"`` (with the rule on) and the
    last one a ``"stop"`` reason: ``"rounds"``, ``"simulations"``, ``"seconds"`` or ``"stable"``
    (also :attr:`stop_reason`). The defaults (no budget, no stop rule) are unchanged.
    """

    method: ClassVar[str]
    #: Whether the flow's context is the release (a posterior flow), else its input (a likelihood flow).
    release_is_context: ClassVar[bool] = True
    #: Training settings in which this estimator's defaults differ from :class:`TrainingSettings`'; a ``training``
    #: dict is applied over them, a ``TrainingSettings`` instance replaces them.
    training_defaults: ClassVar[dict] = {}
    #: The main paper's budget (with :data:`PAPER_TRAINING`): 10 rounds of 1000 simulations, M = 32 RQMC releases.
    paper_settings: ClassVar[dict] = {"rounds": 10, "sims_per_round": 1000, "inner_samples": 32, "qmc": True}

    #: Constructor arguments that belong to a run rather than to the method (dpsbi-run sets them itself).
    run_arguments: ClassVar[tuple[str, ...]] = ("seed", "checkpoint_dir", "progress", "on_round_end")
    #: Constructor arguments that this estimator accepts and ignores (left out of :meth:`defaults`).
    unused_arguments: ClassVar[tuple[str, ...]] = ()
    #: Arguments that are grouped settings, by class: given as an instance or a dict of its fields.
    settings_groups: ClassVar[dict[str, type[Settings]]] = {
        "flow": FlowSettings,
        "training": TrainingSettings,
    }

    @classmethod
    def defaults(cls, paper: bool = False) -> dict:
        """Every setting of ``cls(task)`` (``paper=True``: of ``cls.paper(task)``) with its value, as plain data:
        the constructor's keyword defaults (the class's own, then the keyword-only ones it passes on to its base),
        each settings group (:attr:`settings_groups`) as a dict of its fields; ``training`` without its
        device fields, which belong to the machine (dpsbi-run's ``trainer`` group). The single source of
        dpsbi-run's ``dpsbi/configs/method`` files and ``paper`` preset (:mod:`dpsbi.experiment.config`)."""
        skip = {"self", "task", *cls.run_arguments, *cls.unused_arguments}
        values: dict = {}
        for klass in cls.__mro__:
            if "__init__" not in klass.__dict__:
                continue
            parameters = inspect.signature(klass.__dict__["__init__"]).parameters.values()
            for p in parameters:
                passed_on = klass is cls or p.kind is p.KEYWORD_ONLY
                if passed_on and p.default is not p.empty and p.name not in skip:
                    values.setdefault(p.name, p.default)
            if not any(p.kind is p.VAR_KEYWORD for p in parameters) or klass is SequentialEstimator:
                break
        if paper:
            values.update(cls.paper_settings)
        training = PAPER_TRAINING if paper else cls.training_defaults
        for name, group in cls.settings_groups.items():
            values[name] = group.coerce(None, training if group is TrainingSettings else None).to_dict()
        for field in DEVICE_FIELDS:
            values["training"].pop(field)
        return values

    @classmethod
    def paper(cls, task: Task, **kwargs) -> SequentialEstimator:
        """The estimator with the main paper's settings exactly (:attr:`paper_settings`, :data:`PAPER_TRAINING`);
        ``kwargs`` override them, a ``training`` dict key by key (``training=dict(accelerator="gpu")``).

        What it costs: an open-ended round trains until 20 epochs pass without improvement on all simulations
        so far, and each SPPE step evaluates the flow ``batch x 32 x atoms`` = 32 000 times (1.4 s on one CPU
        core). On one core a regression fit extrapolates to about 10 hours (docs/RESULTS.md); the paper reports
        18 minutes for SIR on GPUs. Use it on a GPU, or to reproduce the paper; the defaults are for a CPU."""
        training = TrainingSettings.coerce(kwargs.pop("training", None), PAPER_TRAINING)
        return cls(task, **{**cls.paper_settings, **kwargs, "training": training})

    def __init__(
        self,
        task: Task,
        rounds: int,
        sims_per_round: int,
        inner_samples: int,
        qmc: bool,
        *,
        flow: FlowSettings | dict | None = None,
        training: TrainingSettings | dict | None = None,
        seed: int = 0,
        checkpoint_dir: str | os.PathLike | None = None,
        progress: bool = True,
        on_round_end: RoundCallback | None = None,
        amortized: bool = False,
        epsilon_range: tuple[float, float] | None = None,
        epsilon_margin: float | None = None,
        budget: Budget | dict | None = None,
        stop_when_stable: float | None = None,
        **unknown,
    ) -> None:
        if unknown:
            raise TypeError(unexpected_keywords(type(self).__name__, unknown))
        rounds, inner_samples = check_integer("rounds", rounds), check_integer("inner_samples", inner_samples)
        sims_per_round = check_integer("sims_per_round", sims_per_round, minimum=2)
        qmc, progress = check_flag("qmc", qmc), check_flag("progress", progress)
        if qmc and inner_samples & (inner_samples - 1):
            raise ValueError(f"RQMC (qmc=True) needs inner_samples a power of two, got {inner_samples}")
        self.training = TrainingSettings.coerce(training, self.training_defaults)
        if round(self.training.validation_fraction * sims_per_round) >= sims_per_round:
            raise ValueError(
                f"validation_fraction={self.training.validation_fraction} leaves no training data of {sims_per_round} simulations"
            )
        task.validate()
        self.amortized = check_flag("amortized", amortized)
        if rounds > 1 and task.y_obs is None and not self.amortized:
            raise ValueError(
                f"sequential rounds propose at task.y_obs, but task {task.name!r} has none; "
                "amortized=True draws every round from the prior"
            )
        self.epsilon_range = self._check_epsilon_range(task, epsilon_range, self.amortized)
        self.epsilon_margin = 1.0 if epsilon_margin is None else float(epsilon_margin)
        if not 1 <= self.epsilon_margin < math.inf:
            raise ValueError(f"epsilon_margin must be a factor >= 1, got {epsilon_margin}")
        if self.epsilon_margin != 1 and self.epsilon_range is None:
            raise ValueError(f"epsilon_margin={epsilon_margin} widens epsilon_range, but the fit has none")
        limits = None if self.epsilon_range is None else epsilon_limits(task.mechanism)
        if limits is not None:
            low, high = self.training_epsilon_range
            if not limits[0] < low < high < limits[1]:
                raise ValueError(
                    f"the fit trains over epsilon {low:g}-{high:g} (epsilon_range widened by epsilon_margin), "
                    f"but {task.mechanism!r} can be re-calibrated per row only at epsilon between {limits[0]:.3g} "
                    f"and {limits[1]:.3g} (its epsilon_limits); choose a range inside it"
                )
        self.budget = Budget.coerce(budget)
        self.stop_when_stable = None if stop_when_stable is None else float(stop_when_stable)
        if self.stop_when_stable is not None:
            self._check_stop_rule(task)
        self.task, self.space = task, ParameterSpace(task)
        self.rounds, self.sims_per_round = rounds, sims_per_round
        chosen = {
            "batch_size": self.default_batch_size(self.amortized, self.sims_per_round),
            "weight_decay": self.default_weight_decay(self.amortized),
        }
        left = {name: value for name, value in chosen.items() if getattr(self.training, name) is None}
        self.training = replace(self.training, **left)
        self.inner_samples, self.qmc = inner_samples, qmc
        self.flow_settings, self.seed = FlowSettings.coerce(flow), check_seed(seed)
        self.checkpoint_path = checkpoint.path(checkpoint_dir) if checkpoint_dir is not None else None
        self.progress, self.on_round_end = progress, on_round_end
        self.flow: ConditionalFlow | None = None
        self.data: dict[str, Tensor] = {}
        self.history: list[dict] = []
        #: ``{"theta", "s"}`` of :data:`PROBE_ROWS` stored rows re-simulated with the probe seed (in checkpoints).
        self.probe: dict[str, Tensor] | None = None
        #: ``(theta, s)`` handed in by :meth:`append_simulations` for the next round.
        self.pending: tuple[Tensor, Tensor] | None = None
        #: Mean and sd ``(2, dim)`` of the last round's posterior draws at ``y_obs`` (``stop_when_stable``).
        self._stable_reference: Tensor | None = None
        #: The release check's releases of each round's simulations (by round number), the last statistics
        #: ``(num_simulations, TrainingReleases)``, and whether this run has checked y_obs.
        self._round_releases: dict[int, Tensor] = {}
        self._training_releases: tuple[int, TrainingReleases] | None = None
        self._y_obs_checked = False
        #: ``widening`` (set by the estimators that widen) and its releases' ratio, fitted on first use.
        self.widening: Widening | None = None
        self.ancillary: Tensor | None = None
        self._release_ratio: ReleaseRatio | None = None
        if self.budget.simulations is not None and self._round_size() is None:
            raise ValueError(
                f"budget simulations={self.budget.simulations} leaves no first round (at least one training and "
                f"one validation simulation, validation_fraction={self.training.validation_fraction})"
            )

    @staticmethod
    def default_batch_size(amortized: bool, sims_per_round: int) -> int:
        """``training.batch_size`` where it is ``None``: :class:`TrainingSettings`' 100, whatever the fit."""
        return TrainingSettings.batch_size

    @staticmethod
    def default_weight_decay(amortized: bool) -> float:
        """``training.weight_decay`` where it is ``None``: :class:`TrainingSettings`' 1e-4, whatever the fit."""
        return TrainingSettings.weight_decay

    @staticmethod
    def _check_epsilon_range(task: Task, epsilon_range, amortized: bool) -> tuple[float, float] | None:
        """``epsilon_range`` as ``(low, high)`` with ``0 < low < high``, or ``None``; refuses (one line) a range
        without ``amortized=True`` and a mechanism family that cannot be re-calibrated per simulation."""
        if epsilon_range is None:
            return None
        if not amortized:
            raise ValueError(
                "epsilon_range needs amortized=True: proposals at y_obs would make the posterior valid at one "
                "release and one epsilon only"
            )
        try:
            low, high = (float(v) for v in epsilon_range)
        except (TypeError, ValueError):
            raise ValueError(f"epsilon_range must be a pair (low, high), got {epsilon_range!r}") from None
        if not 0 < low < high < math.inf:
            raise ValueError(f"epsilon_range must satisfy 0 < low < high < inf, got ({low:g}, {high:g})")
        problem = epsilon_range_problem(task.mechanism)
        if problem:
            raise ValueError(
                f"epsilon_range needs a mechanism re-calibrated at every simulation's epsilon: {problem}"
            )
        at_epsilons(task.mechanism, torch.tensor([low, high]))  # the family takes both ends (classic: < 1)
        return low, high

    def _check_stop_rule(self, task: Task) -> None:
        """``stop_when_stable`` needs a positive tolerance and a posterior at ``task.y_obs`` (at the task's epsilon)."""
        if not self.stop_when_stable > 0:
            raise ValueError(
                f"stop_when_stable must be a tolerance > 0 (e.g. 0.05), got {self.stop_when_stable}"
            )
        if task.y_obs is None:
            raise ValueError(
                f"stop_when_stable compares the posterior at task.y_obs between rounds, but task {task.name!r} has none"
            )
        if self.epsilon_range is not None:
            low, high = self.epsilon_range
            if not low <= nominal_epsilon(task.mechanism) <= high:
                raise ValueError(
                    f"stop_when_stable compares the posterior at the task's epsilon = {nominal_epsilon(task.mechanism):g}, "
                    f"outside epsilon_range ({low:g}, {high:g})"
                )

    @property
    def stop_reason(self) -> str | None:
        """Why the fit stopped after its last round (``"rounds"``, ``"simulations"``, ``"seconds"``, ``"stable"``),
        or ``None`` before it has."""
        return self.history[-1].get("stop") if self.history else None

    # ---- what subclasses define ---------------------------------------------------------------------
    @abc.abstractmethod
    def flow_data(
        self, z: Tensor, s: Tensor, generator: torch.Generator, epsilon: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Example ``(inputs, context)`` of the flow, from which its z-scoring is computed; ``epsilon (n,)``: each
        simulation's epsilon, with ``epsilon_range``."""

    def tensors(self, z: Tensor, s: Tensor, rounds: Tensor) -> tuple[Tensor, ...]:
        """The training tensors of each simulation, from its parameters ``z``, summaries ``s`` and round number
        ``rounds (n,)`` (from 1) (a batch of them is what :meth:`loss` receives; with
        ``epsilon_range`` each simulation's epsilon follows them, as the batch's last tensor)."""
        return z, s

    def releases(self, s: Tensor, generator: torch.Generator, epsilon: Tensor | None = None) -> Tensor:
        """One release of each summary ``s (n, input_dim)``: the task's mechanism, or with ``epsilon (n,)`` the
        mechanism re-calibrated at each row's epsilon; vectorized, :data:`RELEASE_CHUNK_NUMBERS` numbers at a time
        (the same releases as one call: the generator runs on from chunk to chunk)."""
        size = max(1, RELEASE_CHUNK_NUMBERS // max(1, s.shape[-1]))
        if s.shape[0] > size:
            return torch.cat(
                [
                    self.releases(
                        s[i : i + size], generator, None if epsilon is None else epsilon[i : i + size]
                    )
                    for i in range(0, s.shape[0], size)
                ]
            )
        if epsilon is None:
            return self.task.release(s, generator=generator)
        return at_epsilons(self.task.mechanism, epsilon.unsqueeze(-1)).sample(s, generator=generator)

    def simulated_releases(
        self, s: Tensor, generator: torch.Generator, epsilon: Tensor | None = None
    ) -> Tensor:
        """The releases ``(n, dim_s)`` the flow sees for summaries ``s`` (the release check's training releases):
        one release of each (:meth:`releases`); NaiveNPE's are the summaries themselves."""
        return self.releases(s, generator, epsilon)

    def widened_loss(self, log_prob: Callable[[nn.Module, Tensor, Tensor, Tensor | None], Tensor]) -> Loss:
        """The plain loss ``-log_prob(flow, z, y, epsilon)`` ``(N, M)`` on widened releases, weighted back
        (:func:`~dpsbi.inference.widening.widened_loss`)."""
        mechanism, m, qmc = self.task.mechanism, self.inner_samples, self.qmc
        with_epsilon = self.epsilon_range is not None
        return widened_loss(mechanism, m, qmc, self.widening, self.release_ratio(), log_prob, with_epsilon)

    def release_ratio(self) -> ReleaseRatio:
        """The widened releases' marginal ratio (``widening``), fitted once per fit on the first round's training
        summaries under a seed derived from the fit's (so a resumed fit refits the same), on the training device;
        read along :attr:`ancillary`'s directions for a likelihood flow, whose optimum only a weight of the
        release's ancillary part leaves exact (found on those summaries where no probe found them, and checked
        against the mechanism's noise at the largest epsilon)."""
        if self._release_ratio is None:
            rows = (self.data["round"] == 1) & ~self.data["validation"]
            epsilon = self.data["epsilon"][rows] if self.epsilon_range is not None else None
            s = self.data["s"][rows]
            if not self.release_is_context:
                check = torch.Generator(device=s.device).manual_seed(
                    derive_seed(self.seed, "ancillary check")
                )
                self.ancillary = ancillary_directions(
                    self.task.mechanism, s, self.smallest_noise(), check, self.ancillary
                )
            generator = torch.Generator(device=s.device).manual_seed(derive_seed(self.seed, "widening"))
            with training_threads(self.training, s.device):
                ratio = fit_release_ratio(
                    self.task.mechanism, s, epsilon, self.widening, generator, self.ancillary
                )
            self._release_ratio = ratio.to(training_device(self.training))
        return self._release_ratio

    def smallest_noise(self) -> float | None:
        """The epsilon of the smallest noise trained on: the training range's top, or ``None`` (the task's)."""
        epsilon_range = self.training_epsilon_range
        return None if epsilon_range is None else epsilon_range[1]

    def training_releases(self) -> TrainingReleases:
        """The release check's statistics (:mod:`~dpsbi.inference.release_check`) of one release of every stored
        simulation (:meth:`simulated_releases`, each round's under its own fixed seed, drawn once per round),
        computed on the data's device once per number of simulations (after a round's simulating, never in its
        training steps)."""
        n = self.num_simulations
        if self._training_releases is None or self._training_releases[0] != n:
            rounds = self.data["round"]
            numbers = sorted({int(r) for r in rounds.unique().tolist()})
            for number in numbers:
                if number not in self._round_releases or self._round_releases[number].shape[0] != int(
                    (rounds == number).sum()
                ):
                    self._round_releases[number] = self._round_releases_of(number)
            y = torch.cat([self._round_releases[number] for number in numbers])
            self._training_releases = (n, TrainingReleases.of(y, self._release_bounds()))
        return self._training_releases[1]

    @torch.no_grad()
    def _round_releases_of(self, number: int) -> Tensor:
        """One release of each stored simulation of round ``number`` (from 1), under that round's seed."""
        rows = self.data["round"] == number
        s = self.data["s"][rows]
        epsilon = self.data["epsilon"][rows] if "epsilon" in self.data else None
        generator = torch.Generator(device=s.device).manual_seed(
            derive_seed(self.seed, number, "release check")
        )
        return self.simulated_releases(s, generator, epsilon)

    def _check_y_obs(self) -> None:
        """Once per :meth:`run`, after its first round's simulations: warn (one line) if ``task.y_obs`` lies
        outside the releases simulated so far."""
        if self._y_obs_checked or self.task.y_obs is None:
            return
        self._y_obs_checked = True
        message = self.training_releases().warning(
            self.task.y_obs, self.task.release_names, self.method, f"task {self.task.name!r}'s y_obs"
        )
        if message:
            warnings.warn(message, ReleaseOutsideTraining, stacklevel=5)

    @staticmethod
    def context(x: Tensor, epsilon: Tensor | None) -> Tensor:
        """``x (n, k)`` with ``log epsilon`` appended as a last column where simulations carry an epsilon."""
        return with_log_epsilon(x, epsilon)

    @abc.abstractmethod
    def loss(self, round_index: int) -> Loss:
        """The loss of the round at ``round_index``: a 0-based index (the first round is 0), the round's
        number minus 1."""

    @abc.abstractmethod
    def posterior(self, round_index: int) -> Posterior:
        """The posterior after the round at ``round_index`` (0-based), on a copy of the current flow."""

    def options(self) -> dict:
        """Method-specific settings (part of the checkpoint's fingerprint)."""
        return {}

    def step_work(self, round_index: int) -> float:
        """What a training step of the round at ``round_index`` (0-based) evaluates, in flow evaluations (batch
        rows x releases per row; SPPE's atomic rounds x atoms). The fit's time estimate
        (:mod:`~dpsbi.inference.progress`) prices rounds of equal work at one measured step time and times a
        probe of each other kind; ``compile="auto"`` decides on the CPU per kind (:meth:`step_kind`)."""
        return self.training.batch_size * self.inner_samples

    def step_kind(self, round_index: int, train_rows: int) -> StepKind:
        """The kind of step of the round at ``round_index`` (0-based, training on ``train_rows`` rows): its
        :meth:`step_work`, and the steps of its shape the fit plans of that work over all its rounds
        (:func:`~dpsbi.inference.training.shaped_steps`; the finished rounds at what their stored training rows
        planned, early stopping aside, so that every round of a kind sees one total; the later ones on the rows
        :meth:`planned_rows` gives them, a stop rule or a budget of seconds aside; ``None`` where one is
        open-ended). ``compile="auto"`` decides on it on the CPU
        (:func:`~dpsbi.inference.training.compiles`)."""
        work = self.step_work(round_index)
        numbers = self.data["round"][~self.data["validation"]] if self.data else None
        rows = [(i, int((numbers <= i + 1).sum())) for i in range(round_index)]
        rows += [(round_index, train_rows), *self.planned_rows(round_index, train_rows)]
        steps = [shaped_steps(self.training, n) for j, n in rows if self.step_work(j) == work]
        return StepKind(work, None if None in steps else sum(steps))

    def proposal_draws(self, round_index: int, posterior: Posterior, n: int, seed: int) -> Tensor:
        """The ``n`` parameters ``(n, dim_theta)`` of the round at ``round_index`` (0-based, so at least 1: not
        the first round): the posterior at ``task.y_obs`` (subclasses may propose otherwise), drawn under
        ``seed``. Not called when ``amortized``."""
        return posterior.sample((n,), seed=seed)

    # ---- the loop -----------------------------------------------------------------------------------
    @property
    def num_simulations(self) -> int:
        return int(self.data["theta"].shape[0]) if self.data else 0

    def run(self) -> Posterior:
        """Train the remaining rounds and return the final posterior. While it runs, ``checkpoint_dir`` is
        locked: a second estimator writing there fails at once instead of mixing the two runs."""
        lock = (
            exclusive(
                self.checkpoint_path.with_suffix(".lock"),
                f"checkpoint directory {self.checkpoint_path.parent}",
                timeout=0,
            )
            if self.checkpoint_path
            else contextlib.nullcontext()
        )
        with lock:
            return self._run()

    def _run(self) -> Posterior:
        start = len(self.history) or self._resume()
        self._drop_pending_if_stored()
        posterior = self.posterior(start - 1) if start else None
        if start and self.stop_when_stable is not None and self._stable_reference is None:
            self._stable_reference = self.stability_summary(posterior)
        with FitProgress(self, start, self.progress) as progress:
            for index in range(start, self.rounds):
                if index and self._stops_before():
                    break
                posterior = self._round(index, posterior, progress)
        return posterior

    def _stops_before(self) -> bool:
        """Whether the fit stops before its next round under the current settings (a resumed fit may have a larger
        budget than the one that stopped it): the reason is kept in the last round's ``history`` entry."""
        reason = self._stop_reason()
        if reason is None:
            self.history[-1].pop("stop", None)
            return False
        self.history[-1]["stop"] = reason
        return True

    def _stop_reason(self) -> str | None:
        """Why no round should follow the last finished one (:class:`SequentialEstimator`'s docstring), or ``None``."""
        last = self.history[-1]
        if len(self.history) >= self.rounds:
            return "rounds"
        if self.budget.simulations is not None and self.pending is None and self._round_size() is None:
            return "simulations"
        if self.budget.seconds is not None:
            spent = sum(entry["seconds"] for entry in self.history)
            if spent + last["seconds"] > self.budget.seconds:  # the next round, expected to take as long
                return "seconds"
        if self.stop_when_stable is not None and last.get("change") is not None:
            if last["change"] < self.stop_when_stable:
                return "stable"
        return None

    def planned_rounds(self, round_index: int, train_rows: int) -> list[tuple[int, int | None]]:
        """The rounds after the one at ``round_index`` (0-based, training on ``train_rows`` rows) that ``rounds`` and
        ``budget.simulations`` leave, each with its planned steps (``None``: open-ended), as they would run
        without a stop rule: ``[(round index, steps), ...]`` (the fit's time estimate)."""
        return [
            (j, planned_steps(self.training, rows)[1])
            for j, rows in self.planned_rows(round_index, train_rows)
        ]

    def planned_rows(self, round_index: int, train_rows: int) -> list[tuple[int, int]]:
        """The rounds after the one at ``round_index`` (0-based, training on ``train_rows`` rows) that ``rounds`` and
        ``budget.simulations`` leave, each with the training rows it will have: ``[(round index, rows), ...]``."""
        plan, n, rows = [], self.num_simulations, train_rows
        for j in range(round_index + 1, self.rounds):
            size = self.sims_per_round
            if self.budget.simulations is not None:
                size = min(size, int(self.budget.simulations) - n)
            held_out = max(1, round(self.training.validation_fraction * size))
            if size < 2 or held_out >= size:
                break
            n, rows = n + size, rows + size - held_out
            plan.append((j, rows))
        return plan

    def _round_size(self) -> int | None:
        """The simulations the next round draws: ``sims_per_round``, cut to what ``budget.simulations`` leaves;
        ``None`` when that is too few for a round (one training and one validation simulation)."""
        n = self.sims_per_round
        if self.budget.simulations is not None:
            n = min(n, int(self.budget.simulations) - self.num_simulations)
        if n < 2 or max(1, round(self.training.validation_fraction * n)) >= n:
            return None
        return n

    def stability_summary(self, posterior: Posterior) -> Tensor:
        """Mean and sd ``(2, dim)`` (float64, CPU) of :data:`STABILITY_DRAWS` draws of ``posterior`` at ``task.y_obs``
        under a fixed seed, in the unconstrained space (``stop_when_stable``)."""
        theta = posterior.sample((STABILITY_DRAWS,), seed=derive_seed(self.seed, "stable"))
        z = self.space.to_z(theta.to(self.space.device)).double().cpu()
        return torch.stack([z.mean(0), z.std(0)])

    @staticmethod
    def stability_change(before: Tensor, after: Tensor) -> float:
        """The change between two rounds' :meth:`stability_summary`: the largest over parameters of the mean's
        shift in the earlier sd and of ``|log|`` of the ratio of sds."""
        sd = before[1].clamp_min(1e-300)
        shift = ((after[0] - before[0]).abs() / sd).max()
        spread = torch.log(after[1].clamp_min(1e-300) / sd).abs().max()
        return float(torch.maximum(shift, spread))

    def _round(self, index: int, posterior: Posterior | None, progress: FitProgress) -> Posterior:
        """Simulate and train the round at ``index`` (0-based: its number is ``index + 1``) from the previous
        round's ``posterior``; returns the new one. A round either finishes (its simulations and weights kept,
        the checkpoint written) or leaves the estimator as it found it: after an exception or Ctrl-C,
        :meth:`run` again redoes the round from the same state (the same simulations, appended ones included,
        and the same result), never storing any twice."""
        began, rows, pending = time.perf_counter(), self.num_simulations, self.pending
        weights = None if self.flow is None else copy.deepcopy(self.flow.state_dict())
        progress.begin_round(index)
        try:
            self._simulate(index, posterior)
            self._check_y_obs()
            if self.flow is None:
                self.flow = self._build_flow()
            train = self._dataset(False)
            if self.progress:
                progress.probe(train)
            progress.begin_training(train[0].shape[0])
            fit = fit_flow(
                self.flow,
                self.loss(index),
                train,
                self._dataset(True),
                self.round_training(),
                derive_seed(self.seed, index, "fit"),
                f"{self.method} round {index + 1}",
                progress.epoch,
                self.step_kind(index, train[0].shape[0]),
            )
            posterior = self.posterior(index)
            stability = None if self.stop_when_stable is None else self.stability_summary(posterior)
        except BaseException:
            self.data = {k: v[:rows] for k, v in self.data.items()} if rows else {}
            self.pending = pending
            if weights is None:
                self.flow = None
            else:
                self.flow.load_state_dict(weights)
            raise
        entry = {
            "round": index + 1,
            "num_simulations": self.num_simulations,
            "seconds": time.perf_counter() - began,
            **fit,
        }
        progress.end_round(entry)
        if stability is not None:
            if self._stable_reference is not None:
                entry["change"] = self.stability_change(self._stable_reference, stability)
            self._stable_reference = stability
        self.history.append(entry)
        reason = self._stop_reason()
        if reason is not None:
            entry["stop"] = reason
        self._save_checkpoint()
        if self.on_round_end is not None:
            self.on_round_end(index + 1, posterior, self.num_simulations)
        return posterior

    def append_simulations(self, theta: Tensor, s) -> SequentialEstimator:
        """Hand the next round parameters ``theta (n, dim_theta)`` and their confidential summaries ``s (n,
        dim_s)`` (tensor or numpy array) simulated outside dpsbi (another program, a cluster job), used in
        place of ``task.simulate``. ``theta`` must be draws from that round's proposal, :meth:`propose`: the
        prior for the first round, the current posterior at ``task.y_obs`` after. Returns ``self``, so that
        ``SPPE(task, rounds=1).append_simulations(theta, s).run()`` reads as in sbi. Calls add up: every
        call adds its rows to the next round, until it runs. Rows that are exactly rows already waiting for
        the next round (a notebook cell run twice, or batches that overlap) are not added again, with a warning; rerunning a script
        against a checkpoint that already holds these simulations does not add them twice either."""
        theta = self.task.check_theta(theta)
        s = self.task.check_summary(theta, s, "appended summaries have")
        if self.pending is not None:
            held = _held_rows(self.pending[0], theta)
            if held.any():
                warnings.warn(
                    f"{int(held.sum())} of these {theta.shape[0]} simulations are already appended for the next "
                    "round; not adding them twice",
                    stacklevel=2,
                )
                if held.all():
                    return self
                theta, s = theta[~held], s[~held]
            theta, s = (
                torch.cat([self.pending[0], theta]),
                torch.cat([self.pending[1], s.to(self.pending[1])]),
            )
        self.pending = (theta, s)
        return self

    def propose(self, n: int, seed: int = 0) -> Tensor:
        """``n`` parameters ``(n, dim_theta)`` from the next round's proposal (prior, or the posterior at
        ``task.y_obs`` after a finished round; always the prior when ``amortized``), to simulate elsewhere and hand
        to :meth:`append_simulations`."""
        finished = self._resume() if not self.history else len(self.history)
        if not finished or self.amortized:
            with seeded_global_streams(seed):
                return self.task.prior.sample((n,))
        return self.proposal_draws(finished, self.posterior(finished - 1), n, seed).to(self.space.device)

    def _simulate(self, index: int, posterior: Posterior | None) -> None:
        """The parameters and summaries of the round at ``index`` (0-based; appended ones, or drawn from the
        proposal and simulated), with their validation rows and round number, added to the stored simulations."""
        if self.pending is not None:
            (theta, s), self.pending = self.pending, None
            if (
                self.budget.simulations is not None
                and self.num_simulations + theta.shape[0] > self.budget.simulations
            ):
                raise ValueError(
                    f"the {theta.shape[0]} appended simulations would bring the fit to "
                    f"{self.num_simulations + theta.shape[0]}, past budget simulations={self.budget.simulations}"
                )
            generator = torch.Generator(device=theta.device).manual_seed(
                derive_seed(self.seed, index, "validation")
            )
        else:
            theta, s, generator = self._draw_and_simulate(index, posterior)
        n = theta.shape[0]
        validation = torch.zeros(n, dtype=torch.bool, device=theta.device)
        validation[
            torch.randperm(n, generator=generator, device=theta.device)[
                : max(1, round(self.training.validation_fraction * n))
            ]
        ] = True
        new = {
            "theta": theta,
            "s": s,
            "round": torch.full((n,), index + 1, device=theta.device),  # the round's number, from 1
            "validation": validation,
        }
        if self.epsilon_range is not None:  # each simulation's own epsilon, whatever made the simulation
            epsilon_generator = torch.Generator(device=theta.device).manual_seed(
                derive_seed(self.seed, index, "epsilon")
            )
            new["epsilon"] = log_uniform(*self.training_epsilon_range, n, epsilon_generator, theta.device)
        self.data = {k: torch.cat([self.data[k], v]) if self.data else v for k, v in new.items()}

    def _draw_and_simulate(
        self, index: int, posterior: Posterior | None
    ) -> tuple[Tensor, Tensor, torch.Generator]:
        """``sims_per_round`` parameters (fewer where the simulation budget cuts the round) from the prior (no
        ``posterior`` yet, or ``amortized``) or the posterior at ``y_obs``, their simulated summaries, and the
        simulation's generator (it goes on to pick the validation rows), all seeded by ``(seed, index)`` (the
        round's 0-based index)."""
        n = (
            self._round_size() or self.sims_per_round
        )  # _run stops before a round the budget leaves no room for
        if posterior is None or self.amortized:
            with seeded_global_streams(derive_seed(self.seed, index, "prior")):
                theta = self.task.prior.sample((n,))
        else:
            theta = self.proposal_draws(index, posterior, n, derive_seed(self.seed, index, "propose")).to(
                self.space.device
            )
        generator = torch.Generator(device=theta.device).manual_seed(
            derive_seed(self.seed, index, "simulate")
        )
        return theta, self.task.simulate(theta, generator), generator

    def _drop_pending_if_stored(self) -> None:
        """Forget appended simulations that a resumed checkpoint already holds (a rerun of the same script)."""
        if self.pending is None or not self.data:
            return
        new = ~_held_rows(self.data["theta"], self.pending[0])
        self.pending = (self.pending[0][new], self.pending[1][new]) if new.any() else None

    def _build_flow(self) -> ConditionalFlow:
        with seeded_global_streams(derive_seed(self.seed, "flow")):
            generator = torch.Generator(device=self.space.device).manual_seed(derive_seed(self.seed, "flow"))
            inputs, context = self.flow_data(
                self.space.to_z(self.data["theta"]), self.data["s"], generator, self.data.get("epsilon")
            )
            bounds = self._release_bounds()
            return ConditionalFlow(
                self.flow_settings, inputs, context, self._epsilon_context, bounds, self._stabilizing_maps()
            )

    def _release_bounds(self) -> Tensor | None:
        """``(2, dim_s)``: what a posterior flow clamps releases to (FlowSettings ``clamp_release``,
        :meth:`~dpsbi.tasks.Task.release_bounds`), or ``None``."""
        clamps = self.release_is_context and self.flow_settings.clamp_release
        return self.task.release_bounds() if clamps else None

    def _stabilizing_maps(self) -> tuple[str | None, ...]:
        """The release coordinates' variance-stabilizing maps that a posterior flow conditioned on ``log epsilon``
        applies (FlowSettings ``stabilize_release``, :attr:`~dpsbi.mechanisms.Mechanism.stabilizing_maps`);
        ``()`` for other flows or where the mechanism names none."""
        maps = self.task.mechanism.stabilizing_maps
        applies = self._epsilon_context and self.flow_settings.stabilize_release and any(maps)
        return tuple(maps) if applies else ()

    def round_training(self) -> TrainingSettings:
        """The next round's training settings: the fit's, with ``compile=False`` where an earlier round's
        ``compile="auto"`` gave way to uncompiled steps (its compiler failed or got a gradient wrong: recompiling
        would fail again, minutes spent and one more warning, each round; a resumed fit reads it from its
        history). Such rounds are not compiled; on CUDA they may still replay as CUDA graphs (``cuda_graph``)."""
        fell_back = any(entry.get("compile_fell_back") for entry in self.history)
        if fell_back and self.training.compile == "auto":
            return replace(self.training, compile=False)
        return self.training

    @property
    def training_epsilon_range(self) -> tuple[float, float] | None:
        """The epsilons the simulations are drawn over: ``epsilon_range`` widened by ``epsilon_margin`` at each
        end (``None`` without a range)."""
        if self.epsilon_range is None:
            return None
        low, high = self.epsilon_range
        return low / self.epsilon_margin, high * self.epsilon_margin

    @property
    def _epsilon_context(self) -> bool:
        """Whether the flow's context is a release with ``log epsilon`` appended (a posterior flow with
        ``epsilon_range``): its release is then z-scored at its own epsilon (FlowSettings ``release_scaling``)."""
        return self.release_is_context and self.epsilon_range is not None

    def _dataset(self, validation: bool) -> tuple[Tensor, ...]:
        """The training (or validation) rows' tensors (:meth:`tensors`, then each row's epsilon with
        ``epsilon_range``)."""
        rows = self.data["validation"] == validation
        z = self.space.to_z(self.data["theta"][rows])
        tensors = self.tensors(z, self.data["s"][rows], self.data["round"][rows])
        if self.epsilon_range is not None:
            tensors = (*tensors, self.data["epsilon"][rows])
        return tensors

    # ---- checkpoints --------------------------------------------------------------------------------
    def fingerprint(self) -> dict:
        """Everything that determines the run's result (JSON-able); a checkpoint must match it to resume.
        The simulator cannot be written down: resuming re-simulates stored rows instead
        (:func:`~dpsbi.tasks.identity.check_simulator`)."""
        task = {**identity(self.task), "spec": task_spec(self.task)}
        task["y_obs"] = None if self.task.y_obs is None else self.task.y_obs.tolist()
        return {
            "method": self.method,
            "task": task,
            "rounds": self.rounds,
            "sims_per_round": self.sims_per_round,
            "inner_samples": self.inner_samples,
            "qmc": self.qmc,
            # whether the map applies, not the setting: a checkpoint written before it existed resumes where it would not
            "flow": {**self.flow_settings.to_dict(), "stabilize_release": bool(self._stabilizing_maps())},
            "training": {k: v for k, v in self.training.to_dict().items() if k not in ("threads", "compile")},
            "seed": self.seed,
            **(
                {"amortized": True} if self.amortized else {}
            ),  # keys absent by default: older checkpoints resume
            **({"epsilon_range": list(self.epsilon_range)} if self.epsilon_range is not None else {}),
            **({"epsilon_margin": self.epsilon_margin} if self.epsilon_margin != 1 else {}),
            **({"budget": self.budget.to_dict()} if self.budget.limited else {}),
            **({"stop_when_stable": self.stop_when_stable} if self.stop_when_stable is not None else {}),
            **self.options(),
        }

    def _save_checkpoint(self) -> None:
        if self.checkpoint_path is None:
            return
        if self.probe is None:  # empty for a task without a simulator (all simulations appended)
            self.probe = simulator_probe(self.task, self.data["theta"][:PROBE_ROWS], self._probe_seed)
        checkpoint.write(
            self.checkpoint_path, self.fingerprint(), self.history, self.flow, self.data, self.probe
        )

    def _resume(self) -> int:
        """Load the checkpoint if there is one; returns the number of finished rounds. Refuses (``ValueError``
        naming the file and what differs) a corrupt file, another run's checkpoint, one with more finished
        rounds than ``rounds``, and one whose simulations the task's simulator no longer reproduces."""
        path = self.checkpoint_path
        if path is None or not path.exists():
            return 0
        payload = checkpoint.read(path, self.space.device)
        differ = checkpoint.mismatch(payload["fingerprint"], self.fingerprint())
        if differ:
            raise ValueError(
                f"{path} belongs to a different run ({'; '.join(differ)}); use another checkpoint_dir or the same settings"
            )
        history = payload["history"]
        if len(history) > self.rounds:
            raise ValueError(
                f"{path} holds {len(history)} finished rounds, more than rounds={self.rounds}; "
                f"ask for rounds >= {len(history)} or use another checkpoint_dir"
            )
        self.probe = payload["probe"]
        if self.probe and self.task.simulator is not None:
            check_simulator(
                self.task,
                self.probe["theta"],
                self.probe["s"],
                self._probe_seed,
                str(path),
                "use another checkpoint_dir",
            )
        self.data, self.history = payload["data"], history
        self.flow = ConditionalFlow.blank(
            self.flow_settings, *payload["flow_shape"], self._epsilon_context, self._stabilizing_maps()
        )
        self.flow.load_state_dict(payload["flow"])
        # where a finished round leaves it, so that the next round's proposal samples as in an uninterrupted run
        self.flow.to(training_device(self.training))
        return len(history)

    @property
    def _probe_seed(self) -> int:
        """The seed of the checkpoint's simulator probe, derived from the run's seed."""
        return derive_seed(self.seed, "probe")

    def _posterior_flow(self) -> ConditionalFlow:
        return copy.deepcopy(self.flow).eval()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(task={self.task.name!r}, rounds={self.rounds}, sims_per_round={self.sims_per_round})"
