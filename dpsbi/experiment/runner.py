"""One experiment: fit the configured method (and its companions) on a task, score every round against the
reference posterior, and write the run's files.

Layout of ``output_dir``::

    config.yaml                 the resolved config
    reference.csv, .json        reference draws and how they were made
    <method>/rounds/round_XX.pt checkpoint per round (a neural posterior, or a baseline's result)
    <method>/samples_round_XX.csv, samples.csv   posterior draws per round, and the final ones
    <method>/posterior.pt       the final neural posterior (dpsbi-sample loads it); result.pt for baselines
    metrics.csv, .json          one row per method and round: simulations, wall time, metrics
    summary.json                the final row of each method
    pairplot.png, metrics.png   posterior vs reference vs truth; metrics against simulations
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from .. import metrics
from ..tasks import Task
from . import config, methods
from .outputs import format_table, write_draws, write_rows
from .plots import metrics_plot, pair_plot
from .reference import Reference, reference_posterior

log = logging.getLogger("dpsbi")


@dataclass
class Scorer:
    """Scores of draws ``(n, dim_theta)``: C2ST and MMD against the reference, NLOG at the true parameter,
    LMD at the observed release; a metric that does not apply (no reference, no truth) is left out."""

    task: Task
    reference: Reference
    metrics: Sequence[str]
    lmd_draws: int
    seed: int

    def __call__(self, draws: Tensor) -> dict[str, float | None]:
        draws = draws.detach().cpu()
        ref = self.reference.samples
        available = {
            "c2st": (lambda: metrics.c2st(draws, ref, seed=self.seed)) if ref is not None else None,
            "mmd": (lambda: metrics.mmd(draws, ref)) if ref is not None else None,
            "nlog": (lambda: metrics.nlog(draws, self.task.true_theta, self.task.transform)) if self.task.true_theta is not None else None,
            "lmd": lambda: metrics.lmd(self.task, draws[: self.lmd_draws], generator=torch.Generator().manual_seed(self.seed)),
        }
        scores = {}
        for name in self.metrics:
            if available[name] is None:
                continue
            try:
                scores[name] = available[name]()
            except (ValueError, RuntimeError) as error:  # e.g. draws outside the prior's support: keep the run
                warnings.warn(f"{name} could not be computed: {error}")
                scores[name] = None
        return scores


def save_state(state: Any, path: Path) -> None:
    """Save a neural posterior (its ``.save``) or a baseline's result (its fields) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(state, "save"):
        state.save(path)
    else:
        torch.save(asdict(state) if is_dataclass(state) else state, path)


def _fit_and_score(method: methods.Method, settings: dict, plan: config.Plan, cfg: DictConfig, directory: Path, score: Scorer):
    """Fit one method, writing a checkpoint, draws and a metric row per round. Returns the rows, the final
    draws and the final state."""
    task, rows, last = plan.task, [], {}
    names = task.parameter_names
    start, scoring = time.perf_counter(), 0.0

    def on_round(index: int, draws: Tensor, num_simulations: int, state: Any) -> None:
        nonlocal scoring
        elapsed, tic = time.perf_counter() - start - scoring, time.perf_counter()
        save_state(state, directory / "rounds" / f"round_{index:02d}.pt")
        write_draws(directory / f"samples_round_{index:02d}.csv", draws, names)
        row = {"task": task.name, "epsilon": task.epsilon, "method": method.name, "round": index,
               "num_simulations": int(num_simulations), "wall_time": elapsed, **score(draws)}
        log.info("%s round %d: %s", method.name, index, ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("task", "method", "round")))
        rows.append(row)
        last["draws"] = draws
        scoring += time.perf_counter() - tic

    state = methods.fit(
        method, task, settings, seed=int(cfg.seed), num_samples=int(cfg.evaluation.num_samples), trainer=plan.trainer,
        checkpoint_dir=str(directory / "checkpoints"), progress=bool(cfg.progress), on_round=on_round,
    )
    if not rows:
        raise RuntimeError(f"{method.name} finished without reporting a round (on_round_end never called)")
    save_state(state, directory / ("posterior.pt" if method.neural else "result.pt"))
    write_draws(directory / "samples.csv", last["draws"], names)
    return rows, last["draws"], state


def run_experiment(cfg: DictConfig, output_dir: str | Path) -> list[dict]:
    """Run the experiment that config ``cfg`` (composed from ``configs/``) describes, writing into
    ``output_dir``; returns the summary: the final metric row of each method. Bad config values raise
    :class:`~dpsbi.experiment.config.ConfigError` before any simulation."""
    plan = config.plan(cfg)
    task, out = plan.task, Path(output_dir)
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    evaluation = cfg.evaluation
    settings = OmegaConf.to_container(cfg.reference, resolve=True)
    reference = reference_posterior(task, plan.task_config, seed=int(cfg.seed), progress=bool(cfg.progress), **settings)
    log.info("reference: %s", reference.note)
    (out / "reference.json").write_text(json.dumps(reference.describe(), indent=2))
    if reference.samples is not None:
        write_draws(out / "reference.csv", reference.samples, task.parameter_names)
    score = Scorer(task, reference, list(evaluation.metrics), int(evaluation.lmd_draws), int(cfg.seed))
    rows, summary, finals = [], [], {}
    for method, method_settings in plan.methods:
        method_rows, finals[method.name], state = _fit_and_score(method, method_settings, plan, cfg, out / method.name, score)
        rows += method_rows
        final = {**method_rows[-1], "reference": reference.kind}
        if method.neural and int(evaluation.calibration_runs) > 0:
            final["calibration"] = metrics.calibration(
                state, task, int(evaluation.calibration_runs), int(evaluation.calibration_samples), int(cfg.seed), bool(cfg.progress)
            )
        summary.append(final)
    write_rows(out / "metrics", rows)
    (out / "summary.json").write_text(json.dumps({"reference": reference.describe(), "runs": summary}, indent=2))
    if cfg.plots:
        draws = {**finals, **({"reference": reference.samples} if reference.samples is not None else {})}
        pair_plot(draws, task.parameter_names, out / "pairplot.png", task.true_theta)
        metrics_plot(rows, list(evaluation.metrics), out / "metrics.png")
    print(f"\n{format_table(summary)}\nreference: {reference.note}\noutputs: {out}")
    return summary
