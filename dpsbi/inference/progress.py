"""The one progress bar of a fit, and its estimate of when the whole fit ends.

The rounds of a fit do not cost the same: SPPE's atomic rounds evaluate the flow ``atoms`` times per pair (on one
CPU core they take ~5x its first round), later rounds train on more simulations, and they draw their parameters
from a posterior (SPLE's by MCMC). A bar over rounds cannot say when the fit ends. This one counts what is left in
gradient steps, which the settings fix in advance (:func:`~dpsbi.inference.training.planned_steps`), each priced
at the seconds a step of its kind takes (a kind: the step's work, :meth:`SequentialEstimator.step_work
<dpsbi.inference.estimator.SequentialEstimator.step_work>`):

- measured in this fit: the current round's rate, updated at every epoch from its second epoch on (a compiled
  round spends its first epoch's first steps compiling: 1-3 minutes on a CPU, no price of a step), and each
  finished round's;
- for a kind that has not run yet (SPPE's atomic rounds, during its first round), the measured kind's seconds
  scaled by a probe that times a few steps of every kind of the fit on a copy of the flow, side by side
  (:func:`~dpsbi.inference.training.step_seconds`; ~0.2 s at SPPE's defaults, once per run).

A round's work besides training (drawing and simulating its parameters, building its posterior) is priced at
what it took in the last finished round that drew its parameters the same way (from the prior, or from the
posterior at ``y_obs``), else at what any round's took. The estimate is an upper bound where ``stop_when_stable``
or early stopping (``patience``) ends the fit or a round sooner; the rounds that ``budget`` leaves are counted.
Host-side timers and counts only: nothing is read from the training device.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from .seeding import derive_seed
from .training import planned_steps, step_seconds

if TYPE_CHECKING:
    from .estimator import SequentialEstimator

#: The bar's resolution: its position is the fraction of the fit's expected time spent, in these units.
BAR_UNITS = 1000


class FitProgress:
    """The bar of one :meth:`~dpsbi.inference.estimator.SequentialEstimator.run` (from round index ``start``)
    and its remaining-time estimate (the module's docstring); ``show=False`` keeps it silent. The estimator
    reports each round's start (:meth:`begin_round`), its training's start (:meth:`begin_training`), every epoch
    (:meth:`epoch`) and its end (:meth:`end_round`)."""

    def __init__(self, estimator: SequentialEstimator, start: int, show: bool) -> None:
        self.estimator, self.show = estimator, show
        #: Seconds of a training step by step work: measured, and probed (on a copy of the flow).
        self.measured: dict[float, float] = {}
        self.probed: dict[float, float] = {}
        #: Seconds of a round's work besides training, by whether it draws from the prior.
        self.other: dict[bool, float] = {}
        for entry in estimator.history:
            self._learn(entry["round"] - 1, entry)
        self.began = time.perf_counter()
        self.index = start
        self.round_began = self.train_began = self.began
        self.status = ""
        #: ``(round index, planned steps)`` of the current round and those after it (:meth:`begin_training`).
        self.plan: list[tuple[int, int | None]] = []
        self.steps_done, self.per_epoch, self.training, self.probe_seconds = 0, 1, False, 0.0
        #: ``(clock, steps done)`` at the end of the round's first epoch, from which its rate is measured.
        self.settled: tuple[float, int] | None = None
        self.bar = tqdm(
            total=BAR_UNITS,
            # the line's text is the bar's description: tqdm would put ", " before a postfix
            bar_format=estimator.method + " fit: {percentage:3.0f}%|{bar:12}| {desc}",
            disable=not show or start >= estimator.rounds,
        )

    def __enter__(self) -> FitProgress:
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None:  # the fit ended (after its last round, or stopped by its budget or stop rule)
            self.plan = []
            self.bar.n = self.bar.total
            self._render("done")
        self.bar.close()

    # ---- what the estimator reports -----------------------------------------------------------------
    def begin_round(self, index: int) -> None:
        self.index, self.round_began, self.steps_done, self.training = index, time.perf_counter(), 0, False
        self.probe_seconds = 0.0
        self._render("simulating")

    def begin_training(self, train_rows: int) -> None:
        """The round's training starts on ``train_rows`` rows: plan its steps and those of the rounds after it."""
        self.per_epoch, steps = planned_steps(self.estimator.training, train_rows)
        self.plan = [(self.index, steps), *self.estimator.planned_rounds(self.index, train_rows)]
        self.train_began, self.training, self.settled = time.perf_counter(), True, None
        self._render("training")

    def epoch(self, epoch: int, train_loss: float, val_loss: float) -> None:
        """An epoch ended (the values are already on the host): the current kind's rate is re-measured, over the
        steps after the round's first epoch once there are some."""
        now, self.steps_done = time.perf_counter(), epoch * self.per_epoch
        if self.settled is None:
            self.settled = (now, self.steps_done)
            rate = (now - self.train_began) / self.steps_done
        else:
            since, steps = self.settled
            rate = (now - since) / (self.steps_done - steps)
        self.measured[self.work(self.index)] = rate
        self._render(f"epoch {epoch}, loss {train_loss:.3f} (validation {val_loss:.3f})")

    def end_round(self, entry: dict) -> None:
        """The round finished: its training seconds go into ``entry`` (``"train_seconds"``) and, where its epochs
        measured it, its step's rate (``"step_seconds"``, so that a resumed fit prices steps as this one does); its
        rates are kept."""
        entry["train_seconds"] = time.perf_counter() - self.train_began
        if self.settled is not None:
            entry["step_seconds"] = self.measured[self.work(self.index)]
        self._learn(self.index, entry, self.probe_seconds)

    # ---- the probe --------------------------------------------------------------------------------
    def probe(self, train) -> None:
        """Time a step of every kind of the remaining rounds (and of one measured kind, for the ratio) when some
        kind has not run yet and the fit has more than one; ``train``: the current round's training tensors."""
        estimator = self.estimator
        rounds = range(self.index, estimator.rounds)
        kinds = {self.work(j): j for j in rounds}
        for entry in estimator.history:
            kinds.setdefault(self.work(entry["round"] - 1), entry["round"] - 1)
        if len(kinds) < 2 or all(kind in self.measured for kind in kinds):
            return
        for kind, j in kinds.items():
            if kind not in self.probed:
                seed = derive_seed(estimator.seed, j, "probe steps")
                began = time.perf_counter()
                self.probed[kind] = step_seconds(
                    estimator.flow, estimator.loss(j), train, estimator.training, seed
                )
                self.probe_seconds += time.perf_counter() - began

    # ---- the estimate -----------------------------------------------------------------------------
    def work(self, index: int) -> float:
        return float(self.estimator.step_work(index))

    def seconds_per_step(self, index: int) -> float | None:
        """The expected seconds of a step of the round at ``index``: measured for its kind, else a measured kind's
        scaled by the probe's ratio, else the probe's own; ``None`` when neither ran."""
        kind = self.work(index)
        if kind in self.measured:
            return self.measured[kind]
        known = [k for k in self.measured if k in self.probed]
        if kind in self.probed and known:
            return self.measured[known[-1]] * self.probed[kind] / self.probed[known[-1]]
        return self.probed.get(kind)

    def other_seconds(self, index: int) -> float:
        """The expected seconds of a round's work besides training (0 before any round finished)."""
        prior = index == 0 or self.estimator.amortized
        return self.other.get(prior, next(iter(self.other.values()), 0.0))

    def remaining(self) -> float | None:
        """The expected seconds until the fit ends, or ``None`` before anything can price its steps."""
        # while the round simulates, the plan made when the last round started training
        plan = [(j, steps) for j, steps in self.plan if j >= self.index]
        if not plan:
            return None
        left = 0.0
        for j, steps in plan:
            per_step = self.seconds_per_step(j)
            steps = steps if steps is not None else self._open_ended_steps()
            if per_step is None or steps is None:
                return None
            if j > self.index:
                left += steps * per_step + self.other_seconds(j)
            elif self.training:
                left += (steps - self.steps_done) * per_step
            else:
                spent = time.perf_counter() - self.round_began
                left += steps * per_step + max(self.other_seconds(j) - spent, 0.0)
        return left

    def _open_ended_steps(self) -> int | None:
        """An open-ended round's expected steps: the last finished round's."""
        history = self.estimator.history
        return history[-1]["steps"] if history else None

    def _learn(self, index: int, entry: dict, probing: float = 0.0) -> None:
        """Keep a finished round's rates (a checkpoint's entries from before ``train_seconds`` existed give none):
        its step's measured rate, else (entries from before ``step_seconds``) its training seconds over its steps;
        ``probing``: seconds of the round spent on the probe, which no other round repeats."""
        if "train_seconds" not in entry or not entry.get("steps"):
            return
        rate = entry.get("step_seconds", entry["train_seconds"] / entry["steps"])
        self.measured[self.work(index)] = rate
        prior = index == 0 or self.estimator.amortized
        self.other[prior] = max(entry["seconds"] - entry["train_seconds"] - probing, 0.0)

    def _render(self, status: str) -> None:
        if self.bar.disable:
            return
        estimator, elapsed = self.estimator, time.perf_counter() - self.began
        left = self.remaining()
        if left is not None and self.plan:
            self.bar.n = min(round(BAR_UNITS * elapsed / max(elapsed + left, 1e-9)), BAR_UNITS)
            clock = f"{tqdm.format_interval(elapsed)} elapsed, ~{tqdm.format_interval(left)} left"
        else:
            clock = f"{tqdm.format_interval(elapsed)} elapsed"
        number = min(self.index + 1, estimator.rounds, len(estimator.history) + 1)
        parts = [
            f"round {number}/{estimator.rounds}",
            f"{estimator.num_simulations} simulations",
            status,
            clock,
        ]
        self.bar.set_description_str(", ".join(p for p in parts if p))
