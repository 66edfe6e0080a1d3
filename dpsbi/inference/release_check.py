"""Is a release like the simulated releases a posterior was trained on? A flow evaluated at a release that no
simulation came near extrapolates, and can return a confident, wrong posterior without a sign. This module
checks a release against the training releases, per coordinate and jointly, and says in one line which
coordinates lie outside and how far: a warning, not a proof (a release inside the cloud can still be
misspecified, and a flagged one can be a rare draw of the model).

The statistics (:class:`TrainingReleases`) come from one release of every stored simulation, split in two
halves by row parity. The first half fixes the centre and scale: the mean and sd of every coordinate and the
whitening matrix ``W`` (inverse square root of the correlation matrix of the z-scored releases, shrunk towards
the identity by ``d / (d + n_fit)`` so that it exists for few simulations). The second half calibrates the two
statistics of a release ``y`` with ``z = (y - mean) / sd``:

- per coordinate: ``max_j |z_j|``, compared with its largest value over the calibration half
  (``coordinate_limit``); the coordinates beyond it are named;
- jointly: the Mahalanobis distance ``|W z|``, compared with its largest value over the calibration half
  (``distance_limit``).

A release drawn like the training releases (exchangeable with them: the prior predictive of an amortized fit)
exceeds the largest of ``m`` calibration values with probability ``1 / (m + 1)`` per statistic (a conformal
bound), so it is flagged with probability at most ``2 / (m + 1)``, ``m = floor(n / 2)``: 0.04 % for the
default 10 000 simulations, 2 % for 200 (:func:`false_alarm_bound`)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor


class ReleaseOutsideTraining(UserWarning):
    """A release lies outside the simulated releases a posterior was trained on (:mod:`dpsbi.inference.release_check`)."""


@contextlib.contextmanager
def outside_training_caught() -> Iterator[list[str]]:
    """Within it, every :class:`ReleaseOutsideTraining` warning is appended, as its one line, to the list it
    yields instead of being shown (for a caller that reports it its own way); other warnings are shown as before."""
    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always", ReleaseOutsideTraining)
        show = warnings.showwarning

        def divert(message, category, *args, **kwargs) -> None:
            if issubclass(category, ReleaseOutsideTraining):
                lines.append(str(message))
            else:
                show(message, category, *args, **kwargs)

        warnings.showwarning = divert
        yield lines


def false_alarm_bound(count: int) -> float:
    """The largest probability that a release drawn like ``count`` training releases is flagged."""
    return min(1.0, 2 / (count // 2 + 1))


@dataclass(frozen=True)
class Outside:
    """Which of ``B`` checked releases lie outside: ``coordinates (B, d)`` beyond the per-coordinate limit,
    ``joint (B,)`` beyond the distance limit, with the z-scores ``z (B, d)``, the whitened ``w (B, d)`` and the
    distances ``distance (B,)`` (CPU, float64)."""

    coordinates: Tensor
    joint: Tensor
    z: Tensor
    w: Tensor
    distance: Tensor

    @property
    def rows(self) -> Tensor:
        """``(B,)``: whether each release is flagged at all."""
        return self.coordinates.any(-1) | self.joint


@dataclass(frozen=True)
class TrainingReleases:
    """The statistics of ``count`` training releases of ``d`` coordinates that the release check needs (module
    docstring): per coordinate ``low``, ``high`` (range), ``mean``, ``sd``; the whitening ``whiten (d, d)``; the
    limits ``coordinate_limit`` and ``distance_limit``. CPU float64 tensors; :meth:`of` computes them.
    ``clamp (2, d)``: the bounds the flow clamps releases to (:meth:`~dpsbi.tasks.Task.release_bounds`), applied
    to the training releases and to every checked release first, so that the check sees what the flow sees."""

    count: int
    low: Tensor
    high: Tensor
    mean: Tensor
    sd: Tensor
    whiten: Tensor
    coordinate_limit: float
    distance_limit: float
    clamp: Tensor | None = None

    @classmethod
    @torch.no_grad()
    def of(cls, releases: Tensor, clamp: Tensor | None = None) -> TrainingReleases:
        """The statistics of ``releases (n, d)``, n >= 2, clamped to ``clamp (2, d)`` where given, computed on
        their device in float64 (one transfer of the results to the CPU at the end)."""
        y = releases.detach().double() if releases.device.type != "mps" else releases.detach().cpu().double()
        if clamp is not None:  # infinite bounds as float64's largest: files hold finite numbers
            huge = torch.finfo(torch.float64).max
            clamp = clamp.detach().cpu().double().clamp(-huge, huge)
            y = y.clamp(clamp[0].to(y.device), clamp[1].to(y.device))
        fit, calibration = y[0::2], y[1::2]
        mean, sd = fit.mean(0), fit.std(0, correction=0)
        sd = torch.where(sd > 0, sd, torch.ones_like(sd))
        z = (fit - mean) / sd
        d, n_fit = y.shape[-1], fit.shape[0]
        shrink = d / (d + n_fit)
        correlation = (1 - shrink) * (z.T @ z) / n_fit + shrink * torch.eye(d, dtype=y.dtype, device=y.device)
        values, vectors = torch.linalg.eigh(correlation)
        whiten = vectors @ torch.diag(values.clamp_min(1e-12).rsqrt()) @ vectors.T
        z_cal = (calibration - mean) / sd
        limits = torch.stack([z_cal.abs().amax(), (z_cal @ whiten).norm(dim=-1).amax()]).cpu()
        return cls(
            count=int(y.shape[0]),
            low=y.amin(0).cpu(),
            high=y.amax(0).cpu(),
            mean=mean.cpu(),
            sd=sd.cpu(),
            whiten=whiten.cpu(),
            coordinate_limit=float(limits[0]),
            distance_limit=float(limits[1]),
            clamp=clamp,
        )

    def outside(self, y: Tensor) -> Outside:
        """Where the releases ``y (B, d)`` (clamped as the training releases were) lie outside the training releases."""
        y = y.detach().cpu().double()
        if self.clamp is not None:
            y = y.clamp(self.clamp[0], self.clamp[1])
        z = (y - self.mean) / self.sd
        w = z @ self.whiten
        distance = w.norm(dim=-1)
        return Outside(z.abs() > self.coordinate_limit, distance > self.distance_limit, z, w, distance)

    def flags(self, y: Tensor, names: list[str]) -> list[str]:
        """Per release of ``y (B, d)``: ``""`` inside, else the names of its coordinates beyond the per-coordinate
        limit, space-separated, or ``"jointly: <name>"`` (the coordinate of the largest whitened part) when only
        the joint distance is beyond its limit."""
        outside = self.outside(y)
        return [self._flag(outside, b, names) for b in range(y.shape[0])]

    @staticmethod
    def _flag(outside: Outside, b: int, names: list[str]) -> str:
        coordinates = [names[j] for j in outside.coordinates[b].nonzero().flatten().tolist()]
        if coordinates:
            return " ".join(coordinates)
        return f"jointly: {names[int(outside.w[b].abs().argmax())]}" if bool(outside.joint[b]) else ""

    def warning(self, y: Tensor, names: list[str], who: str, what: str = "the release") -> str | None:
        """One line, starting with ``who``, about the releases ``y (B, d)`` (one: called ``what``) that lie outside
        the training releases, naming their coordinates and how far out they are; ``None`` if none does."""
        outside = self.outside(y)
        rows = outside.rows.nonzero().flatten().tolist()
        if not rows:
            return None
        y = y.detach().cpu().double()
        details = "; ".join(self._detail(outside, y, b, names) for b in rows[:3])
        if y.shape[0] > 1:
            shown = ", ".join(map(str, rows[:3])) + (f" and {len(rows) - 3} more" if len(rows) > 3 else "")
            what = f"{len(rows)} of {y.shape[0]} releases (row{'s' if len(rows) > 1 else ''} {shown})"
        return (
            f"{who}: {what} lie{'s' if y.shape[0] == 1 else ''} outside the {self.count} simulated releases the "
            f"flow is trained on: {details}. There the posterior extrapolates and can be confidently wrong: check "
            "the simulator, the mechanism and the release (a warning, not a proof)"
        )

    def _detail(self, outside: Outside, y: Tensor, b: int, names: list[str]) -> str:
        """What is outside in release ``b``: each flagged coordinate's value, the training range and its distance
        from the training mean in training sds; else the Mahalanobis distance against its limit."""
        prefix = f"row {b}: " if y.shape[0] > 1 else ""
        flagged = outside.coordinates[b].nonzero().flatten().tolist()
        seen = y[b] if self.clamp is None else y[b].clamp(self.clamp[0], self.clamp[1])
        if flagged:
            return prefix + ", ".join(
                f"{names[j]} = {float(y[b, j]):.4g}"
                + (f", clamped to {float(seen[j]):.4g}" if seen[j] != y[b, j] else "")
                + f" (training releases span [{float(self.low[j]):.4g}, "
                f"{float(self.high[j]):.4g}]; {float(outside.z[b, j].abs()):.3g} sds from their mean, where "
                f"they reach {self.coordinate_limit:.3g})"
                for j in flagged
            )
        return prefix + (
            f"jointly, Mahalanobis distance {float(outside.distance[b]):.3g} where the training releases reach "
            f"{self.distance_limit:.3g} (most off: {self._flag(outside, b, names).split(': ')[1]})"
        )

    def to_dict(self) -> dict:
        """JSON-able form (the posterior file's ``training_releases``)."""
        return {
            "count": self.count,
            "low": self.low.tolist(),
            "high": self.high.tolist(),
            "mean": self.mean.tolist(),
            "sd": self.sd.tolist(),
            "whiten": self.whiten.tolist(),
            "coordinate_limit": self.coordinate_limit,
            "distance_limit": self.distance_limit,
            "clamp": None if self.clamp is None else self.clamp.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> TrainingReleases:
        """The inverse of :meth:`to_dict` (``clamp`` absent from files written before it existed)."""
        tensors = {
            k: torch.tensor(data[k], dtype=torch.float64) for k in ("low", "high", "mean", "sd", "whiten")
        }
        clamp = data.get("clamp")
        tensors["clamp"] = None if clamp is None else torch.tensor(clamp, dtype=torch.float64)
        return cls(
            count=int(data["count"]),
            coordinate_limit=float(data["coordinate_limit"]),
            distance_limit=float(data["distance_limit"]),
            **tensors,
        )
