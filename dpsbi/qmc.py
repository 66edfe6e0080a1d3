"""Randomized quasi-Monte Carlo uniforms: scrambled Sobol points, independently randomized per row."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

#: Bits of precision of the Sobol points (torch's SobolEngine uses 30).
BITS = 30


@functools.lru_cache(maxsize=64)
def _sobol_integers(m: int, d: int, device) -> Tensor:
    """The first ``m`` unscrambled Sobol points in ``d`` dims as ``BITS``-bit integers, shape ``(m, d)``;
    built once per ``(m, d, device)`` and kept there (not rebuilt on the host every training step)."""
    points = torch.quasirandom.SobolEngine(d, scramble=False).draw(m, dtype=torch.float64)
    return (points * (1 << BITS)).to(device=device, dtype=torch.int64)


def cell_points(m: int, d: int, device=None, dtype: torch.dtype | None = None) -> Tensor:
    """``m`` fixed points in ``[0, 1)^d``, shape ``(m, d)``: the first ``m`` unscrambled Sobol points shifted by
    ``1 / (2m)``, so each coordinate takes the midpoints of ``m`` equal strata (``m = 1``: the centre). A
    deterministic quadrature rule for averages over a cell."""
    if int(m) < 1 or m & (m - 1):
        raise ValueError(f"m must be a power of two, got {m}")
    points = torch.quasirandom.SobolEngine(d, scramble=False).draw(m, dtype=torch.float64)
    return ((points + 0.5 / m) % 1.0).to(device=device, dtype=dtype or torch.get_default_dtype())


def sobol(
    n: int,
    m: int,
    d: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Uniforms of shape ``(n, m, d)``: for each of the ``n`` rows, ``m`` Sobol points in ``[0, 1)^d``
    under its own random linear matrix scramble plus digital shift (Matousek 1998).

    Each row is an independent RQMC point set: every point is uniform on ``(0, 1)^d`` and the rows
    are independent, while the points within a row keep the net's balance. This scramble has the
    variance of Owen's nested scrambling (Owen 2003). Use ``m`` a power of two. Vectorized over rows:
    the only loop is over the ``BITS`` digit columns. ``generator`` seeds it on ``device``.
    """
    for name, value in (("n", n), ("m", m), ("d", d)):
        if int(value) < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    if d > torch.quasirandom.SobolEngine.MAXDIM:
        raise ValueError(f"Sobol points exist for d <= {torch.quasirandom.SobolEngine.MAXDIM}, got d={d}")
    device = (
        torch.device(device)
        if device is not None
        else (generator.device if generator else torch.device("cpu"))
    )
    x = _sobol_integers(m, d, device)  # (m, d)
    # Column j of a random unit-lower-triangular matrix, as an integer: the diagonal bit of digit j
    # and random bits below it. Digit j of x (value 2^-(j+1)) toggles this column in the result.
    out = torch.randint(0, 1 << BITS, (n, 1, d), generator=generator, device=device)  # digital shift
    for j in range(BITS):
        bit = BITS - 1 - j
        column = (1 << bit) | torch.randint(0, 1 << bit, (n, 1, d), generator=generator, device=device)
        out = out ^ (((x >> bit) & 1) * column)
    u = (out.to(torch.float64) + 0.5) / (1 << BITS)  # midpoints: strictly inside (0, 1)
    return u.to(dtype or torch.get_default_dtype())


def uniforms(
    n: int,
    m: int,
    d: int,
    qmc: bool = True,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """``(n, m, d)`` uniforms for integrating over mechanism noise: RQMC (:func:`sobol`) or plain MC."""
    if qmc:
        return sobol(n, m, d, generator=generator, device=device, dtype=dtype)
    device = (
        torch.device(device)
        if device is not None
        else (generator.device if generator else torch.device("cpu"))
    )
    return torch.rand(n, m, d, generator=generator, device=device, dtype=dtype or torch.get_default_dtype())
