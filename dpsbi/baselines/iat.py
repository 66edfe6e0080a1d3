"""Integrated autocorrelation time of MCMC output (Sokal's adaptive window)."""

from __future__ import annotations

import torch
from torch import Tensor


def _as_chains(chain: Tensor) -> Tensor:
    """``chain`` of shape ``(T,)``, ``(T, d)`` or ``(C, T, d)`` as ``(C, T, d)``."""
    chain = torch.as_tensor(chain)
    if chain.ndim == 1:
        chain = chain[:, None]
    if chain.ndim == 2:
        chain = chain[None]
    if chain.ndim != 3 or chain.shape[1] < 2:
        raise ValueError(
            f"chain must be (T,), (T, d) or (C, T, d) with T >= 2, got shape {tuple(chain.shape)}"
        )
    return chain if chain.is_floating_point() else chain.to(torch.get_default_dtype())


def autocorrelation(chain: Tensor) -> Tensor:
    """Autocorrelation ``rho_k (T, d)``, k = 0..T-1, of ``chain`` ((T,), (T, d) or (C, T, d) for C chains):
    the chains' autocovariances (each about its own mean, divided by T, computed by FFT) averaged, then
    divided by the lag-0 value. Constant chains give NaN."""
    x = _as_chains(chain)
    t = x.shape[1]
    centred = x - x.mean(1, keepdim=True)
    spectrum = torch.fft.rfft(centred, n=2 * t, dim=1)
    acov = torch.fft.irfft(spectrum.abs() ** 2, n=2 * t, dim=1)[:, :t].mean(0) / t
    return acov / acov[:1]


def integrated_autocorrelation_time(chain: Tensor, c: float = 5.0) -> Tensor:
    """Integrated autocorrelation time ``tau = 1 + 2 sum_{k=1}^{M} rho_k`` per coordinate, ``(d,)``.

    The window ``M`` is Sokal's: the smallest ``M >= c tau(M)`` (Alparslan & Yildirim's code uses c = 6).
    ``chain`` is ``(T,)``, ``(T, d)`` or ``(C, T, d)``; several chains share one averaged autocorrelation.
    ``tau`` is ``inf`` for a chain that never moves. The variance of the mean of T draws is
    ``tau * Var / T``, so ``T / tau`` is the effective sample size.
    """
    if c <= 0:
        raise ValueError(f"the window factor c must be > 0, got {c}")
    rho = autocorrelation(chain)
    taus = 2 * rho.cumsum(0) - 1  # tau(M) for M = 0..T-1
    lags = torch.arange(rho.shape[0], device=rho.device, dtype=rho.dtype)[:, None]
    short = lags < c * taus
    window = torch.where(short.all(0), rho.shape[0] - 1, short.int().argmin(0))
    tau = taus.gather(0, window[None]).squeeze(0)
    return torch.where(torch.isnan(tau), torch.inf, tau)


def effective_sample_size(chain: Tensor, c: float = 5.0) -> Tensor:
    """``C T / tau`` per coordinate, ``(d,)``, for ``chain`` as in :func:`integrated_autocorrelation_time`."""
    x = _as_chains(chain)
    return x.shape[0] * x.shape[1] / integrated_autocorrelation_time(x, c)
