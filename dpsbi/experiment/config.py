"""Where the Hydra configs live, the checks that turn a composed config into a runnable plan, and the
``dpsbi_run_id`` resolver of ``dpsbi/configs/config.yaml`` (registered when this module is imported)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .. import tasks
from ..inference.training import DEVICE_FIELDS
from ..mechanisms.base import check_flag
from ..seeds import check_seed
from ..tasks import Task
from . import methods
from .methods import Method

#: Environment variable naming another config directory (a copy of ``dpsbi/configs/`` with your own groups).
CONFIG_DIR_ENV = "DPSBI_CONFIG_DIR"
METRICS = ("c2st", "mmd", "sd_ratio", "width95_ratio", "nlog", "lmd")
TRAINER_KEYS = DEVICE_FIELDS
#: Keys of the ``budget`` node: the simulation and training budget of every neural method of a run at once.
BUDGET_KEYS = ("rounds", "sims_per_round", "inner_samples", "max_epochs", "max_steps")
#: OmegaConf resolver ``${dpsbi_run_id:}``: a random token, the same throughout one composed config (cached),
#: that makes the default run and sweep directories of runs started in the same second differ.
RUN_ID_RESOLVER = "dpsbi_run_id"


class ConfigError(ValueError):
    """A config value that cannot run, found before any simulation."""


def run_id() -> str:
    """A short random token: 6 hex digits."""
    return secrets.token_hex(3)


if not OmegaConf.has_resolver(RUN_ID_RESOLVER):
    OmegaConf.register_new_resolver(RUN_ID_RESOLVER, run_id, use_cache=True)


def register_estimator_defaults() -> None:
    """Store the neural methods' settings in Hydra's ConfigStore, built from the estimators themselves
    (``SequentialEstimator.defaults``), so that the library is the one source of every default: the node
    ``method/<name>_defaults`` (what ``dpsbi/configs/method/<name>.yaml`` extends) and ``experiment/paper_methods``
    (the paper's settings of every neural method as ``method_settings``, what ``experiment=paper`` extends)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    paper = {}
    for method in methods.METHODS.values():
        if method.neural:
            estimator = method.load()
            store.store(group="method", name=f"{method.name}_defaults", node=estimator.defaults())
            paper[method.name] = estimator.defaults(paper=True)
    store.store(group="experiment", name="paper_methods", node={"method_settings": paper}, package="_global_")


register_estimator_defaults()  # here, so that sweep jobs composing their config in other processes see them


def config_dir() -> Path:
    """The Hydra config directory: ``$DPSBI_CONFIG_DIR`` or the package's own ``dpsbi/configs/`` (package data,
    in a wheel as in an editable install)."""
    path = Path(os.environ.get(CONFIG_DIR_ENV) or Path(__file__).resolve().parents[1] / "configs")
    if not (path / "config.yaml").is_file():
        raise ConfigError(
            f"no Hydra configs at {path} (config.yaml missing): reinstall dpsbi (its configs are package data) "
            f"or point {CONFIG_DIR_ENV} at a config directory"
        )
    return path


@dataclass
class Plan:
    """A validated run: the task, the methods with their keyword settings (a neural method's ``training``
    holds the device settings of the ``trainer`` group), and the number of torch CPU threads (``None``:
    torch's default)."""

    task: Task
    task_config: dict
    methods: list[tuple[Method, dict]]
    threads: int | None = None


def _container(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def build_task(task_config: dict) -> Task:
    """The task of a ``task`` config group entry (``name`` plus the factory's keywords), with clear errors for
    an unknown name, a non-positive epsilon or a missing release."""
    config = dict(task_config)
    name = config.pop("name", None)
    if name not in tasks.names():
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(tasks.names())}")
    epsilon = config.get("epsilon")
    if epsilon is not None and not (isinstance(epsilon, (int, float)) and 0 < epsilon < float("inf")):
        raise ConfigError(f"task.epsilon must be a finite number > 0, got {epsilon!r}")
    # A task's config group lists y_obs, except a custom task's, whose release comes from its factory: there,
    # task.y_obs is no key to set (Hydra refuses it) and the factory's own errors name task.factory.
    settable = "y_obs" in config
    try:
        task = tasks.load(name, **config)
    except ValueError as error:
        hint = " (on the command line: task.y_obs=simulate or task.y_obs=[...])" if settable else ""
        raise ConfigError(f"{error}{hint}") from None
    if task.y_obs is None:
        if not settable and name == "custom":
            raise ConfigError(
                f"task.factory {config.get('factory')!r} returned a task with no observed release: "
                "give its y_obs (dpsbi.from_simulator(..., y_obs=...))"
            )
        raise ConfigError(
            f"task {name!r} has no observed release: set task.y_obs=simulate or task.y_obs=[...]"
        )
    return task


def merged(base: dict, override: dict) -> dict:
    """``base`` updated by ``override``, nested dicts key by key (an override of one training setting keeps
    the others)."""
    out = dict(base)
    for key, value in override.items():
        out[key] = (
            merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def method_settings(cfg: DictConfig, method: Method, base: dict, trainer: dict, budget: dict) -> dict:
    """Keywords for ``method``: its config ``base`` (without ``name``) merged with ``method_settings[name]``;
    a neural method's ``training`` takes the ``trainer`` group's device settings unless it sets them, and
    the ``budget`` values that are set override the rest."""
    settings = merged(
        {k: v for k, v in base.items() if k != "name"},
        _container(cfg.get("method_settings", {})).get(method.name, {}),
    )
    if not method.neural:
        return settings
    return merged(merged({"training": trainer}, settings), methods.budget_settings(method, budget))


def _method_config(name: str) -> dict:
    """The ``method/<name>.yaml`` config of a companion method, over the nodes its ``defaults`` list names in the
    ``method`` group (the estimator's own defaults: :func:`register_estimator_defaults`)."""
    if name not in methods.METHODS:
        raise ConfigError(
            f"unknown companion method {name!r}; known methods: {', '.join(sorted(methods.METHODS))}"
        )
    path = config_dir() / "method" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"companion {name!r} has no config file {path}")
    from hydra.core.config_store import ConfigStore

    own = OmegaConf.load(path)
    bases = [entry for entry in own.pop("defaults", []) if entry != "_self_"]
    nodes = [ConfigStore.instance().load(f"method/{entry}.yaml").node for entry in bases]
    return _container(OmegaConf.merge(*nodes, own))


def _trainer(cfg: DictConfig) -> tuple[dict, int | None]:
    """The device settings of the neural methods' training, and the torch thread count."""
    trainer = _container(cfg.get("trainer", {}))
    unknown = set(trainer) - set(TRAINER_KEYS)
    if unknown:
        raise ConfigError(f"unknown trainer keys {sorted(unknown)}; known: {', '.join(TRAINER_KEYS)}")
    if trainer.get("accelerator") in ("cuda", "gpu") and not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.accelerator={trainer['accelerator']} but no CUDA device is visible; use trainer=auto or "
            "trainer=cpu"
        )
    threads = trainer.get("threads")  # the process's threads, and the fits' (TrainingSettings.threads)
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"trainer.threads must be a positive integer or null, got {threads!r}")
    return trainer, threads


def _budget(cfg: DictConfig) -> dict:
    """The ``budget`` values that are set (not null), each a positive integer."""
    budget = _container(cfg.get("budget", {}))
    unknown = set(budget) - set(BUDGET_KEYS)
    if unknown:
        raise ConfigError(f"unknown budget keys {sorted(unknown)}; known: {', '.join(BUDGET_KEYS)}")
    for key, value in budget.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"budget.{key} must be a positive integer or null, got {value!r}")
    return {k: v for k, v in budget.items() if v is not None}


def _check_evaluation(cfg: DictConfig) -> None:
    evaluation = cfg.evaluation
    unknown = set(evaluation.metrics) - set(METRICS)
    if unknown:
        raise ConfigError(
            f"unknown metrics {sorted(unknown)} in evaluation.metrics; known: {', '.join(METRICS)}"
        )
    if int(evaluation.num_samples) < 10:
        raise ConfigError(f"evaluation.num_samples must be >= 10, got {evaluation.num_samples}")
    if int(cfg.reference.num_samples) < 10:
        raise ConfigError(f"reference.num_samples must be >= 10, got {cfg.reference.num_samples}")


def _check_settings(method: Method, task: Task, settings: dict, seed: int) -> None:
    """Raise :class:`ConfigError` naming ``method`` and the problem when it cannot take ``settings``."""
    try:
        methods.check_settings(method, task, settings, seed)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"method {method.name!r}: {error}") from None


def plan(cfg: DictConfig) -> Plan:
    """Check a composed config and build its task and methods, validating every method's settings; raises
    :class:`ConfigError` naming the problem, before any simulation."""
    _check_evaluation(cfg)
    try:
        check_seed(cfg.seed)
        check_flag("progress", cfg.progress)
    except (ValueError, TypeError) as error:
        raise ConfigError(str(error)) from None
    trainer, threads = _trainer(cfg)
    budget = _budget(cfg)
    unknown = set(_container(cfg.get("method_settings", {}))) - set(methods.METHODS)
    if unknown:
        raise ConfigError(
            f"method_settings names unknown methods {sorted(unknown)}; known: {', '.join(sorted(methods.METHODS))}"
        )
    task_config = _container(cfg.task)
    task = build_task(task_config)
    main = _container(cfg.method)
    companions = [name for name in cfg.get("companions") or [] if name != main.get("name")]
    configs = [main] + [_method_config(name) for name in dict.fromkeys(companions)]
    chosen = []
    for config in configs:
        try:
            method = methods.get(config.get("name"))
        except ValueError as error:
            raise ConfigError(str(error)) from None
        try:
            method.check(task)
        except ValueError as error:
            raise ConfigError(f"method {method.name!r} cannot run on task {task.name!r}: {error}") from None
        settings = method_settings(cfg, method, config, trainer, budget)
        _check_settings(method, task, settings, int(cfg.seed))
        chosen.append((method, settings))
    return Plan(task, task_config, chosen, threads)
