"""z-scoring of releases at their own privacy level, for flows conditioned on ``log epsilon``.

Releases at epsilon 0.1 and at 10 differ a hundredfold in spread: one z-scoring over all of them squeezes the
least noisy into a sliver of the flow's input, where the network must tell apart releases that it sees as
nearly equal (docs/RESULTS.md, "Why the narrow end fell short"). :class:`EpsilonStandardize` z-scores each release by
the mean and sd of the example releases drawn at its epsilon instead: an affine map of the release for each
epsilon, so the flow loses nothing, and releases at every epsilon of the range reach it on one scale.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

#: Equal bins of ``log epsilon`` over the examples' range; each holds its releases' mean and sd.
BINS = 8


class EpsilonStandardize(nn.Module):
    """z-scores a context ``(n, k + 1)`` whose last column is ``log epsilon`` and whose first ``k`` are a release.

    Built from example contexts: they are split into :data:`BINS` equal bins of ``log epsilon``, each bin's
    per-column mean and log sd are taken at its centre (a bin with fewer than two examples takes all the
    examples'), and both are smoothed by a quadratic in ``log epsilon`` fitted to the bins by least squares
    weighted by their counts (each bin's statistics carry Monte Carlo error: a map that wobbles with ``log
    epsilon`` is one more thing the flow must undo; measured on a small fit in tests/test_amortized.py). A
    context's release is z-scored by those values interpolated linearly in ``log epsilon`` between the centres
    (held at the outer centres' beyond them), its ``log epsilon`` by the examples' mean and sd. All
    tensors: no host read, batch shapes ``(..., k + 1)`` in and out; with ``both``, ``(..., 2k + 1)``: the release
    z-scored by all the examples at once comes first, then as above. The statistics are buffers (saved with the
    flow's ``state_dict``)."""

    def __init__(self, context: Tensor, both: bool = False, min_std: float = 1e-7) -> None:
        super().__init__()
        self.both = bool(both)
        release, log_eps = context[:, :-1], context[:, -1]
        self.register_buffer("overall_mean", release.mean(0))
        self.register_buffer("overall_std", release.std(0).clamp_min(min_std))
        low, high = log_eps.min(), log_eps.max()
        width = (high - low).clamp_min(1e-6) / BINS
        member = nn.functional.one_hot(((log_eps - low) / width).floor().clamp(0, BINS - 1).long(), BINS)
        member = member.to(release)  # (n, BINS)
        count = member.sum(0).unsqueeze(-1)  # (BINS, 1)
        mean = member.T @ release / count.clamp_min(1)
        var = member.T @ (release - member @ mean) ** 2 / (count - 1).clamp_min(1)
        few = count < 2
        mean = torch.where(few, release.mean(0), mean)
        std = torch.where(few, release.std(0), var.sqrt()).clamp_min(min_std)
        centres = low + width * (torch.arange(BINS, dtype=release.dtype) + 0.5)
        self.register_buffer("centres", centres)
        self.register_buffer("mean", _quadratic_fit(centres, mean, count))
        self.register_buffer("log_std", _quadratic_fit(centres, std.log(), count))
        self.register_buffer("eps_mean", log_eps.mean())
        self.register_buffer("eps_std", log_eps.std().clamp_min(min_std))

    def forward(self, context: Tensor) -> Tensor:
        release, log_eps = context[..., :-1], context[..., -1:]
        centres = self.centres.to(context.dtype)
        position = ((log_eps - centres[0]) / (centres[1] - centres[0])).clamp(0, BINS - 1)
        below = position.floor().clamp(max=BINS - 2)
        weight, below = position - below, below.long().squeeze(-1)
        mean, log_std = self.mean.to(context.dtype), self.log_std.to(context.dtype)
        centre = mean[below] * (1 - weight) + mean[below + 1] * weight
        scale = (log_std[below] * (1 - weight) + log_std[below + 1] * weight).exp()
        scaled_eps = (log_eps - self.eps_mean.to(context.dtype)) / self.eps_std.to(context.dtype)
        scaled = [(release - centre) / scale, scaled_eps]
        if self.both:
            overall = (release - self.overall_mean.to(context.dtype)) / self.overall_std.to(context.dtype)
            scaled.insert(0, overall)
        return torch.cat(scaled, -1)


def _quadratic_fit(x: Tensor, values: Tensor, count: Tensor) -> Tensor:
    """``values (bins, k)`` at ``x (bins,)`` replaced by their least-squares quadratic in ``x``, each bin weighted
    by ``count (bins, 1)`` (a bin with no examples by none): the projection on ``1, t, t^2`` orthonormalized under
    those weights (Gram-Schmidt in float64; a column the weighted bins cannot tell from the ones before adds
    nothing). Elementwise sums only: LAPACK's least squares (``torch.linalg.lstsq`` through MKL) varied in its last
    bits between calls with the same input, which made two fits of one seed in one process differ."""
    t = ((x - x.mean()) / x.std().clamp_min(1e-6)).double().unsqueeze(-1)  # (bins, 1)
    weight, target = count.double(), values.double()
    fit, basis = torch.zeros_like(target), []
    for column in (torch.ones_like(t), t, t * t):
        q = column
        for p in basis:
            q = q - p * (weight * p * q).sum(0)
        norm = (weight * q * q).sum(0)
        q = torch.where(norm > 1e-12 * (weight * column * column).sum(0), q / norm.sqrt(), 0.0)
        basis.append(q)
        fit = fit + q * (weight * q * target).sum(0)
    return fit.to(values.dtype)
