"""What identifies a task's model, so that saved files are only used with the model they were made for.

:func:`identity` describes a task as JSON values: its name, epsilon, dimensions, the mechanism with its
parameters, and the prior and bijection by their values at fixed seeded draws (two priors that differ
anywhere near their draws give different numbers). :func:`differences` compares two such descriptions
with a tolerance for float round-off and names every field that differs, with both values.
"""

from __future__ import annotations

import math

import torch

from ..mechanisms import Mechanism
from .base import Task

#: Number of seeded prior draws in a task's identity.
PROBE_DRAWS = 4
#: Relative tolerance of :func:`differences` on numbers (float32 round-off, not model changes).
RTOL = 1e-4


def mechanism_identity(mechanism: Mechanism) -> dict:
    """The mechanism's type and its public parameters: numbers (epsilon, delta, sensitivity, scale, ...),
    per-coordinate tuples of numbers (as lists), and the blocks of a composition (each block's identity, a
    post-processed block's with its inner mechanism and step)."""
    params = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in sorted(vars(mechanism).items())
        if not k.startswith("_") and (isinstance(v, (bool, int, float, str)) or _numbers_tuple(v))
    }
    blocks = getattr(mechanism, "blocks", None)
    if isinstance(blocks, (list, tuple)) and all(isinstance(b, Mechanism) for b in blocks):
        params["blocks"] = [_block_identity(b) for b in blocks]
    return {"type": type(mechanism).__name__, **params}


def _block_identity(block: Mechanism) -> dict:
    out = mechanism_identity(block)
    inner, step = getattr(block, "inner", None), getattr(block, "step", None)
    if isinstance(inner, Mechanism):
        out.update(inner=_block_identity(inner), step=getattr(step, "name", repr(step)))
    return out


def _numbers_tuple(value) -> bool:
    return isinstance(value, tuple) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    )


def prior_identity(task: Task) -> dict:
    """The prior's type, ``PROBE_DRAWS`` draws from it under a fixed seed, their log densities and their
    images in the unconstrained space (which fingerprint the bijection)."""
    device = task.prior.mean.device if _has_mean(task.prior) else torch.device("cpu")
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(20261123)
        theta = task.prior.sample((PROBE_DRAWS,))
    return {
        "type": type(task.prior).__name__,
        "draws": _numbers(theta),
        "log_prob": _numbers(task.prior.log_prob(theta)),
        "unconstrained": _numbers(task.transform.inv(theta)),
    }


def identity(task: Task) -> dict:
    """Name, epsilon, dimensions, mechanism and prior of ``task`` as JSON values."""
    return {
        "name": task.name,
        "epsilon": None if task.epsilon is None else float(task.epsilon),
        "dim_theta": task.dim_theta,
        "dim_s": task.dim_s,
        "mechanism": mechanism_identity(task.mechanism),
        "prior": prior_identity(task),
    }


def differences(stored, current, path: str = "") -> list[str]:
    """``"field: stored vs current"`` for every field where two JSON values differ (numbers: beyond
    :data:`RTOL`); empty when they agree."""
    if isinstance(stored, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(stored) | set(current)):
            out += differences(stored.get(key), current.get(key), f"{path}.{key}" if path else str(key))
        return out
    if isinstance(stored, list) and isinstance(current, list):
        a, b = _flat(stored), _flat(current)
        same = len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
        return [] if same else [f"{path}: {_short(stored)} vs {_short(current)}"]
    return [] if _close(stored, current) else [f"{path}: {_short(stored)} vs {_short(current)}"]


def _close(a, b) -> bool:
    if (
        isinstance(a, bool)
        or isinstance(b, bool)
        or not (isinstance(a, (int, float)) and isinstance(b, (int, float)))
    ):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=RTOL * 1e-3)


def _flat(value) -> list:
    return [x for v in value for x in _flat(v)] if isinstance(value, list) else [value]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _numbers(t: torch.Tensor) -> list:
    return t.detach().double().cpu().tolist()


def _has_mean(prior) -> bool:
    try:
        return torch.is_tensor(prior.mean)
    except NotImplementedError:
        return False
