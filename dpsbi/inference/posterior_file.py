"""The posterior file format (version 2): a sealed ``torch.save`` dict (:func:`dpsbi.files.save_sealed`: its
content carries a SHA-256 checksum) of ``format``, ``version``, the flow's ``state_dict`` and JSON ``meta``:
``kind`` (``flow`` | ``likelihood``), ``method``, ``task`` (name and keyword arguments for
:func:`dpsbi.tasks.load`, or ``None``), ``identity`` (:func:`dpsbi.tasks.identity.identity`), ``simulator``
(:func:`dpsbi.tasks.identity.simulator_probe` as lists; files without it load with a warning), ``y_obs``,
``default_x`` (the release set by ``set_default_x``; optional, files without it load as before), ``flow``
(config, dim, context_dim), ``options`` (the posterior class's keywords, e.g. ``amortized``,
``epsilon_range``) and ``training_releases`` (the release check's statistics,
:meth:`~dpsbi.inference.release_check.TrainingReleases.to_dict`; optional, files without it load unchecked).
Reading refuses, with a ``ValueError`` naming the file, anything damaged, of another format version, of an
unknown kind, with non-finite weights, or made for another model (or simulator) than the task it is loaded with.
The posterior classes (:mod:`dpsbi.inference.posterior`) build the metadata and rebuild themselves from it."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Collection

import torch

from ..files import CorruptFileError, load_sealed, save_sealed
from ..tasks import Task
from ..tasks.identity import SIMULATOR_PROBE_SEED, differences, identity
from ..tasks.identity import check_simulator as check_probe
from .release_check import TrainingReleases

FORMAT = "dpsbi-posterior"
VERSION = 2
#: What a posterior file is called in messages.
WHAT = "dpsbi posterior file"


def write(path: str | os.PathLike, meta: dict, state: dict) -> None:
    """Seal ``meta`` (JSON-able) and the flow's ``state`` (tensors, moved to the CPU) into ``path``."""
    state = {k: v.detach().cpu() for k, v in state.items()}
    save_sealed({"format": FORMAT, "version": VERSION, "meta": json.dumps(meta), "state_dict": state}, path)


def _task_arguments(value):
    """Task keyword arguments as JSON values (tensors and tuples become lists)."""
    if torch.is_tensor(value):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_task_arguments(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _task_arguments(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(
        f"cannot record task argument {value!r} of type {type(value).__name__} in a posterior file"
    )


def task_spec(task: Task) -> dict | None:
    """How :func:`dpsbi.tasks.load` rebuilds ``task`` (name and JSON keyword arguments), or ``None``."""
    spec = task.spec
    return None if spec is None else {"name": spec["name"], "kwargs": _task_arguments(spec["kwargs"])}


def read(path: str | os.PathLike, device: torch.device, kinds: Collection[str]) -> tuple[dict, dict]:
    """Metadata and state_dict (on ``device``) of a posterior file of one of ``kinds``, or a ``ValueError``
    saying why it is refused; the metadata's ``training_releases`` as a :class:`TrainingReleases` (or ``None``)."""
    try:
        payload = load_sealed(path, WHAT, map_location=device)
    except CorruptFileError:
        version = _unsealed_version(path, device)
        if version is not None:  # files before version 2 carry no checksum: say so rather than "corrupt"
            _check_version(path, version)
        raise
    if payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a dpsbi posterior file (no {FORMAT!r} marker); refusing to load it")
    _check_version(path, payload.get("version"))
    try:
        meta = json.loads(payload["meta"])
        state = dict(payload["state_dict"])
        if meta["kind"] not in kinds:
            raise ValueError(f"unknown posterior kind {meta['kind']!r}")
        if not isinstance(meta["identity"], dict):
            raise ValueError("no task identity recorded")
        releases = meta.get("training_releases")  # absent from files written before the release check
        meta["training_releases"] = None if releases is None else TrainingReleases.from_dict(releases)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} is a damaged dpsbi posterior file ({error})") from None
    _check_finite(path, state)
    return meta, state


def _unsealed_version(path: str | os.PathLike, device: torch.device) -> object:
    """The format version recorded in a posterior file that has no valid checksum, or ``None`` if it cannot
    be read or is not a posterior file."""
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
    except Exception:  # unreadable: load_sealed's message says why
        return None
    return payload.get("version") if isinstance(payload, dict) and payload.get("format") == FORMAT else None


def _check_version(path: str | os.PathLike, version: object) -> None:
    """Refuse a posterior file of another format ``version`` than :data:`VERSION`."""
    if version != VERSION:
        raise ValueError(
            f"{path} has posterior format version {version!r}; this dpsbi reads version {VERSION} only "
            "(sealed with a checksum and the task's identity): train and save the posterior again"
        )


def _check_finite(path: str | os.PathLike, state: dict) -> None:
    """Refuse a state_dict with a NaN or inf in any floating-point tensor, naming the tensor."""
    for name, value in state.items():
        if torch.is_tensor(value) and value.is_floating_point():
            bad = int((~torch.isfinite(value)).sum())
            if bad:
                raise ValueError(
                    f"{path}: stored tensor {name!r} holds {bad} NaN/inf values (a diverged flow); refusing it"
                )


def check_identity(path: str | os.PathLike, stored: dict, task: Task, which: str) -> None:
    """Refuse ``task`` if its model differs from the one the posterior at ``path`` was trained for (``stored``)."""
    found = differences(stored, identity(task))
    if found:
        raise ValueError(
            f"{path} was trained for another model than {which}; refusing it. Differences (stored vs now): "
            + "; ".join(found)
        )


def check_simulator(path: str | os.PathLike, probe: dict | None, task: Task) -> None:
    """Refuse ``task`` if its simulator does not reproduce the ``probe`` recorded in the posterior file at
    ``path`` (``{"theta", "s"}`` as lists; ``{}`` when the task had no simulator, nothing to check); ``None``
    (a file written before probes were recorded) only warns that the simulator could not be checked."""
    if probe is None:
        warnings.warn(
            f"{path} was written before posterior files recorded the simulator: dpsbi cannot check that task "
            f"{task.name!r} has the simulator it was trained with (save it again to record it)",
            stacklevel=3,
        )
        return
    if not probe or task.simulator is None:
        return
    theta, s = (torch.tensor(probe[k], dtype=torch.get_default_dtype()) for k in ("theta", "s"))
    check_probe(task, theta, s, SIMULATOR_PROBE_SEED, str(path), "load it with the task it was trained for")
