"""dpsbi: Bayesian inference from differentially private releases.

Light modules (mechanisms, qmc, tasks) import eagerly; the estimators, baselines and metrics, which pull
in sbi, load on first attribute access.
"""

from __future__ import annotations

import importlib

from . import mechanisms, qmc, tasks
from .tasks import from_simulator

__version__ = "0.1.0"

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
