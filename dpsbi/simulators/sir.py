"""Stochastic SIR epidemic: an exact Gillespie simulator (numba) and batched tau-leaping (torch).

The model is a continuous-time Markov jump process on ``(S, I, R)`` in a population of ``K``:
infection ``S -> I`` at rate ``beta S I / K`` and recovery ``I -> R`` at rate ``gamma I``, started
from ``I(0) = initial_infected``, ``S(0) = K - I(0)``, ``R(0) = 0``. Parameters are
``theta = (log beta, log gamma)`` of shape ``(n, 2)``; the simulators return the infected counts
``I(t)`` at the observation times, shape ``(n, T)``, or ``(S, I, R)`` of shape ``(n, T, 3)``
with ``return_all=True``.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from numba import njit, prange
from numba.cpython.unsafe.numbers import viewer
from numpy.typing import ArrayLike
from torch import Tensor

#: Observation times ``0, 17, ..., 153`` (T = 10), read-only.
DEFAULT_TIMES = np.arange(10, dtype=np.float64) * 17.0
DEFAULT_TIMES.setflags(write=False)

_MASK32 = np.uint64(0xFFFFFFFF)
_TWO_M32 = 2.0**-32
_LN2 = 0.6931471805599453
_SQRT_HALF_BITS = 0x3FE6A09E667F3BCD  # bit pattern of sqrt(1/2)
_MANTISSA = 0x000FFFFFFFFFFFFF


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def _check_theta_shape(shape: tuple[int, ...]) -> None:
    if len(shape) != 2 or shape[1] != 2:
        raise ValueError(f"theta must have shape (n, 2) = (log beta, log gamma), got {tuple(shape)}")


def _check_config(population: int, initial_infected: int, times: ArrayLike) -> np.ndarray:
    """Validate the model configuration; returns ``times`` as a float64 array of shape ``(T,)``."""
    if int(population) != population or population < 1:
        raise ValueError(f"population must be an integer >= 1, got {population}")
    if int(initial_infected) != initial_infected or not 1 <= initial_infected <= population:
        raise ValueError(
            f"initial_infected must be an integer in [1, population={population}], got {initial_infected}"
        )
    times = np.asarray(times, dtype=np.float64)
    if times.ndim != 1 or times.size == 0:
        raise ValueError(f"times must be a non-empty 1-D sequence, got shape {times.shape}")
    if not np.all(np.isfinite(times)) or np.any(times < 0):
        raise ValueError("times must be finite and non-negative")
    if np.any(np.diff(times) < 0):
        raise ValueError("times must be non-decreasing")
    return times


def _check_theta_tensor(theta: Tensor) -> None:
    _check_theta_shape(tuple(theta.shape))
    if not theta.is_floating_point():
        raise TypeError(f"theta must be a floating-point tensor, got {theta.dtype}")
    if not bool(torch.isfinite(theta).all()):
        raise ValueError("theta must be finite")


def _assemble(s: np.ndarray | Tensor, i: np.ndarray | Tensor, population: int, return_all: bool):
    """``I`` of shape ``(n, T)``, or ``(S, I, R)`` stacked to ``(n, T, 3)`` when ``return_all``."""
    if not return_all:
        return i
    stack = np.stack if isinstance(s, np.ndarray) else torch.stack
    return stack([s, i, population - s - i], -1)


# --------------------------------------------------------------------------------------------
# exact simulator: numba kernel
# --------------------------------------------------------------------------------------------


@njit(inline="always")
def _rotl(x: np.uint64, k: int) -> np.uint64:
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@njit(inline="always")
def _splitmix64(z: np.uint64) -> tuple[np.uint64, np.uint64]:
    """One step of splitmix64: returns the next state and its output."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    x = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z, x ^ (x >> np.uint64(31))


@njit(inline="always")
def _fast_log(u: float) -> float:
    """``log(u)`` for a normal positive float64, relative error below 3e-9, without branches.

    Splits ``u = 2^e m`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` by bit manipulation and evaluates
    ``log m = 2 atanh(s)``, ``s = (m - 1) / (m + 1)``, by its series to ``s^9``.
    """
    bits = viewer(u, numba.int64) - _SQRT_HALF_BITS
    m = viewer((bits & _MANTISSA) + _SQRT_HALF_BITS, numba.float64)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    series = 2.0 + s2 * (2.0 / 3.0 + s2 * (2.0 / 5.0 + s2 * (2.0 / 7.0 + s2 * (2.0 / 9.0))))
    return (bits >> 52) * _LN2 + s * series


@njit(fastmath=True)
def _gillespie_trajectory(
    beta: float,
    gamma: float,
    population: int,
    initial_infected: int,
    times: np.ndarray,
    seed: np.uint64,
    row: np.uint64,
    out: np.ndarray,
) -> None:
    """Simulate one trajectory; writes ``(S, I)`` at ``times`` (shape ``(T,)``) into ``out`` ``(T, 2)``.

    The random stream is xoshiro256** seeded by splitmix64 from ``(seed, row)``, so a row's output
    depends on nothing else. Each event takes one 64-bit draw: the low 32 bits decide the event
    type and the high 32 bits give the exponential waiting time (so each event's law is exact up to
    2^-32). The simulation stops at the last observation time or when ``I`` hits 0.
    """
    z, key = _splitmix64(seed)
    z = key + row
    z, s0 = _splitmix64(z)
    z, s1 = _splitmix64(z)
    z, s2 = _splitmix64(z)
    z, s3 = _splitmix64(z)
    beta_over_k = beta / population
    s, i = population - initial_infected, initial_infected
    t, k, n_times = 0.0, 0, times.shape[0]
    next_time = times[0]
    while i > 0:
        infection_rate = beta_over_k * s  # per infected individual
        total_rate = infection_rate + gamma
        x = _rotl(s1 * np.uint64(5), 7) * np.uint64(9)  # xoshiro256** output and state update
        shifted = s1 << np.uint64(17)
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= shifted
        s3 = _rotl(s3, 45)
        u_type = np.int64(x & _MASK32) * _TWO_M32  # in [0, 1)
        u_wait = (np.int64(x >> np.uint64(32)) + 0.5) * _TWO_M32  # in (0, 1)
        t -= _fast_log(u_wait) / (i * total_rate)
        while t > next_time:  # the state before this event holds at next_time
            out[k, 0], out[k, 1] = s, i
            k += 1
            if k == n_times:
                return
            next_time = times[k]
        infected = np.int64(u_type * total_rate < infection_rate)
        s -= infected
        i += 2 * infected - 1
    while k < n_times:  # extinct: the state is frozen
        out[k, 0], out[k, 1] = s, 0
        k += 1


@njit(parallel=True, fastmath=True, cache=True)
def _gillespie_batch(
    theta: np.ndarray, population: int, initial_infected: int, times: np.ndarray, seed: np.uint64
) -> np.ndarray:
    """``(S, I)`` at ``times`` for each row of ``theta`` ``(n, 2)``: shape ``(n, T, 2)`` int64."""
    n = theta.shape[0]
    out = np.empty((n, times.shape[0], 2), dtype=np.int64)
    for row in prange(n):
        _gillespie_trajectory(
            math.exp(theta[row, 0]),
            math.exp(theta[row, 1]),
            population,
            initial_infected,
            times,
            seed,
            np.uint64(row),
            out[row],
        )
    return out


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def gillespie_sir(
    theta: ArrayLike,
    population: int = 1_000_000,
    initial_infected: int = 1,
    times: ArrayLike = DEFAULT_TIMES,
    seed: int | None = None,
    return_all: bool = False,
) -> np.ndarray:
    """Exact (Gillespie) SIR simulation, parallel over the rows of ``theta``.

    ``theta`` has shape ``(n, 2)`` (log beta, log gamma). Returns int64 ``I(t)`` of shape ``(n, T)``,
    or ``(S, I, R)`` of shape ``(n, T, 3)`` when ``return_all``. Row ``j`` uses a random stream
    derived from ``(seed, j)``: a given seed gives the same output whatever the thread count.
    ``seed=None`` draws fresh entropy.
    """
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    _check_theta_shape(theta.shape)
    if not np.all(np.isfinite(theta)):
        raise ValueError("theta must be finite")
    times = _check_config(population, initial_infected, times)
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
    elif int(seed) != seed:
        raise TypeError(f"seed must be an integer, got {seed!r}")
    out = _gillespie_batch(theta, int(population), int(initial_infected), times, np.uint64(int(seed) % 2**64))
    return _assemble(out[..., 0], out[..., 1], int(population), return_all)


def simulate_sir(
    theta: Tensor,
    population: int = 1_000_000,
    initial_infected: int = 1,
    times: ArrayLike = DEFAULT_TIMES,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Torch front end of :func:`gillespie_sir`: ``I(t)`` of shape ``(n, T)``, theta's dtype/device.

    The kernel's seed is drawn from ``generator`` (or torch's global RNG), so a seeded generator
    reproduces the output. The simulation runs on the CPU.
    """
    _check_theta_tensor(theta)
    device = generator.device if generator is not None else None
    seed = int(torch.randint(2**63 - 1, (), generator=generator, device=device))
    counts = gillespie_sir(theta.detach().cpu().double().numpy(), population, initial_infected, times, seed)
    return torch.from_numpy(counts).to(device=theta.device, dtype=theta.dtype)


def _phi(x: Tensor) -> Tensor:
    """``expm1(x) / x`` elementwise (1 at 0), for ``x <= 50``: the mean of ``e^{x u}``, ``u ~ U(0, 1)``."""
    x = x.clamp(max=50.0)
    small = x.abs() < 1e-3
    safe = torch.where(small, torch.ones_like(x), x)
    return torch.where(small, 1 + x / 2 + x * x / 6, torch.expm1(safe) / safe)


def tau_leap_sir(
    theta: Tensor,
    population: int = 1_000_000,
    initial_infected: int = 1,
    times: ArrayLike = DEFAULT_TIMES,
    dt: float = 0.1,
    generator: torch.Generator | None = None,
    return_all: bool = False,
) -> Tensor:
    """Approximate SIR simulation by binomial tau-leaping, batched over the rows of ``theta`` ``(n, 2)``.

    Each interval between observation times is cut into equal steps of length ``h <= dt``. Within a step ``S``
    is held at its start and ``I`` follows the linear equation ``I' = r I``, ``r = beta S / K - gamma``,
    so that the step's exposure is ``E = I h phi(r h)`` with ``phi(x) = expm1(x) / x``; per step
    ``new infections ~ Bin(S, 1 - exp(-beta E / K))`` and ``recoveries ~ Bin(I, min(1, gamma E / I))``, so
    counts stay non-negative, ``S + I + R = K``, and the mean growth of a small outbreak is exact
    (``I e^{r h}`` a step). Exposures taken from the step's start alone (``E = I h``) grow it by ``1 + r h`` a
    step, a rate ``r h / 2`` too slow: at ``dt = 0.1`` that moved the epsilon-10 SIR posterior's log beta 0.46
    reference sds (docs/RESULTS.md, "SIR's tau-leaping step"). Without infections (``beta -> 0``) recoveries
    are exactly ``Bin(I, 1 - exp(-gamma h))``. Runs on theta's device in theta's dtype (counts are exact
    integers in float32 for ``K < 2^24``). Returns ``I(t)`` of shape ``(n, T)``, or ``(S, I, R)`` of shape
    ``(n, T, 3)`` when ``return_all``.
    """
    _check_theta_tensor(theta)
    times = _check_config(population, initial_infected, times)
    if not (math.isfinite(dt) and dt > 0):
        raise ValueError(f"dt must be positive and finite, got {dt}")
    beta, gamma = theta[:, 0].exp(), theta[:, 1].exp()
    s = torch.full_like(beta, population - initial_infected)
    i = torch.full_like(beta, initial_infected)
    s_out = torch.empty(theta.shape[0], times.size, dtype=theta.dtype, device=theta.device)
    i_out = torch.empty_like(s_out)
    start = 0.0
    for k, stop in enumerate(times.tolist()):
        n_steps = math.ceil((stop - start) / dt)
        if n_steps > 0:
            h = (stop - start) / n_steps
            for _ in range(n_steps):
                span = h * _phi((beta * s / population - gamma) * h)  # E / I: h weighted by I's growth
                p_infect = -torch.expm1(-beta * i * span / population)
                infections = torch.binomial(s, p_infect, generator=generator)
                recoveries = torch.binomial(i, (gamma * span).clamp(max=1.0), generator=generator)
                s, i = s - infections, i + infections - recoveries
        s_out[:, k], i_out[:, k] = s, i
        start = stop
    return _assemble(s_out, i_out, int(population), return_all)
