"""The estimators' checkpoint: its file name in a checkpoint directory, its layout, and the check that a
stored checkpoint was made by the same run. The one owner of the format: the estimator writes and reads
through here, and the experiment layer and the fault-injection script name the file through here.

A checkpoint is a sealed ``torch.save`` dict (:func:`dpsbi.files.save_sealed`) holding ``format`` and
``version``, the run's ``fingerprint`` and ``history`` (JSON strings), the flow's ``flow_shape`` ``[dim,
context_dim]`` and ``flow`` state_dict, every stored simulation ``data`` (``theta``, ``s``, ``round``,
``validation``, and ``epsilon`` when amortized over epsilon) and the simulator ``probe``. Rounds (``history``'s
``"round"``, ``data["round"]``) are numbered from 1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..files import load_sealed, save_sealed
from ..tasks.identity import differences
from .flows import FlowSettings

FORMAT = "dpsbi-checkpoint"
#: 3: rounds numbered from 1 in ``history`` and ``data["round"]`` (version 2 numbered them from 0).
VERSION = 3
#: The checkpoint's file name inside a ``checkpoint_dir``.
FILE = "checkpoint.pt"
#: Settings that may change between a run and its resumption.
RESUMABLE = ("rounds", "budget", "stop_when_stable")


def path(directory: str | os.PathLike) -> Path:
    """The checkpoint file of ``directory``, or a ``TypeError`` unless it is a path (a string or ``os.PathLike``)."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"checkpoint_dir must be a path (a string or os.PathLike), got {directory!r}")
    return Path(directory) / FILE


def write(
    file: Path, fingerprint: dict, history: list[dict], flow: torch.nn.Module, data: dict, probe: dict
) -> None:
    """Seal the run's state into ``file`` (atomically; tensors moved to the CPU)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": json.dumps(fingerprint),
        "history": json.dumps(history),
        "flow_shape": [flow.dim, flow.context_dim],
        "flow": {k: v.detach().cpu() for k, v in flow.state_dict().items()},
        "data": {k: v.cpu() for k, v in data.items()},
        "probe": probe,
    }
    save_sealed(payload, file)


def read(file: Path, device: torch.device) -> dict:
    """The payload of ``file`` with ``fingerprint`` and ``history`` decoded, tensors on ``device``; a
    ``ValueError`` naming the file for a damaged one or one of another format or version."""
    payload = load_sealed(file, "dpsbi checkpoint", map_location=device)
    if payload.get("format") != FORMAT or payload.get("version") != VERSION:
        raise ValueError(f"{file} is not a dpsbi checkpoint of version {VERSION}")
    fingerprint = json.loads(payload["fingerprint"])
    # settings a checkpoint written before they existed lacks: what it did then
    fingerprint["flow"] = {**FlowSettings.before, **fingerprint["flow"]}
    return {
        **payload,
        "fingerprint": fingerprint,
        "history": json.loads(payload["history"]),
    }


def mismatch(stored: dict, current: dict) -> list[str]:
    """``"field: stored vs current"`` for every fingerprint field other than :data:`RESUMABLE` that differs."""
    return differences(
        {k: v for k, v in stored.items() if k not in RESUMABLE},
        {k: v for k, v in current.items() if k not in RESUMABLE},
    )
