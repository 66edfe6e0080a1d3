"""dpsbi: Bayesian inference from differentially private releases.

Light modules (mechanisms, qmc, tasks) import eagerly; the estimators, baselines and metrics, which pull
in sbi, load on first attribute access.
"""

from __future__ import annotations

import importlib

import torch

from . import mechanisms, qmc, tasks
from .tasks import from_simulator

__version__ = "0.2.0"


def _import_zuko_keeping_validation() -> None:
    """Import zuko (the flow library sbi imports) now and give torch's distribution validation back its setting:
    zuko's first import sets ``Distribution._validate_args = False`` for the whole process, and a module is
    imported once, so importing dpsbi or its lazily loaded parts leaves the user's setting as it was."""
    validate = torch.distributions.Distribution._validate_args
    try:
        importlib.import_module("zuko")
    finally:
        torch.distributions.Distribution.set_default_validate_args(validate)


_import_zuko_keeping_validation()

_LAZY = {
    "SPPE": "dpsbi.inference",
    "SPLE": "dpsbi.inference",
    "NaiveNPE": "dpsbi.inference",
    "load_posterior": "dpsbi.inference",
    "baselines": "dpsbi.baselines",
    "metrics": "dpsbi.metrics",
    "simulators": "dpsbi.simulators",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'dpsbi' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    return module if module.__name__.endswith(name) else getattr(module, name)


__all__ = ["mechanisms", "qmc", "tasks", "from_simulator", *_LAZY]
