"""Neural inference from private releases: SPPE, SPLE, the non-private NaiveNPE baseline, and their
posterior objects. The losses (:mod:`dpsbi.inference.losses`) can be used on their own."""

from .flows import ConditionalFlow, FlowSettings
from .losses import inner_releases, posterior_loss, sple_loss, sppe_loss
from .mcmc import MCMCSettings
from .naive import NaiveNPE
from .posterior import FlowPosterior, LikelihoodPosterior, Posterior, load_posterior
from .proposal import DefensiveProposal
from .release_check import ReleaseOutsideTraining, TrainingReleases
from .sple import SPLE
from .sppe import SPPE

__all__ = [
    "SPPE",
    "SPLE",
    "NaiveNPE",
    "load_posterior",
    "Posterior",
    "FlowPosterior",
    "LikelihoodPosterior",
    "DefensiveProposal",
    "FlowSettings",
    "ConditionalFlow",
    "MCMCSettings",
    "ReleaseOutsideTraining",
    "TrainingReleases",
    "sppe_loss",
    "sple_loss",
    "posterior_loss",
    "inner_releases",
]
