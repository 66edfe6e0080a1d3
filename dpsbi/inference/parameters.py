"""The task's parameter space as the flows see it: unconstrained ``z`` with ``theta = transform(z)``."""

from __future__ import annotations

from torch import Tensor

from ..tasks import Task


class ParameterSpace:
    """A task's prior pushed to the unconstrained space ``R^dim_unconstrained`` of ``task.transform``.

    Densities in ``z`` carry the log-determinant of the transform: ``log p_z(z) = log p(T(z)) + log|det T'(z)|``.
    Computations touching the prior run on the prior's device; results return on the input's device.
    """

    def __init__(self, task: Task) -> None:
        self.prior, self.transform = task.prior, task.transform
        self.device = task.prior.mean.device

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
