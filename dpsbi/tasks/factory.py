"""A user's own task by import path: ``dpsbi.tasks.load("custom", factory="mymodel:make_task", **kwargs)``,
on the command line ``dpsbi-run task=custom task.factory=mymodel:make_task``.

The factory is a function returning a :class:`~dpsbi.tasks.base.Task` (usually built with
:func:`dpsbi.tasks.from_simulator`); it is imported from the current working directory first, then from the
installed packages, and called with the other keyword arguments (those set to ``None`` are left out, so a
config may list ``epsilon: null``). Posterior files record the import path and the arguments, so that
``load_posterior`` and ``dpsbi-sample`` rebuild the task the same way (from the same working directory).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from . import register
from .base import Task


def import_factory(path: str) -> Callable[..., Task]:
    """The function named by ``"module:function"`` (``module`` may be dotted), or a ``ValueError`` saying
    what could not be found where."""
    module_name, colon, name = path.partition(":")
    if not colon or not module_name or not name:
        raise ValueError(f"task.factory must be 'module:function', got {path!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ValueError(
            f"task.factory {path!r}: cannot import {module_name!r} from {cwd} or the installed packages ({error})"
        ) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(
            f"task.factory {path!r}: module {module_name!r} ({module.__file__}) has no function {name!r}"
        )
    return factory


@register("custom")
def make(factory: str | None = None, **kwargs) -> Task:
    """The task returned by ``factory(**kwargs)`` (keywords that are ``None`` left out)."""
    if not factory:
        raise ValueError(
            "task 'custom' needs factory='module:function' (on the command line: task.factory=mymodel:make_task)"
        )
    task = import_factory(factory)(**{k: v for k, v in kwargs.items() if v is not None})
    if not isinstance(task, Task):
        raise ValueError(f"task.factory {factory!r} returned a {type(task).__name__}, not a dpsbi Task")
    return task
