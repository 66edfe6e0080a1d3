"""What identifies a task's model, so that saved files are only used with the model they were made for.

:func:`identity` describes a task as JSON values: its name, epsilon, dimensions, the mechanism with its
parameters, and the prior and bijection by their values at fixed seeded draws (two priors that differ
anywhere near their draws give different numbers). :func:`differences` compares two such descriptions
with a tolerance for float round-off and names every field that differs, with both values.

The simulator cannot be written down: :func:`simulator_probe` records a few parameters and their summaries
simulated under a fixed seed, and :func:`check_simulator` re-simulates them to refuse a file made by another
simulator (checkpoints, posterior files); :func:`model_key` joins prior and simulator for cache keys.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings

import torch
from torch import Tensor

from ..mechanisms import Mechanism
from ..seeds import seeded_global_streams
from .base import Task, prior_device

#: Number of seeded prior draws in a task's identity.
PROBE_DRAWS = 4
#: Relative tolerance of :func:`differences` on numbers (float32 round-off, not model changes).
RTOL = 1e-4
#: Parameters simulated in a probe of the simulator (:func:`simulator_probe`).
SIMULATOR_PROBE_ROWS = 2
#: Seed of the probe in posterior files and reference cache keys (checkpoints derive theirs from the run's seed).
SIMULATOR_PROBE_SEED = 20261126


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
    with seeded_global_streams(20261123):
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


def probe_theta(task: Task) -> Tensor:
    """The first :data:`SIMULATOR_PROBE_ROWS` of the prior's identity draws, ``(rows, dim_theta)``."""
    draws = prior_identity(task)["draws"][:SIMULATOR_PROBE_ROWS]
    return torch.tensor(draws, dtype=torch.get_default_dtype(), device=prior_device(task.prior))


def simulate_probe(task: Task, theta: Tensor, seed: int) -> Tensor:
    """Summaries ``(n, input_dim)`` of ``theta (n, dim_theta)`` simulated with a generator seeded by ``seed``."""
    return task.simulate(theta, torch.Generator(device=theta.device).manual_seed(seed))


def simulator_probe(task: Task, theta: Tensor | None = None, seed: int = SIMULATOR_PROBE_SEED) -> dict:
    """``{"theta", "s"}`` (CPU tensors): ``theta`` (default :func:`probe_theta`) and its summaries under
    ``seed``; ``{}`` for a task without a simulator."""
    if task.simulator is None:
        return {}
    theta = probe_theta(task) if theta is None else theta
    return {"theta": theta.cpu(), "s": simulate_probe(task, theta, seed).cpu()}


def check_simulator(task: Task, theta: Tensor, s: Tensor, seed: int, where: str, fix: str) -> None:
    """Re-simulate ``theta`` under ``seed``: a ``ValueError`` ``"{where} was simulated by another simulator ...;
    {fix}"`` if the summaries differ from the stored ``s`` while the simulator is reproducible (it changed); a
    warning if it does not reproduce its own output from its seed (then nothing can be checked)."""
    theta = theta.to(prior_device(task.prior), torch.get_default_dtype())
    again = simulate_probe(task, theta, seed)
    if torch.allclose(again, s.to(again), rtol=RTOL, atol=1e-6):
        return
    if not torch.allclose(simulate_probe(task, theta, seed), again, rtol=RTOL, atol=1e-6):
        warnings.warn(
            f"task {task.name!r}: the simulator does not reproduce its output from the generator it is given, "
            f"so dpsbi cannot check that {where} was simulated by it (and reruns are not reproducible)",
            stacklevel=3,
        )
        return
    raise ValueError(
        f"{where} was simulated by another simulator: at theta={theta[0].tolist()} the stored summary is "
        f"{s[0].tolist()} but task {task.name!r} now gives {again[0].tolist()}; {fix}"
    )


def model_key(task: Task) -> str:
    """16 hex digits of a SHA-256 over the prior's identity and the simulator's probe (values to 6 significant
    digits): it changes when the prior or the simulator does, as a cache key must."""
    probe = {k: _numbers(v) for k, v in simulator_probe(task).items()}
    text = json.dumps(_rounded({"prior": prior_identity(task), "simulator": probe}), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _rounded(value):
    """JSON ``value`` with every float rounded to 6 significant digits (round-off does not change a key)."""
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return float(f"{value:.6g}") if isinstance(value, float) else value


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
