"""The task's parameter space as the flows see it: unconstrained ``z`` with ``theta = transform(z)``."""

from __future__ import annotations

import copy
import io

import torch
from torch import Tensor
from torch.distributions import Distribution

from ..seeds import seeded_global_streams
from ..tasks import Task


class ParameterSpace:
    """A task's prior pushed to the unconstrained space ``R^dim_unconstrained`` of ``task.transform``.

    Densities in ``z`` carry the log-determinant of the transform: ``log p_z(z) = log p(T(z)) + log|det T'(z)|``.
    Computations touching the prior run on the prior's device; results return on the input's device.
    """

    def __init__(self, task: Task) -> None:
        self.prior, self.transform = task.prior, task.transform
        self.device = task.prior.mean.device

    def on(self, device: torch.device | str) -> ParameterSpace:
        """This space with a copy of its prior and transform on ``device``, the prior's argument checks off: there
        :meth:`log_prior_z` reads nothing back to the host (no copy to the prior's device, no support check: ``z``
        maps into the support). ``self`` where they live on ``device`` already; also ``self`` (densities evaluated
        on the prior's device, as before) where the prior cannot be copied (not picklable) or its copy disagrees
        with it at a prior draw."""
        device = torch.device(device)
        if device == self.device:
            return self
        space = self.copied_to(device)
        if space is None:
            return self
        with seeded_global_streams(0):  # the user's global stream untouched
            z = self.to_z(self.prior.sample((2,)))
        try:
            copied = space.log_prior_z(z.to(device)).cpu()
        except Exception:  # noqa: BLE001 - a copy that does not evaluate there keeps the prior's device
            return self
        return space if torch.allclose(copied, self.log_prior_z(z), equal_nan=True) else self

    def copied_to(self, device: torch.device) -> ParameterSpace | None:
        """:meth:`on`'s copy, unchecked; ``None`` where the prior and transform do not pickle."""
        try:
            buffer = io.BytesIO()
            torch.save((self.prior, self.transform), buffer)
            buffer.seek(0)
            prior, transform = torch.load(buffer, map_location=device, weights_only=False)
        except Exception:  # noqa: BLE001 - any object graph that does not pickle keeps the prior's device
            return None
        _stop_checking(prior)
        space = copy.copy(self)
        space.prior, space.transform, space.device = prior, transform, device
        return space

    def to_theta(self, z: Tensor) -> Tensor:
        """``theta = T(z)``, shape ``(..., dim_theta)``."""
        return self.transform(z)

    def to_z(self, theta: Tensor) -> Tensor:
        """``z = T^-1(theta)``, shape ``(..., dim_unconstrained)``."""
        return self.transform.inv(theta)

    def log_abs_det(self, z: Tensor) -> Tensor:
        """``log|det dT/dz|`` of shape ``z.shape[:-1]``."""
        ldj = self.transform.log_abs_det_jacobian(z, self.transform(z))
        return ldj.sum(-1) if ldj.ndim == z.ndim else ldj

    def log_prior_z(self, z: Tensor) -> Tensor:
        """Prior log density in ``z``, shape ``z.shape[:-1]``."""
        zp = z.to(self.device)
        return (self.prior.log_prob(self.transform(zp)) + self.log_abs_det(zp)).to(z.device)


def _stop_checking(prior: Distribution) -> None:
    """Turn off the argument and support checks of ``prior`` and every distribution it holds (a check reads its
    result back to the host)."""
    prior._validate_args = False
    for value in vars(prior).values():
        for member in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(member, Distribution):
                _stop_checking(member)
