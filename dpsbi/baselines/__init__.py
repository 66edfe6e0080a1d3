"""Classical baselines; each returns a :class:`BaselineResult` (weighted or unweighted draws) or, for MCEM, an
:class:`MCEMResult` (maximum-likelihood estimate with Louis' standard errors)."""

from .abcdp import abcdp, abcdp_epsilon, abcdp_noise_scale, flip_probability, gaussian_mmd, mmd_sensitivity
from .correction import corrected
from .da_mcmc import da_mcmc
from .exact_abc import SimulationBudgetExceeded, abc_is, rejection_abc
from .fisher import FisherEstimate, fisher_information, rank_statistics
from .mcem import ExponentialFamily, MCEMResult, PoissonFamily, mcem
from .mcmc_clt import mh_clt
from .mhaar import mhaar
from .pmmh import pmmh
from .resampling import smoothed_resample
from .result import BaselineResult
from .smc_abc import smc_abc

__all__ = [
    "BaselineResult",
    "ExponentialFamily",
    "FisherEstimate",
    "MCEMResult",
    "PoissonFamily",
    "SimulationBudgetExceeded",
    "abc_is",
    "abcdp",
    "abcdp_epsilon",
    "abcdp_noise_scale",
    "corrected",
    "da_mcmc",
    "fisher_information",
    "flip_probability",
    "gaussian_mmd",
    "mcem",
    "mh_clt",
    "mhaar",
    "mmd_sensitivity",
    "pmmh",
    "rank_statistics",
    "rejection_abc",
    "smc_abc",
    "smoothed_resample",
]
