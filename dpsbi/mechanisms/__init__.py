"""Privacy mechanisms ``y ~ eta(. | s)``: sampling, inverse-CDF maps for RQMC, exact densities."""

from .base import AdditiveNoise, IntractableLikelihood, Mechanism
from .binomial import BinomialCurve, binomial_icdf
from .composition import Composition, Privacy, compose_privacy
from .discrete import DiscreteGaussian, DiscreteLaplace
from .gaussian import Gaussian
from .laplace import Laplace
from .opendp import from_opendp
from .postprocessing import PostProcessed, PostProcessing, consistent_total, nonnegative, rounded
from .randomized_response import RandomizedResponse
from .smooth_laplace import SmoothSensitivityLaplace

__all__ = [
    "Mechanism",
    "AdditiveNoise",
    "IntractableLikelihood",
    "Laplace",
    "Gaussian",
    "DiscreteLaplace",
    "DiscreteGaussian",
    "BinomialCurve",
    "RandomizedResponse",
    "SmoothSensitivityLaplace",
    "PostProcessed",
    "Composition",
    "Privacy",
    "compose_privacy",
    "PostProcessing",
    "nonnegative",
    "rounded",
    "consistent_total",
    "from_opendp",
    "binomial_icdf",
]
