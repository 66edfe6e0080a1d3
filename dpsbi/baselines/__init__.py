"""Classical baselines; each returns a :class:`BaselineResult` (weighted or unweighted draws) or, for MCEM, an
:class:`MCEMResult` (maximum-likelihood estimate with Louis' standard errors)."""

from .exact_abc import SimulationBudgetExceeded, abc_is, rejection_abc
from .mcem import ExponentialFamily, MCEMResult, PoissonFamily, mcem
from .result import BaselineResult
from .smc_abc import smc_abc

__all__ = [
    "BaselineResult",
    "ExponentialFamily",
    "MCEMResult",
    "PoissonFamily",
    "SimulationBudgetExceeded",
    "abc_is",
    "mcem",
    "rejection_abc",
    "smc_abc",
]
