"""One round of flow training with PyTorch Lightning: Adam, gradient clipping, early stopping on a
validation loss, and the weights of the best validation epoch restored at the end."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping
from torch import Tensor, nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from .seeding import derive_seed
from .settings import Settings

#: ``loss(flow, batch, generator) -> scalar``: a batch is the tuple of tensors of the dataset.
Loss = Callable[[nn.Module, tuple[Tensor, ...], torch.Generator], Tensor]
#: Learning-rate schedules within a round (see :class:`TrainingSettings`).
LR_SCHEDULES = ("constant", "cosine")
#: ``on_epoch(epoch, train_loss, val_loss)``: called after every validated epoch (the estimators' round bar).
EpochCallback = Callable[[int, float, float], None]
#: Lightning's loggers: their INFO lines are a banner ("GPU available ...") and an advert on every fit.
LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning.pytorch", "lightning_fabric")


#: The fields of :class:`TrainingSettings` that belong to the machine (Lightning's device settings).
DEVICE_FIELDS = ("accelerator", "devices", "precision")


@dataclass(frozen=True)
class TrainingSettings(Settings):
    """Settings of every round's training: Adam with ``lr`` and ``weight_decay`` on batches of ``batch_size``,
    gradient norm clipped at ``clip``; a round stops when the validation loss has not improved for
    ``patience`` epochs, after ``max_epochs`` or after ``max_steps`` gradient steps (``None``: no limit).
    The defaults are measured for a CPU (docs/RESULTS.md, "Fast by default"): 500 steps a round whatever the
    number of simulations, the learning rate decaying from 1e-3 on a cosine; the paper trained open-ended
    rounds at a constant 5e-4 (:data:`~dpsbi.inference.estimator.PAPER_TRAINING`). ``lr_schedule`` is ``"constant"`` or ``"cosine"`` (the learning rate decays from ``lr`` to 0
    over the round's ``max_steps``, which it needs; every round starts again from ``lr``).
    ``validation_fraction`` of each round's simulations are held out for the validation loss;
    ``accelerator``, ``devices`` and ``precision`` go to Lightning's ``Trainer`` ("auto" uses a GPU when there
    is one)."""

    label: ClassVar[str] = "training"
    batch_size: int = 100
    lr: float = 1e-3
    weight_decay: float = 1e-4
    clip: float = 5.0
    patience: int = 20
    max_epochs: int | None = None
    max_steps: int | None = 500
    lr_schedule: str = "cosine"
    validation_fraction: float = 0.05
    accelerator: str = "auto"
    devices: int | str | list = 1
    precision: str | int = "32-true"

    def __post_init__(self) -> None:
        checks = {
            "batch_size": self.batch_size >= 1,
            "lr": self.lr > 0,
            "weight_decay": self.weight_decay >= 0,
            "clip": self.clip > 0,
            "patience": self.patience >= 1,
            "max_epochs": self.max_epochs is None or self.max_epochs >= 1,
            "max_steps": self.max_steps is None or self.max_steps >= 1,
            "lr_schedule": self.lr_schedule in LR_SCHEDULES,
            "validation_fraction": 0 < self.validation_fraction < 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            hint = f" (lr_schedule: one of {LR_SCHEDULES})" if "lr_schedule" in bad else ""
            raise ValueError(
                f"invalid training settings: {', '.join(f'{n}={getattr(self, n)!r}' for n in bad)}{hint}"
            )
        if self.lr_schedule == "cosine" and self.max_steps is None:
            raise ValueError(
                "training lr_schedule='cosine' decays over a round's max_steps: set max_steps (e.g. 500)"
            )


class NonFiniteLossError(RuntimeError):
    """A training or validation loss that is NaN or infinite."""


class LossModule(pl.LightningModule):
    """Trains ``flow`` on ``loss``. Every training step draws fresh mechanism noise from a generator seeded
    with ``train_seed``; every validation epoch reuses the same noise (``val_seed``), so that validation
    losses of different epochs differ only through the weights. Keeps the best weights seen. A cosine
    ``lr_schedule`` decays the learning rate to 0 over ``total_steps``, the round's step budget.

    A non-finite loss raises :class:`NonFiniteLossError` naming ``label`` (e.g. ``"SPPE round 2"``), the
    epoch and the step. Training steps record the first bad step on the device and are checked once per
    epoch, so that no step waits for the host."""

    def __init__(
        self,
        flow: nn.Module,
        loss: Loss,
        settings: TrainingSettings,
        train_seed: int,
        val_seed: int,
        label: str = "training",
        total_steps: int | None = None,
        on_epoch: EpochCallback | None = None,
    ) -> None:
        super().__init__()
        self.flow, self.loss, self.settings, self.label, self.total_steps = (
            flow,
            loss,
            settings,
            label,
            total_steps,
        )
        self.train_seed, self.val_seed, self.on_epoch = train_seed, val_seed, on_epoch
        self.best_loss, self.best_state, self.epochs, self.train_loss = math.inf, None, 0, math.nan

    def on_fit_start(self) -> None:
        self.train_generator = torch.Generator(device=self.device).manual_seed(self.train_seed)

    def on_train_epoch_start(self) -> None:
        self.first_bad_step = torch.full((), -1, dtype=torch.long, device=self.device)
        self.train_sum = torch.zeros((), device=self.device)
        self.train_count = 0

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        loss = self.loss(self.flow, batch, self.train_generator)
        unseen = (self.first_bad_step < 0) & ~torch.isfinite(loss)
        self.first_bad_step = torch.where(unseen, batch_idx, self.first_bad_step)
        self.train_sum = self.train_sum + loss.detach() * len(batch[0])  # read once per epoch, on the host
        self.train_count += len(batch[0])
        return loss

    def on_validation_epoch_start(self) -> None:
        self.val_generator = torch.Generator(device=self.device).manual_seed(self.val_seed)
        self.val_sum, self.val_count = 0.0, 0

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        n = len(batch[0])
        self.val_sum += float(self.loss(self.flow, batch, self.val_generator)) * n
        self.val_count += n

    def on_validation_epoch_end(self) -> None:
        value = self.val_sum / self.val_count
        bad_step = int(self.first_bad_step)
        if bad_step >= 0:
            self._fail(f"the training loss at step {bad_step}")
        if not math.isfinite(value):
            self._fail(f"the validation loss ({value})")
        self.log("val_loss", value)
        self.epochs += 1
        self.train_loss = float(self.train_sum) / max(self.train_count, 1)
        if value < self.best_loss:
            self.best_loss = value
            self.best_state = {k: v.detach().clone() for k, v in self.flow.state_dict().items()}
        if self.on_epoch is not None:
            self.on_epoch(self.epochs, self.train_loss, value)

    def _fail(self, what: str) -> None:
        raise NonFiniteLossError(
            f"{self.label}, epoch {self.epochs}: {what} is not finite; the simulator, the mechanism or the flow "
            "produced NaN/inf (check the summaries' scale, or lower lr)"
        )

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(
            self.flow.parameters(), lr=self.settings.lr, weight_decay=self.settings.weight_decay
        )
        if self.settings.lr_schedule == "constant":
            return optimizer
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": cosine, "interval": "step"}}


@contextlib.contextmanager
def _quiet():
    """Silence Lightning for one fit: its INFO lines (banner, advert, the KeyboardInterrupt notice), its
    data-loader advice (the data sit in memory), its notice that a GPU is left unused (the CPU is the faster
    choice at small budgets: "On a GPU" in docs/RESULTS.md) and its own call of a deprecated torch pytree API.
    Filters match by message and module, so that any other warning still shows."""
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*available but not used.*")  # accelerator="cpu" on a GPU machine
        warnings.filterwarnings("ignore", ".*number of training batches.*smaller than the logging interval.*")
        warnings.filterwarnings(
            "ignore", r".*isinstance\(treespec, LeafSpec\)` is deprecated", module=r"pytorch_lightning\."
        )
        for lg in loggers:
            lg.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


@contextlib.contextmanager
def _deterministic(device: torch.device):
    """Deterministic kernels for one fit on CUDA, so that a resumed or repeated fit gives the same flow there
    too (the backward passes of ``gather`` and index ops sum with atomics on CUDA, in no fixed order; the
    CPU's kernels are deterministic already). ``warn_only``: an op without a deterministic kernel warns
    instead of failing the fit. Lightning's ``Trainer(deterministic=...)`` would leave the process-wide flag
    set after the fit; this restores it."""
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


@contextlib.contextmanager
def _interruptible():
    """Ctrl-C during ``Trainer.fit`` as a ``KeyboardInterrupt``. Lightning turns it into ``SystemExit(1)`` and
    leaves SIGINT ignored for the rest of the process (a notebook could no longer be interrupted); this
    restores the handler and raises the interrupt the caller expects."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    except SystemExit as exit_:
        if isinstance(exit_.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt("training interrupted") from None
        raise
    finally:
        if main and signal.getsignal(signal.SIGINT) is not handler:
            signal.signal(signal.SIGINT, handler)


class Batches(Sampler[Tensor]):
    """Index batches of ``batch_size`` rows over ``size`` rows, shuffled by ``shuffle`` if given. A trailing
    partial batch joins the one before it, so no batch has fewer than ``batch_size`` rows (unless there are
    fewer rows in all): the atomic loss then always has its full number of atoms."""

    def __init__(self, size: int, batch_size: int, shuffle: torch.Generator | None = None) -> None:
        self.size, self.batch_size, self.shuffle = size, batch_size, shuffle

    def __len__(self) -> int:
        return max(self.size // self.batch_size, 1)

    def __iter__(self):
        order = (
            torch.randperm(self.size, generator=self.shuffle)
            if self.shuffle is not None
            else torch.arange(self.size)
        )
        bounds = [i * self.batch_size for i in range(len(self))] + [self.size]
        return (order[a:b] for a, b in zip(bounds[:-1], bounds[1:]))


def _loader(data: TensorDataset, batch_size: int, shuffle: torch.Generator | None = None) -> DataLoader:
    """Batches of ``data`` taken by tensor indexing (no per-row collation); see :class:`Batches`."""
    return DataLoader(data, sampler=Batches(len(data), batch_size, shuffle), batch_size=None)


def epoch_budget(settings: TrainingSettings, batches_per_epoch: int) -> int | None:
    """The most epochs of a round: ``max_epochs``, and ``max_steps`` rounded up to whole epochs (so that the
    last weights are validated, and the cosine schedule ends with the last epoch); ``None``: no limit."""
    limits = [settings.max_epochs] if settings.max_epochs is not None else []
    if settings.max_steps is not None:
        limits.append(math.ceil(settings.max_steps / batches_per_epoch))
    return min(limits) if limits else None


def _trainer(settings: TrainingSettings, **kwargs) -> pl.Trainer:
    """Lightning's ``Trainer`` on the settings' device fields, with its own printing, logging and checkpoints
    off (build it inside :func:`_quiet`)."""
    return pl.Trainer(
        accelerator=settings.accelerator,
        devices=settings.devices,
        precision=settings.precision,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        **kwargs,
    )


def training_device(settings: TrainingSettings) -> torch.device:
    """The device a fit with ``settings`` trains on, where :func:`fit_flow` leaves the flow (Lightning's
    resolution of ``accelerator`` and ``devices``: "auto" is the GPU when there is one)."""
    with _quiet():
        return _trainer(settings).strategy.root_device


def fit_flow(
    flow: nn.Module,
    loss: Loss,
    train: TensorDataset,
    val: TensorDataset,
    settings: TrainingSettings,
    seed: int,
    label: str = "training",
    on_epoch: EpochCallback | None = None,
) -> dict:
    """Train ``flow`` in place with one Lightning ``Trainer`` until the validation loss has not improved
    for ``patience`` epochs (or ``max_epochs`` / ``max_steps``), then restore its best weights; the flow stays on the
    training device. Lightning prints nothing; ``on_epoch(epoch, train_loss, val_loss)`` reports each epoch.
    A non-finite loss raises :class:`NonFiniteLossError` naming ``label``; Ctrl-C raises ``KeyboardInterrupt``.
    Returns ``{"epochs", "steps", "train_loss", "best_val_loss"}`` (``train_loss``: the last epoch's mean)."""
    shuffle = torch.Generator().manual_seed(derive_seed(seed, "shuffle"))
    batches = _loader(train, settings.batch_size, shuffle)
    epochs = epoch_budget(settings, len(batches))
    module = LossModule(
        flow,
        loss,
        settings,
        derive_seed(seed, "noise"),
        derive_seed(seed, "validation"),
        label,
        total_steps=None if epochs is None else epochs * len(batches),
        on_epoch=on_epoch,
    )
    flow.train()  # Lightning leaves it in eval mode after validating, and warns about that at the next fit
    with _quiet(), _interruptible():
        trainer = _trainer(
            settings,
            max_epochs=-1 if epochs is None else epochs,
            gradient_clip_val=settings.clip,
            callbacks=[
                EarlyStopping(monitor="val_loss", patience=settings.patience, mode="min", check_finite=False)
            ],
            num_sanity_val_steps=0,
        )
        try:
            with _deterministic(trainer.strategy.root_device):
                trainer.fit(module, batches, _loader(val, settings.batch_size))
        finally:  # Lightning's teardown moves the module to the CPU, even when the fit is interrupted
            flow.to(trainer.strategy.root_device)
    if module.best_state is None:
        raise RuntimeError("training produced no finite validation loss")
    flow.load_state_dict(module.best_state)
    return {
        "epochs": module.epochs,
        "steps": trainer.global_step,
        "train_loss": module.train_loss,
        "best_val_loss": module.best_loss,
    }
