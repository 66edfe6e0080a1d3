"""Privacy mechanisms ``y ~ eta(. | s)``: sampling, inverse-CDF maps for RQMC, exact densities."""

from .base import Mechanism
from .binomial import BinomialCurve, binomial_icdf
from .gaussian import Gaussian
from .laplace import Laplace
from .randomized_response import RandomizedResponse
from .smooth_laplace import SmoothSensitivityLaplace

__all__ = [
    "Mechanism",
    "Laplace",
    "Gaussian",
    "BinomialCurve",
    "RandomizedResponse",
    "SmoothSensitivityLaplace",
    "binomial_icdf",
]
