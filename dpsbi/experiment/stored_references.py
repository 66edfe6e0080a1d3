"""Reference posteriors computed once, kept in the repository (``dpsbi/data/references``), used without recomputing.

Each entry is a pair ``<stem>.csv`` (unweighted draws, one column per parameter, rows in random order) and
``<stem>.json`` (provenance: the task's full factory keywords, its :func:`~dpsbi.tasks.identity.identity`,
the release, how the draws were made, their ESS, the command, and the CSV's SHA-256). An entry is used for a
task only when every model keyword (all but ``y_obs`` and ``seed``), the identity and the release agree; a
CSV whose checksum or shape disagrees with its provenance is refused, never used.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import torch

from ..files import CorruptFileError, atomic_write_text
from ..tasks import Task, full_kwargs
from ..tasks.identity import differences, identity

#: Where the stored references live (package data).
STORE = Path(__file__).resolve().parents[1] / "data" / "references"
#: Factory keywords that pick the release rather than the model; compared through the release itself.
RELEASE_KEYS = ("y_obs", "seed")


def model_kwargs(task: Task) -> dict:
    """The task's factory keywords with defaults filled in, less :data:`RELEASE_KEYS`; JSON values."""
    kwargs = full_kwargs(task)
    return json.loads(json.dumps({k: v for k, v in kwargs.items() if k not in RELEASE_KEYS}, default=str))


def mismatches(provenance: dict, task: Task) -> list[str]:
    """Every way ``task`` differs from the task a stored entry was made for (empty: it applies)."""
    if task.spec is None or provenance["task"]["name"] != task.spec["name"]:
        return [f"task: {provenance['task']['name']} vs {None if task.spec is None else task.spec['name']}"]
    out = differences(provenance["task"]["kwargs"], model_kwargs(task), "kwargs")
    out += differences(provenance["identity"], identity(task), "identity")
    y_obs = None if task.y_obs is None else task.y_obs.reshape(-1).tolist()
    return out + differences(provenance["y_obs"], y_obs, "y_obs")


def write(stem: str, task: Task, draws: torch.Tensor, provenance: dict, store: Path = STORE) -> Path:
    """Store unweighted ``draws (n, dim_theta)`` of ``task``'s posterior as ``<store>/<stem>.csv`` and its
    provenance (``provenance`` plus the task's keywords, identity and release, the count, the parameter names and
    the CSV's checksum) as ``.json``."""
    store.mkdir(parents=True, exist_ok=True)
    buffer = io.StringIO()
    np.savetxt(
        buffer,
        draws.double().cpu().numpy(),
        fmt="%.9g",
        delimiter=",",
        header=",".join(task.parameter_names),
        comments="",
    )
    text = buffer.getvalue()
    record = {
        "task": {"name": task.spec["name"], "kwargs": model_kwargs(task)},
        "identity": identity(task),
        "y_obs": task.y_obs.reshape(-1).tolist(),
        "num_draws": int(draws.shape[0]),
        "parameter_names": list(task.parameter_names),
        **provenance,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
    atomic_write_text(store / f"{stem}.csv", text)
    atomic_write_text(store / f"{stem}.json", json.dumps(record, indent=2) + "\n")
    return store / f"{stem}.csv"


def provenance_of(csv: Path) -> dict:
    """The provenance beside ``csv``; :class:`~dpsbi.files.CorruptFileError` when it is not readable JSON."""
    path = csv.with_suffix(".json")
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptFileError(
            f"stored reference provenance {path} cannot be read ({error}): refusing the entry"
        ) from None


def read(csv: Path, provenance: dict | None = None) -> tuple[torch.Tensor, dict]:
    """Draws ``(n, dim_theta)`` (default float dtype) and provenance of the entry at ``csv`` (``provenance``: the
    one already read beside it); raises :class:`~dpsbi.files.CorruptFileError` when the file's checksum, width
    or length disagrees with the provenance."""
    provenance = provenance_of(csv) if provenance is None else provenance
    text = csv.read_text()
    if hashlib.sha256(text.encode()).hexdigest() != provenance["sha256"]:
        raise CorruptFileError(
            f"stored reference {csv} does not match the checksum in {csv.with_suffix('.json').name}: refusing it"
        )
    draws = torch.as_tensor(
        np.loadtxt(io.StringIO(text), delimiter=",", skiprows=1, ndmin=2), dtype=torch.get_default_dtype()
    )
    if tuple(draws.shape) != (provenance["num_draws"], len(provenance["parameter_names"])):
        raise CorruptFileError(
            f"stored reference {csv} has shape {tuple(draws.shape)}, its provenance says {provenance['num_draws']} draws"
        )
    return draws, provenance


def entries(store: Path = STORE) -> list[Path]:
    """The stored references' CSV files."""
    return sorted(store.glob("*.csv")) if store.is_dir() else []


def find(task: Task, store: Path = STORE) -> tuple[torch.Tensor, dict] | None:
    """Draws and provenance of the stored reference made for ``task`` (model, identity and release), else ``None``."""
    name = None if task.spec is None else task.spec["name"]
    for csv in entries(store):
        provenance = provenance_of(csv)
        if provenance["task"]["name"] == name and not mismatches(provenance, task):
            return read(csv, provenance)
    return None
