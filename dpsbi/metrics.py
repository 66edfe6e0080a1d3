"""Distances between posterior sample sets (C2ST, MMD)."""

from __future__ import annotations

import torch
from sbi.utils.metrics import c2st as _sbi_c2st
from sbi.utils.metrics import unbiased_mmd_squared
from torch import Tensor


def _check_pair(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"samples must be (n, d) and (m, d) with the same d, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] < 2 or b.shape[0] < 2:
        raise ValueError("each sample set needs at least 2 draws")
    return a.detach().float().cpu(), b.detach().float().cpu()


def c2st(a: Tensor, b: Tensor, seed: int = 1, classifier: str = "rf", n_folds: int = 5) -> float:
    """Classifier two-sample test accuracy between draws ``a (n, d)`` and ``b (m, d)``: 0.5 means
    indistinguishable, 1.0 fully separable (sbi's z-scored cross-validated classifier)."""
    a, b = _check_pair(a, b)
    return float(_sbi_c2st(a, b, seed=seed, n_folds=n_folds, classifier=classifier))


def mmd(a: Tensor, b: Tensor, scale: float | None = None) -> float:
    """Unbiased squared MMD between ``a (n, d)`` and ``b (m, d)`` with a Gaussian kernel (median-heuristic
    length scale unless ``scale`` is given)."""
    a, b = _check_pair(a, b)
    return float(unbiased_mmd_squared(a, b, scale=scale))
