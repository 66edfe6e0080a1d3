"""The Hydra callback that refuses, in one line and before Hydra creates anything, a run or sweep directory
that cannot be written (a read-only folder, a file in the way): otherwise Hydra fails there with a traceback."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class WritableRunDirectory(Callback):
    """Checks ``hydra.run.dir`` before a run and ``hydra.sweep.dir`` before a sweep (:func:`check_writable`)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        check_writable(Path(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        check_writable(Path(config.hydra.sweep.dir), "hydra.sweep.dir")


def check_writable(directory: Path, key: str) -> None:
    """``SystemExit`` with one line naming ``directory`` and the config ``key`` to change when it cannot be
    created or written: its nearest existing ancestor must be a directory in which a file can be created
    (tried with a temporary directory, removed again; nothing else is created)."""
    existing = next(p for p in (directory, *directory.parents) if p.exists() or p == p.parent)
    try:
        with tempfile.TemporaryDirectory(dir=existing, prefix=".dpsbi-write-check-"):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise SystemExit(
            f"dpsbi-run: cannot write the run directory {directory} ({reason} at {existing}); "
            f"choose a writable one with {key}=..."
        ) from None
