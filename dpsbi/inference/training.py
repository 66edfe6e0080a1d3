"""One round of flow training: Adam, gradient clipping, a constant or cosine learning rate, early stopping on a
validation loss, and the weights of the best validation epoch restored at the end.

The loop keeps the device busy: the round's data move to the training device once, every batch is cut by an
on-device permutation, every step draws its randomness from an on-device generator, and the losses are summed
on the device and read once per epoch (with the early-stopping decision). A step holds no ``.item()``, no
boolean-mask indexing and no Python branch on a tensor, so it never waits for the host, and its deterministic
part (:attr:`Loss.compute`) traces whole with ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import numbers
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..mechanisms.base import check_integer
from .seeding import derive_seed
from .settings import Settings

#: Learning-rate schedules within a round (see :class:`TrainingSettings`).
LR_SCHEDULES = ("constant", "cosine")
#: ``on_epoch(epoch, train_loss, val_loss)``: called after every validated epoch (the estimators' round bar).
EpochCallback = Callable[[int, float, float], None]
#: Accelerators: ``"auto"`` is CUDA when a GPU is visible, else the CPU; ``"gpu"`` is CUDA.
ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps")
#: Precisions: float32, float64, or float32 weights with bfloat16 autocast on the device.
PRECISIONS = {"32-true": torch.float32, "32": torch.float32, "64-true": torch.float64, "64": torch.float64}
MIXED = ("bf16-mixed",)
#: ``compile``: ``"auto"`` compiles a round on CUDA of at least this many steps (below, compiling costs more than
#: it saves: on an H200 a compiled step of the default size took 7.5 ms against 70 ms eager, after 47 s of
#: compiling; docs/RESULTS.md, "On a GPU"). On CUDA the compiled loss replays as a CUDA graph
#: (``mode="reduce-overhead"``): the eager step is bound by kernel launches, not by arithmetic.
COMPILE_MIN_STEPS = 2000
#: ``compile``: ``"auto"`` compiles a kind of step on the CPU (:class:`StepKind`) where the fit's steps of that kind
#: are expected to save at least this many seconds, each at least :func:`cpu_compiled_step_saving` (a lower bound: the
#: defaults' steps saved 1.1-2x it): a little more than compiling the step's one shape into an empty cache takes on
#: one core (111-137 s for the defaults' steps; from torch's cache 18-25 s; docs/RESULTS.md, "Compiled on the CPU, a
#: fit at a time" and "One shape a compiled round"). Of the defaults, SPPE's sequential fits on regression (its atomic
#: rounds), naive Bayes and SIR and every amortized fit reach it; sequential SPLE (3518 steps of 800 evaluations
#: run compiled, 91 s) and regression's first round do not.
CPU_COMPILE_MIN_SAVING_S = 150.0
#: The warning torch 2.13's compiler gives while compiling a loss (forward and backward), about a function of its own
#: it deprecated: nothing a user can act on, so a compiled fit silences it (and no other).
COMPILER_NOISE = r"`torch\._prims_common\.check` is deprecated"

#: How far a compiled loss's gradient may lie from the eager one's (the norm of the difference over the eager norm)
#: on the batches where a compiled round checks it (:data:`COMPILED_CHECK_STEPS`; bf16-mixed:
#: ``COMPILED_GRADIENT_TOLERANCE_MIXED``).
#: Compiled and eager agree to 2e-6-5e-5 where the compiler is right; its bugs have cost 11-78 % (docs/RESULTS.md,
#: "Compiled on the CPU"). A batch can also lie beyond it with no bug: a spline's log-determinant has a gradient that
#: jumps at its knots, and a value within a few ulps of a knot lands in one bin eagerly and in the next compiled
#: (the two round differently), so that one row's gradient is the other one-sided derivative (0.8 % of a batch
#: gradient's norm on the conjugate Gaussian's amortized SPLE, 11 % on a batch of 190 of regression's SPPE): a
#: batch beyond it is confirmed on the next batch (:meth:`_Round._checked_step`).
COMPILED_GRADIENT_TOLERANCE = 1e-3
COMPILED_GRADIENT_TOLERANCE_MIXED = 3e-2
#: A compiled round checks its gradient against eager (:data:`COMPILED_GRADIENT_TOLERANCE`) on its first full batch,
#: then on the first full batch at least this many steps after its last check. A check costs about one eager step
#: more (a compiled step saves 0.3-0.6 of one), so checks this far apart cost 2-3 % of what compiling saves; at every
#: epoch's first batch, as before, sequential SPLE's first round (56 epochs of 9 steps) trained for 56.3 CPU s against
#: 49.0 (docs/RESULTS.md, "A compiled round checks every 100 steps").
COMPILED_CHECK_STEPS = 100

#: The fields of :class:`TrainingSettings` that belong to the machine.
DEVICE_FIELDS = ("accelerator", "devices", "precision", "threads", "compile", "cuda_graph")


@dataclass(frozen=True)
class Loss:
    """A training loss in two parts, so that a step's arithmetic is free of random-number calls (which
    ``torch.compile`` cannot trace with a generator): ``draw(rows, generator)`` gives the random tensors of a
    batch of ``rows`` pairs (mechanism uniforms, atoms), and ``compute(flow, batch, draws)`` the scalar loss,
    deterministic given them. ``batch`` is the tuple of the round's tensors cut to the batch's rows."""

    compute: Callable[[nn.Module, tuple[Tensor, ...], tuple[Tensor, ...]], Tensor]
    draw: Callable[[int, torch.Generator], tuple[Tensor, ...]] = lambda rows, generator: ()


@dataclass(frozen=True)
class TrainingSettings(Settings):
    """Settings of every round's training: Adam with ``lr`` and ``weight_decay`` on batches of ``batch_size``,
    gradient norm clipped at ``clip``; a round stops when the validation loss has not improved for
    ``patience`` epochs, after ``max_epochs`` or after ``max_steps`` gradient steps (``None``: no limit).
    The defaults are measured for a CPU (docs/RESULTS.md, "Fast by default"): 500 steps a round whatever the
    number of simulations, the learning rate decaying from 1e-3 on a cosine; the paper trained open-ended
    rounds at a constant 5e-4 (:data:`~dpsbi.inference.estimator.PAPER_TRAINING`). ``lr_schedule`` is
    ``"constant"`` or ``"cosine"`` (the learning rate decays from ``lr`` to 0 over the round's ``max_steps``,
    which it needs; every round starts again from ``lr``). ``validation_fraction`` of each round's simulations
    are held out for the validation loss. ``batch_size=None`` leaves the batch to the estimator, chosen per fit
    (the estimator's ``default_batch_size``: 100, or up to 1000 for an amortized SPPE or SPLE fit), and
    ``weight_decay=None`` the L2 penalty (the estimator's ``default_weight_decay``: 1e-4, or 0 for an amortized
    SPPE or SPLE fit).

    The machine: ``accelerator`` (``"auto"``: CUDA when a GPU is visible, else the CPU; ``"cpu"``, ``"cuda"``
    or ``"gpu"``, ``"mps"``), ``devices`` (one device: ``1``, ``"auto"``, or ``[k]`` for GPU ``k``),
    ``precision`` (``"32-true"``, ``"64-true"``, ``"bf16-mixed"``), ``threads`` (torch's CPU threads during a
    fit on the CPU, restored after; ``None`` keeps the process's; 1 is fastest for these small batches and
    robust on a busy machine), ``compile`` (``torch.compile`` the step's loss: ``True``, ``False``, or
    ``"auto"``: on CUDA for a round of at least :data:`COMPILE_MIN_STEPS` steps, on the CPU for a kind of step whose
    steps over the fit save at least :data:`CPU_COMPILE_MIN_SAVING_S` where torch finds a C++ compiler; each
    compiled round checks its loss's gradient against eager on a full batch every :data:`COMPILED_CHECK_STEPS`
    steps, :data:`COMPILED_GRADIENT_TOLERANCE`) and ``cuda_graph`` (capture the
    whole step, backward, clipping and Adam included, as a CUDA graph at its first batch and replay it for the
    rest of the round: no compiling, and one launch a step instead of thousands; ``True``, ``False``, or
    ``"auto"``: on CUDA where the loss is not compiled, in 32- or 64-bit precision)."""

    label: ClassVar[str] = "training"
    batch_size: int | None = 100
    lr: float = 1e-3
    weight_decay: float | None = 1e-4
    clip: float = 5.0
    patience: int = 20
    max_epochs: int | None = None
    max_steps: int | None = 500
    lr_schedule: str = "cosine"
    validation_fraction: float = 0.05
    accelerator: str = "auto"
    devices: int | str | list = 1
    precision: str | int = "32-true"
    threads: int | None = 1
    compile: bool | str = "auto"
    cuda_graph: bool | str = "auto"

    def __post_init__(self) -> None:
        # a whole float (500.0) as an int, as the estimators take counts; what is no count fails the checks below
        for name in ("batch_size", "patience", "max_epochs", "max_steps", "threads"):
            with contextlib.suppress(TypeError, ValueError):
                object.__setattr__(self, name, check_integer(name, getattr(self, name)))
        # each field's test and what it must be; bools are not numbers here, nor what equals one (1 for True)
        checks = {
            "batch_size": (_count(self.batch_size, optional=True), "an integer >= 1, or None"),
            "lr": (_real(self.lr) and self.lr > 0, "a number > 0"),
            "weight_decay": (
                self.weight_decay is None or (_real(self.weight_decay) and self.weight_decay >= 0),
                "a number >= 0, or None",
            ),
            "clip": (_real(self.clip) and self.clip > 0, "a number > 0"),
            "patience": (_count(self.patience), "an integer >= 1"),
            "max_epochs": (_count(self.max_epochs, optional=True), "an integer >= 1, or None"),
            "max_steps": (_count(self.max_steps, optional=True), "an integer >= 1, or None"),
            "lr_schedule": (self.lr_schedule in LR_SCHEDULES, f"one of {LR_SCHEDULES}"),
            "validation_fraction": (
                _real(self.validation_fraction) and 0 < self.validation_fraction < 1,
                "a fraction in (0, 1)",
            ),
            "accelerator": (self.accelerator in ACCELERATORS, f"one of {ACCELERATORS}"),
            "devices": (
                self.devices in (1, "1", "auto") or _device_index(self.devices) is not None,
                "1, 'auto' or [k]: one device",
            ),
            "precision": (str(self.precision) in (*PRECISIONS, *MIXED), f"one of {(*PRECISIONS, *MIXED)}"),
            "threads": (_count(self.threads, optional=True), "an integer >= 1, or None"),
            "compile": (isinstance(self.compile, bool) or self.compile == "auto", "True, False or 'auto'"),
            "cuda_graph": (
                isinstance(self.cuda_graph, bool) or self.cuda_graph == "auto",
                "True, False or 'auto'",
            ),
        }
        bad = [f"{name}={getattr(self, name)!r} ({rule})" for name, (ok, rule) in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid training settings: {'; '.join(bad)}")
        if self.cuda_graph is True and (
            self.accelerator in ("cpu", "mps") or self.compile is True or str(self.precision) in MIXED
        ):
            raise ValueError(
                f"training cuda_graph=True needs CUDA, compile off and precision 32 or 64 (got accelerator="
                f"{self.accelerator!r}, compile={self.compile!r}, precision={self.precision!r}); use 'auto'"
            )
        if self.lr_schedule == "cosine" and self.max_steps is None:
            raise ValueError(
                "training lr_schedule='cosine' decays over a round's max_steps: set max_steps (e.g. 500)"
            )


def _real(value) -> bool:
    """Whether ``value`` is a real number (a bool is not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _count(value, optional: bool = False) -> bool:
    """Whether ``value`` is an integer >= 1 (a bool is not; ``2.0`` is not), or ``None`` where ``optional``."""
    if value is None:
        return optional
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _device_index(devices) -> int | None:
    """The GPU index of ``devices = [k]`` (or ``"k,"``), else ``None``."""
    if isinstance(devices, (list, tuple)) and len(devices) == 1 and isinstance(devices[0], int):
        return devices[0]
    return None


class NonFiniteLossError(RuntimeError):
    """A training or validation loss that is NaN or infinite."""


class CompiledGradientError(RuntimeError):
    """A compiled loss whose gradient is not the eager loss's (a bug of torch's compiler), under ``compile=True``."""


def training_device(settings: TrainingSettings) -> torch.device:
    """The device a fit with ``settings`` trains on, where :func:`fit_flow` leaves the flow."""
    kind = settings.accelerator
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "gpu":
        kind = "cuda"
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "training accelerator='cuda' but no GPU is visible; use accelerator='auto' or 'cpu'"
        )
    if kind == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError(
            "training accelerator='mps' but MPS is not available; use accelerator='auto' or 'cpu'"
        )
    index = _device_index(settings.devices)
    return torch.device(kind, index) if kind == "cuda" and index is not None else torch.device(kind)


def epoch_budget(settings: TrainingSettings, batches_per_epoch: int) -> int | None:
    """The most epochs of a round: ``max_epochs``, and ``max_steps`` rounded up to whole epochs (so that the
    last weights are validated, and the cosine schedule ends with the last epoch); ``None``: no limit."""
    limits = [settings.max_epochs] if settings.max_epochs is not None else []
    if settings.max_steps is not None:
        limits.append(math.ceil(settings.max_steps / batches_per_epoch))
    return min(limits) if limits else None


def planned_steps(settings: TrainingSettings, rows: int) -> tuple[int, int | None]:
    """A round's gradient steps on ``rows`` training rows: ``(per_epoch, steps)``, ``steps`` the most the round
    takes (:func:`epoch_budget` whole epochs; ``None``: open-ended). Early stopping can end it sooner."""
    per_epoch = max(rows // settings.batch_size, 1)
    epochs = epoch_budget(settings, per_epoch)
    return per_epoch, None if epochs is None else epochs * per_epoch


def first_batch(rows: int, batch_size: int) -> int:
    """The rows of an epoch's first batch of ``rows`` rows (:func:`batches`): ``batch_size``, or ``rows`` where the
    epoch is one batch. A compiled round compiles its loss for this shape only."""
    return batch_size if rows >= 2 * batch_size else rows


def shaped_steps(settings: TrainingSettings, rows: int) -> int | None:
    """Of a round's :func:`planned_steps` on ``rows`` training rows, those on its epochs' first batch's shape
    (:func:`first_batch`), which a compiled round runs compiled: all but each epoch's larger last batch."""
    per_epoch, steps = planned_steps(settings, rows)
    larger_last = first_batch(rows, settings.batch_size) < rows and rows % settings.batch_size != 0
    return None if steps is None else steps // per_epoch * (per_epoch - int(larger_last))


def batches(order: Tensor, batch_size: int) -> Iterator[Tensor]:
    """Slices of the row order ``order (n,)`` into batches of ``batch_size`` rows; a trailing partial batch joins
    the one before it, so no batch has fewer than ``batch_size`` rows (unless there are fewer rows in all): the
    atomic loss then always has its full number of atoms."""
    count = max(order.shape[0] // batch_size, 1)
    for i in range(count):
        yield order[i * batch_size : (i + 1) * batch_size if i < count - 1 else None]


@dataclass(frozen=True)
class StepKind:
    """A kind of training step (one shape: a step of ``evaluations`` flow evaluations) and ``fit_steps``, how many
    of them the whole fit takes (all its rounds of that kind, each epoch's larger last batch left out:
    :func:`shaped_steps`; ``None``: open-ended)."""

    evaluations: float
    fit_steps: int | None


def cpu_compiled_step_saving(evaluations: float) -> float:
    """The seconds a compiled training step of ``evaluations`` flow evaluations saves against an eager one on one
    CPU core, at least: 14 ms plus 0.015 ms an evaluation (measured 17-30 ms at 100 evaluations in batches of 100,
    30-32 ms at 1000 in batches of 100, 40-54 ms at 800, 39-45 ms at 1000 in batches of 1000; docs/RESULTS.md,
    "Compiled on the CPU, a fit at a time")."""
    return 0.014 + 1.5e-5 * evaluations


def compiles(
    settings: TrainingSettings,
    device: torch.device,
    steps: int | None,
    kind: StepKind | None = None,
) -> bool:
    """Whether a round of ``steps`` steps (``None``: open-ended) of the kind ``kind`` (``None``: unknown) compiles
    its loss (``compile``); ``"auto"`` decides per round on CUDA (:data:`COMPILE_MIN_STEPS`), per kind of step on
    the CPU (:data:`CPU_COMPILE_MIN_SAVING_S`), and gives way to ``cuda_graph=True``."""
    if settings.compile is False:
        return False
    if settings.compile is True:
        return True
    if device.type == "cpu":
        if kind is None or kind.fit_steps is None:
            return False
        saving = kind.fit_steps * cpu_compiled_step_saving(kind.evaluations)
        return saving >= CPU_COMPILE_MIN_SAVING_S and cpu_compiler()
    wanted = settings.cuda_graph is not True
    return wanted and device.type == "cuda" and (steps is None or steps >= COMPILE_MIN_STEPS)


@contextlib.contextmanager
def _compiler_quiet():
    """Around a compiled step: torch's compiler's own deprecation warning (:data:`COMPILER_NOISE`) silenced, every
    other warning as it was."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=COMPILER_NOISE, category=FutureWarning)
        yield


@functools.cache
def cpu_compiler() -> bool:
    """Whether torch can compile for the CPU here: a C++ compiler found (inductor's search: ``CXX``, then
    ``g++``), off Windows (where inductor's CPU backend is experimental)."""
    if sys.platform == "win32":
        return False
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception:  # any failure of the search means no compiled fit by default
        return False
    return True


def graphs(settings: TrainingSettings, flow: nn.Module, compiled: bool) -> bool:
    """Whether a fit of ``flow`` replays its step as a CUDA graph (``cuda_graph``); ``True`` off CUDA, with a
    compiled loss (which makes CUDA graphs of its own), mixed precision or a flow that waits for the device
    (:attr:`~dpsbi.inference.flows.ConditionalFlow.synchronizes`) is refused in one line."""
    device, waits = next(flow.parameters()).device, getattr(flow, "synchronizes", False)
    possible = device.type == "cuda" and not compiled and str(settings.precision) not in MIXED and not waits
    if settings.cuda_graph is True and not possible:
        raise ValueError(
            f"training cuda_graph=True needs a fit on CUDA with compile off, precision 32 or 64 and a flow that "
            f"never waits for the device (this one: {device.type}, compiled={compiled}, precision="
            f"{settings.precision!r}, nflows={waits}); use cuda_graph='auto'"
        )
    return possible and settings.cuda_graph in (True, "auto")


def learning_rate(settings: TrainingSettings, step: int, steps: int | None) -> float:
    """The learning rate of a round's step ``step`` (from 0) of ``steps``: ``lr``, or under ``"cosine"``
    ``lr (1 + cos(pi step / steps)) / 2``, decaying to 0 at the round's end."""
    if settings.lr_schedule != "cosine" or steps is None:
        return settings.lr
    return settings.lr * (1 + math.cos(math.pi * min(step, steps) / steps)) / 2


class _Round:
    """The state of one round's fit: the flow, optimizer and schedule, generators, the CUDA graphs of its step,
    and the best weights."""

    def __init__(
        self,
        flow: nn.Module,
        loss: Loss,
        settings: TrainingSettings,
        seed: int,
        steps: int | None,
        compile_mode: str | None = None,
        kind: StepKind | None = None,
    ):
        self.flow, self.loss, self.settings, self.steps, self.count = flow, loss, settings, steps, 0
        device = next(flow.parameters()).device
        self.shuffle = torch.Generator(device=device).manual_seed(derive_seed(seed, "shuffle"))
        self.noise = torch.Generator(device=device).manual_seed(derive_seed(seed, "noise"))
        self.val_seed = derive_seed(seed, "validation")
        compiled = compiles(settings, device, steps, kind)
        self.graphed = graphs(settings, flow, compiled)
        # a graph reads the learning rate from the device (a tensor written before each replay); Adam's state,
        # step count included, stays on the device
        lr = torch.tensor(settings.lr, device=device) if self.graphed else settings.lr
        self.optimizer = torch.optim.Adam(
            flow.parameters(), lr=lr, weight_decay=settings.weight_decay, **_fused(device, self.graphed)
        )
        self.captured: dict[int, tuple[torch.cuda.CUDAGraph, tuple[Tensor, ...], Tensor]] = {}
        compute = loss.compute
        if compiled:
            mode = compile_mode or ("reduce-overhead" if device.type == "cuda" else "default")  # CUDA graphs
            compute = torch.compile(compute, fullgraph=True, dynamic=False, mode=mode)
        self.compute, self.fell_back, self.doubted = compute, False, False
        self.next_check = 0  # the step count from which the next full batch is checked (a compiled round)
        self.gradient_errors: list[float] = []  # each check's relative error of the compiled gradient
        dtype = str(settings.precision)
        self.autocast = (
            (lambda: torch.autocast(device.type, dtype=torch.bfloat16))
            if dtype in MIXED
            else contextlib.nullcontext
        )

    def step(self, data: tuple[Tensor, ...], rows: Tensor) -> Tensor:
        """One gradient step on the rows ``rows`` of ``data``; returns the batch's loss (detached, on the device).
        Graphed: the first step of each batch size runs eagerly and is captured; later ones replay it, reading
        ``data`` where it was captured, so a round passes the same tensors at every step."""
        lr = learning_rate(self.settings, self.count, self.steps)
        if self.graphed:
            self.optimizer.param_groups[0]["lr"].fill_(lr)  # in place: the graph reads it from there
        else:
            self.optimizer.param_groups[0]["lr"] = lr
        self.count += 1
        draws = self.loss.draw(rows.shape[0], self.noise)
        if not self.graphed:
            return self._update(data, rows, draws)
        if rows.shape[0] not in self.captured:
            value = self._warm_up(data, rows, draws)
            self.captured[rows.shape[0]] = self._capture(data, rows, draws)
            return value
        graph, inputs, value = self.captured[rows.shape[0]]
        for static, new in zip(inputs, (rows, *draws), strict=True):
            static.copy_(new)
        graph.replay()
        return value.clone()

    def _update(self, data: tuple[Tensor, ...], rows: Tensor, draws: tuple[Tensor, ...]) -> Tensor:
        """The step's arithmetic: the batch cut from ``data``, the loss, backward, clipping and Adam."""
        batch = tuple(t.index_select(0, rows) for t in data)
        # one shape compiled, the epoch's first batch's: its last batch, larger where the rows do not divide into
        # batches, runs eagerly (a second shape would cost a second compile, 111-137 s cold on a core)
        compiled = self.compiled and rows.shape[0] == first_batch(data[0].shape[0], self.settings.batch_size)
        checking = compiled and self.count >= self.next_check
        value = self._checked_step(batch, draws) if checking else None
        if value is None:  # not compiled, or a batch off and not yet confirmed: this step eager
            value = self._backward(
                self.compute if compiled and not checking else self.loss.compute, batch, draws
            )
        nn.utils.clip_grad_norm_(self.flow.parameters(), self.settings.clip, foreach=True)
        self.optimizer.step()
        return value.detach()

    @property
    def compiled(self) -> bool:
        """Whether the step runs the compiled loss (an ``"auto"`` round that failed its check no longer does)."""
        return self.compute is not self.loss.compute

    def _backward(self, compute: Callable, batch: tuple[Tensor, ...], draws: tuple[Tensor, ...]) -> Tensor:
        """The loss of ``batch`` by ``compute`` (the eager or the compiled one), its gradient left in the flow."""
        with self.autocast():
            value = compute(self.flow, batch, draws)
        self.optimizer.zero_grad(set_to_none=True)
        value.backward()
        return value

    def _checked_step(self, batch: tuple[Tensor, ...], draws: tuple[Tensor, ...]) -> Tensor | None:
        """The compiled loss's gradient against the eager one's on a full batch (the round's first, then one every
        :data:`COMPILED_CHECK_STEPS` steps; compiled at the round's first check, with torch's own deprecation warning
        silenced; one read on the host a check). Where the
        step may run compiled, returns the compiled loss, its gradient left in the flow (the step's own: computing it
        again would give the same); ``None`` where the step is to run eagerly. Beyond
        :data:`COMPILED_GRADIENT_TOLERANCE` on two checked batches in a row, ``compile=True`` raises
        :class:`CompiledGradientError` and ``"auto"`` warns in one line and trains the round (and the fit's later
        rounds) eagerly, as it does where the compiler fails to build the step. After one such batch, the step runs
        eagerly and the next full batch is checked too: a value within a few ulps of a spline knot can put one row's
        gradient on the other side of the knot compiled than eager, with no bug (:data:`COMPILED_GRADIENT_TOLERANCE`;
        2 of 150 noise draws of one batch at the conjugate Gaussian's amortized SPLE's last round), where a wrong
        compiler (11-78 % on every batch) fails the next batch too."""
        self.next_check = self.count + COMPILED_CHECK_STEPS
        eager = self._gradient(self.loss.compute, batch, draws)[1]
        try:
            with _compiler_quiet():
                value, compiled = self._gradient(self.compute, batch, draws)
        except Exception as error:  # e.g. no Python headers for the C++ build: "auto" promised a working fit
            if self.settings.compile is True:
                raise
            self._eagerly(f"torch's compiler failed ({type(error).__name__})")
            return None
        mixed = str(self.settings.precision) in MIXED
        tolerance = COMPILED_GRADIENT_TOLERANCE_MIXED if mixed else COMPILED_GRADIENT_TOLERANCE
        reference, difference = torch.stack([eager.norm(), (compiled - eager).norm()]).tolist()
        if not math.isfinite(reference):
            return value  # a non-finite eager gradient is the loss's error to report, not the compiler's
        error = difference / max(reference, torch.finfo(eager.dtype).tiny)
        self.gradient_errors.append(error)
        if error <= tolerance:
            self.doubted = False
            return value
        if not self.doubted:  # confirmed (or not) on the next full batch
            self.doubted = True
            self.next_check = self.count + 1
            return None
        where = f"{error:.2%} off the eager one's on two checked batches in a row (the second at step {self.count})"
        if self.settings.compile is True:
            raise CompiledGradientError(
                f"training compile=True: the compiled loss's gradient is {where} (torch {torch.__version__}'s "
                "compiler; docs/RESULTS.md, 'Compiled on the CPU'); use compile=False or 'auto'"
            )
        self._eagerly(f"the compiled loss's gradient is {where}")
        return None

    def _gradient(
        self, compute: Callable, batch: tuple[Tensor, ...], draws: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor]:
        """The loss of ``batch`` by ``compute`` and the flow's gradient ``(parameters,)`` of it, flattened (left in
        the flow too)."""
        value = self._backward(compute, batch, draws)
        return value, torch.cat([p.grad.flatten() for p in self.flow.parameters() if p.grad is not None])

    def _eagerly(self, why: str) -> None:
        """Under ``compile="auto"``: the rest of the round eager, after one line saying ``why`` (the fit's later
        rounds too: :func:`fit_flow`'s ``"compile_fell_back"``)."""
        warnings.warn(
            f"training compile='auto': {why} (torch {torch.__version__}; docs/RESULTS.md, 'Compiled on the CPU'); "
            "this round and the fit's later ones train eagerly",
            RuntimeWarning,
            stacklevel=3,
        )
        self.compute, self.fell_back = self.loss.compute, True

    def _warm_up(self, data: tuple[Tensor, ...], rows: Tensor, draws: tuple[Tensor, ...]) -> Tensor:
        """One eager step on a side stream, as torch's CUDA-graph recipe asks before a capture (it builds
        Adam's state and the libraries' handles outside the graph)."""
        side, current = torch.cuda.Stream(), torch.cuda.current_stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            value = self._update(data, rows, draws)
        current.wait_stream(side)
        return value

    def _capture(
        self, data: tuple[Tensor, ...], rows: Tensor, draws: tuple[Tensor, ...]
    ) -> tuple[torch.cuda.CUDAGraph, tuple[Tensor, ...], Tensor]:
        """The step captured (not run) as a CUDA graph reading its rows and draws from static tensors: the
        graph, those tensors, and the loss it writes. The gradients live in the graph's memory."""
        inputs = (rows.clone(), *(d.clone() for d in draws))
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            value = self._update(data, inputs[0], inputs[1:])
        return graph, inputs, value

    def train_epoch(self, data: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """One epoch of steps; returns the epoch's summed ``loss x rows`` and the index of its first non-finite
        step (``-1``: none), both on the device."""
        device = data[0].device
        order = torch.randperm(data[0].shape[0], generator=self.shuffle, device=device)
        total = torch.zeros((), device=device)
        first_bad = torch.full((), -1, dtype=torch.long, device=device)
        for step, rows in enumerate(batches(order, self.settings.batch_size)):
            value = self.step(data, rows)
            first_bad = torch.where((first_bad < 0) & ~torch.isfinite(value), step, first_bad)
            total = total + value * rows.shape[0]
        return total, first_bad

    @torch.no_grad()
    def validation_loss(self, data: tuple[Tensor, ...]) -> Tensor:
        """The mean loss over the validation rows, on the device, under the same noise at every epoch."""
        generator = torch.Generator(device=data[0].device).manual_seed(self.val_seed)
        order = torch.arange(data[0].shape[0], device=data[0].device)
        total = torch.zeros((), device=data[0].device)
        self.flow.eval()
        for rows in batches(order, self.settings.batch_size):
            batch = tuple(t.index_select(0, rows) for t in data)
            with self.autocast():
                value = self.loss.compute(self.flow, batch, self.loss.draw(rows.shape[0], generator))
            total = total + value * rows.shape[0]
        self.flow.train()
        return total / data[0].shape[0]


def _fused(device: torch.device, captured: bool = False) -> dict:
    """Adam's keyword arguments for ``device``: its fused kernel on CUDA (capturable in a CUDA graph when
    ``captured``) and on the CPU (one operator over the flow's tensors instead of a loop over them: 5-10 ms less a
    default step on a core, docs/RESULTS.md, "Adam's fused kernel on the CPU"); ``{}`` elsewhere (torch's default)."""
    return {"fused": True, "capturable": captured} if device.type in ("cuda", "cpu") else {}


@contextlib.contextmanager
def training_threads(settings: TrainingSettings, device: torch.device):
    """torch's CPU threads set to ``settings.threads`` for a fit on the CPU, restored after."""
    if device.type != "cpu" or settings.threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _deterministic(device: torch.device):
    """Deterministic kernels for one fit on CUDA, so that a resumed or repeated fit gives the same flow there
    too (the backward passes of ``gather`` and index ops sum with atomics on CUDA, in no fixed order; the
    CPU's kernels are deterministic already). ``warn_only``: an op without a deterministic kernel warns
    instead of failing the fit. The process-wide flag is restored after the fit."""
    if device.type != "cuda":
        yield
        return
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    # torch's deterministic mode asks for it (else it warns); it sizes the workspace of cuBLAS handles made from
    # now on, and a handle made earlier in the process on one stream already sums in a fixed order
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def fit_flow(
    flow: nn.Module,
    loss: Loss,
    train: tuple[Tensor, ...],
    val: tuple[Tensor, ...],
    settings: TrainingSettings,
    seed: int,
    label: str = "training",
    on_epoch: EpochCallback | None = None,
    kind: StepKind | None = None,
) -> dict:
    """Train ``flow`` in place on the rows of ``train`` (a tuple of tensors of equal length) until the loss on
    ``val`` has not improved for ``patience`` epochs (or ``max_epochs`` / ``max_steps``), then restore its best
    weights; the flow stays on the training device (:func:`training_device`). ``on_epoch(epoch, train_loss,
    val_loss)`` reports each epoch; ``kind``, the step's kind and how many of them the fit takes, decides
    ``compile="auto"`` on the CPU (:func:`compiles`). A non-finite loss raises :class:`NonFiniteLossError` naming
    ``label``, the epoch and the step. Returns ``{"epochs", "steps", "train_loss", "best_val_loss"}`` (``train_loss``: the
    last epoch's mean), with ``"compile_gradient_error"`` where the loss was compiled (the largest relative error of
    the compiled gradient against eager over the round's checks) and ``"compile_fell_back": True`` where
    ``compile="auto"`` gave way to eager steps (a compiler that failed or got a gradient wrong: the fit's later
    rounds do not try again)."""
    device = training_device(settings)
    train, val = _on_device(flow, (train, val), settings, device)
    per_epoch, steps = planned_steps(settings, train[0].shape[0])
    epochs = None if steps is None else steps // per_epoch
    state = _Round(flow, loss, settings, seed, steps, kind=kind)
    best_loss, best_state, waited, epoch, train_loss = math.inf, None, 0, 0, math.nan
    with training_threads(settings, device), _deterministic(device):
        while epochs is None or epoch < epochs:
            total, first_bad = state.train_epoch(train)
            value = state.validation_loss(val)
            total, first_bad, value = torch.stack([total, first_bad.to(total), value]).tolist()  # one read
            epoch += 1
            if first_bad >= 0:
                _fail(label, epoch, f"the training loss at step {int(first_bad)}")
            if not math.isfinite(value):
                _fail(label, epoch, f"the validation loss ({value})")
            train_loss = total / train[0].shape[0]
            if value < best_loss:
                best_loss, waited = value, 0
                best_state = {k: v.detach().clone() for k, v in flow.state_dict().items()}
            else:
                waited += 1
            if on_epoch is not None:
                on_epoch(epoch, train_loss, value)
            if waited >= settings.patience:
                break
    flow.load_state_dict(best_state)
    flow.eval()
    checked = {"compile_gradient_error": max(state.gradient_errors)} if state.gradient_errors else {}
    fell_back = {"compile_fell_back": True} if state.fell_back else {}
    return {
        "epochs": epoch,
        "steps": epoch * per_epoch,
        "train_loss": train_loss,
        "best_val_loss": best_loss,
        **checked,
        **fell_back,
    }


def step_seconds(
    flow: nn.Module,
    loss: Loss,
    train: tuple[Tensor, ...],
    settings: TrainingSettings,
    seed: int,
    repeats: int = 3,
) -> float:
    """The wall seconds of one training step of ``loss`` (optimizer included, uncompiled) on a batch of ``train``,
    measured on a copy of ``flow`` (the mean of ``repeats`` steps after one warm-up step) with generators of its
    own: the fit's flow and random streams are left as they were. The fit's progress estimate
    (:mod:`~dpsbi.inference.progress`) times the steps of rounds that have not run yet with it."""
    device = training_device(settings)
    probe = copy.deepcopy(flow)
    (train,) = _on_device(probe, (train,), settings, device)
    rows = next(batches(torch.arange(train[0].shape[0], device=device), settings.batch_size))
    state = _Round(probe, loss, dataclasses.replace(settings, compile=False), seed, repeats + 1)
    with training_threads(settings, device):
        state.step(train, rows)
        _synchronize(device)
        began = time.perf_counter()
        for _ in range(repeats):
            state.step(train, rows)
        _synchronize(device)
        return (time.perf_counter() - began) / repeats


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a timer around GPU steps would otherwise time their launches)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _on_device(
    flow: nn.Module, parts: tuple[tuple[Tensor, ...], ...], settings: TrainingSettings, device: torch.device
) -> tuple[tuple[Tensor, ...], ...]:
    """``flow`` moved to ``device`` (in float64 under ``"64-true"``) in training mode, and each tuple of tensors
    of ``parts`` with it."""
    double = PRECISIONS.get(str(settings.precision)) == torch.float64
    flow.to(device=device, dtype=torch.float64 if double else None).train()
    return tuple(tuple(_on(t, device, double) for t in part) for part in parts)


def _on(t: Tensor, device: torch.device, double: bool) -> Tensor:
    """A round's tensor on the training device (a floating one in float64 when training in ``"64-true"``)."""
    return t.to(device=device, dtype=torch.float64 if double and t.is_floating_point() else t.dtype)


def _fail(label: str, epoch: int, what: str) -> None:
    raise NonFiniteLossError(
        f"{label}, epoch {epoch}: {what} is not finite; the simulator, the mechanism or the flow "
        "produced NaN/inf (check the summaries' scale, or lower lr)"
    )
