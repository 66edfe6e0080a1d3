"""Privacy mechanisms ``y ~ eta(. | s)``: sampling, inverse-CDF maps for RQMC, exact densities."""

from .base import Mechanism
from .binomial import BinomialCurve, binomial_icdf
from .gaussian import Gaussian
from .laplace import Laplace
from .randomized_response import RandomizedResponse

__all__ = ["Mechanism", "Laplace", "Gaussian", "BinomialCurve", "RandomizedResponse", "binomial_icdf"]
