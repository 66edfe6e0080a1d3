"""The inference tasks of the papers, ``dpsbi.tasks.load(name, epsilon=..., **overrides)``, and your own model,
``dpsbi.tasks.from_simulator(prior, simulator, mechanism, y_obs)`` with the priors ``box`` and ``normal``."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable

from .base import Task

_REGISTRY: dict[str, Callable[..., Task]] = {}


def register(name: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Decorator adding a task factory under ``name``."""

    def add(make: Callable[..., Task]) -> Callable[..., Task]:
        if name in _REGISTRY:
            raise ValueError(f"task {name!r} is registered twice")
        _REGISTRY[name] = make
        return make

    return add


def names() -> list[str]:
    """Names of all registered tasks."""
    return sorted(_REGISTRY)


def load(name: str, **kwargs) -> Task:
    """Build task ``name``; keyword arguments (``epsilon``, ``y_obs``, ``seed``, constants) go to its factory.
    An ``epsilon`` that is not a number (``'1'``) is a ``TypeError`` naming it, before the factory runs."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(names())}")
    epsilon = kwargs.get("epsilon")
    if epsilon is not None and (isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real)):
        raise TypeError(
            f"task {name!r}: epsilon must be a number, got {epsilon!r} ({type(epsilon).__name__}); pass e.g. epsilon=1.0"
        )
    try:
        task = _REGISTRY[name](**kwargs)
    except TypeError as error:  # an unknown keyword: name it with the task
        raise ValueError(f"task {name!r}: {error}") from None
    if task.y_obs is not None:
        task.y_obs = task.check_release(task.y_obs)
    task.spec = {"name": name, "kwargs": dict(kwargs)}
    return task


def with_options(task: Task, options: dict) -> Task:
    """``task`` rebuilt by :func:`load` with ``options`` over the keywords it was built with, its release kept
    (``task`` itself where ``options`` is empty): e.g. SIR's tau-leaping model of an exact-simulator task. A task
    not built by :func:`load` is refused (one line)."""
    if not options:
        return task
    if task.spec is None:
        raise ValueError(
            f"task {task.name!r} was not built by dpsbi.tasks.load, so it cannot be rebuilt with options {options}"
        )
    other = load(task.spec["name"], **{**task.spec["kwargs"], **options})
    other.y_obs, other.s_obs = task.y_obs, task.s_obs
    return other


def full_kwargs(task: Task) -> dict:
    """The keywords that rebuild ``task`` with :func:`load`, its factory's defaults filled in (``{}`` for a task
    not built by :func:`load`)."""
    if task.spec is None:
        return {}
    bound = inspect.signature(_REGISTRY[task.spec["name"]]).bind_partial(**task.spec["kwargs"])
    bound.apply_defaults()
    return dict(bound.arguments)


from . import (  # noqa: E402,F401  (registration)
    binary_responses,
    census,
    conjugate_gaussian,
    naive_bayes,
    normal_variance,
    poisson_counts,
    regression,
    sir,
    uniform_mixture,
)
from .custom import box, from_simulator, normal  # noqa: E402  (also registers "custom": a user's factory)

__all__ = [
    "Task",
    "box",
    "from_simulator",
    "full_kwargs",
    "load",
    "names",
    "normal",
    "register",
    "with_options",
]
