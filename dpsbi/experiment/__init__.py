"""Experiments: Hydra configs (``dpsbi/configs/``) -> task x method runs scored against reference posteriors.

``run_experiment(cfg, output_dir)`` is what ``dpsbi-run`` calls for each job; ``compare(multirun_dir)`` is
``dpsbi-compare``; ``reference_posterior`` is the cached reference; ``METHODS`` the method registry.
"""

from .comparison import collect, compare
from .config import ConfigError, build_task, config_dir, plan
from .methods import METHODS, Method
from .reference import Reference, reference_posterior
from .runner import run_experiment

__all__ = [
    "METHODS",
    "ConfigError",
    "Method",
    "Reference",
    "build_task",
    "collect",
    "compare",
    "config_dir",
    "plan",
    "reference_posterior",
    "run_experiment",
]
