"""Mechanisms at other privacy levels: ``with_epsilon``, for one epsilon or a tensor of them.

A mechanism family with ``with_epsilon(epsilon)`` gives the same mechanism (sensitivity, dimension, delta,
calibration) calibrated at another ``epsilon``. The families whose ``batched_epsilon`` is true (Laplace,
Gaussian, DiscreteLaplace, DiscreteGaussian, BinomialCurve, RandomizedResponse) also take a tensor of epsilons that broadcasts
with the batch of summaries, e.g. ``(n, 1)`` for ``s (n, dim)``: the result is one mechanism whose noise
scale is a tensor, so that ``sample(s, u)`` draws row ``i``'s release at ``epsilon[i]`` in one vectorized call.
That is what training a posterior over a range of epsilons needs (``SPPE(task, amortized=True,
epsilon_range=(low, high))``). Such a batched mechanism is for drawing releases (``sample``, ``transform``);
its densities are not defined, and its ``repr`` shows the per-row values. :func:`at_epsilons` builds it for any
mechanism, post-processed ones included, or refuses the family in one line (:func:`epsilon_range_problem`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Mechanism


def readable(values: Tensor) -> bool:
    """Whether ``values`` can be read on the host without waiting for a device or breaking a compiled graph: a tensor
    on the CPU outside ``torch.compile``. Per-row calibrations check their values only then; a training step
    re-calibrates on the device, at epsilons the estimator's range check has vouched for."""
    return values.device.type == "cpu" and not torch.compiler.is_compiling()


def epsilons(epsilon) -> Tensor:
    """``epsilon`` as a floating tensor of finite positive values; a ``TypeError`` for what is not numbers (a
    string, a bool), a ``ValueError`` for values that are not finite and > 0. The values are read on the host
    only where :func:`readable`: a training step re-calibrates the mechanism at its
    rows' epsilons on the device without waiting for it (those were drawn inside the estimator's range; a
    posterior checks the epsilons it is given against its own range first)."""
    try:
        eps = torch.as_tensor(epsilon)
    except (TypeError, ValueError, RuntimeError):
        eps = None
    if eps is None or eps.dtype == torch.bool or eps.is_complex():
        raise TypeError(
            f"epsilon must be a number or a tensor of numbers, got {epsilon!r} ({type(epsilon).__name__}); "
            "pass e.g. epsilon=1.0"
        )
    eps = eps if eps.is_floating_point() else eps.to(torch.get_default_dtype())
    if eps.numel() == 0:
        raise ValueError("epsilon must hold finite numbers > 0, got none")
    if not readable(eps):
        return eps
    if not bool((torch.isfinite(eps) & (eps > 0)).all()):
        raise ValueError(f"epsilon must hold finite numbers > 0, got {eps.flatten()[:5].tolist()}")
    return eps


def epsilon_limits(mechanism: Mechanism) -> tuple[float, float] | None:
    """The open interval ``(low, high)`` of epsilons ``mechanism``'s family can be re-calibrated at inside a
    training step (its ``epsilon_limits``, through post-processing), or ``None`` where any positive epsilon will
    do: a step cannot check its rows' epsilons without waiting for the device, so a fit's range is checked first."""
    from .postprocessing import PostProcessed

    if isinstance(mechanism, PostProcessed):
        return epsilon_limits(mechanism.inner)
    return getattr(mechanism, "epsilon_limits", None)


def batched_copy(mechanism: Mechanism, epsilon: Tensor, **attributes) -> Mechanism:
    """A copy of ``mechanism`` with ``epsilon`` (a tensor) and the noise ``attributes`` that follow from it."""
    out = object.__new__(type(mechanism))  # not copy.copy, which torch.compile (2.11) refuses to trace
    for key, value in {**vars(mechanism), "epsilon": epsilon, **attributes}.items():
        setattr(out, key, value)
    return out


def nominal_epsilon(mechanism: Mechanism) -> float:
    """The epsilon that ``mechanism.with_epsilon`` takes and that gives ``mechanism`` back: its target for a
    :class:`~dpsbi.mechanisms.BinomialCurve` (calibrated from ``M = T N / epsilon``), else its ``epsilon``."""
    return float(getattr(mechanism, "target_epsilon", mechanism.epsilon))


def epsilon_range_problem(mechanism: Mechanism) -> str | None:
    """Why ``mechanism`` cannot draw each release at its own epsilon (:func:`at_epsilons`), or ``None``."""
    from .postprocessing import PostProcessed

    if isinstance(mechanism, PostProcessed):
        return epsilon_range_problem(mechanism.inner)
    problem = getattr(mechanism, "epsilon_range_problem", None)
    if problem:
        return f"{mechanism!r}: {problem}"
    if not callable(getattr(mechanism, "with_epsilon", None)):
        return f"{mechanism!r} has no with_epsilon: dpsbi cannot re-calibrate its noise at another epsilon"
    if not getattr(mechanism, "batched_epsilon", False):
        return (
            f"{type(mechanism).__name__}.with_epsilon takes one epsilon at a time, not one per simulation "
            "(families that do: Laplace, Gaussian, DiscreteLaplace, DiscreteGaussian, BinomialCurve, RandomizedResponse)"
        )
    return None


def at_epsilons(mechanism: Mechanism, epsilon: Tensor) -> Mechanism:
    """``mechanism`` re-calibrated at the tensor ``epsilon`` (broadcasting with the batch of summaries it will
    be given): one mechanism whose ``sample(s, u)`` draws every row at its own epsilon. Post-processing steps
    are kept (applied to the re-calibrated inner mechanism). ``ValueError`` in one line for a family that
    cannot (:func:`epsilon_range_problem`)."""
    from .postprocessing import PostProcessed

    epsilon = epsilons(epsilon)
    if isinstance(mechanism, PostProcessed):
        return batched_copy(mechanism, epsilon, inner=at_epsilons(mechanism.inner, epsilon))
    problem = epsilon_range_problem(mechanism)
    if problem:
        raise ValueError(problem)
    return mechanism.with_epsilon(epsilon)


def log_uniform(
    low: float, high: float, n: int, generator: torch.Generator | None = None, device=None
) -> Tensor:
    """``n`` epsilons drawn log-uniformly in ``[low, high]`` (torch's default float dtype)."""
    u = torch.rand(n, generator=generator, device=device)
    return torch.exp(math.log(low) + (math.log(high) - math.log(low)) * u)
