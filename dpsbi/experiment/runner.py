"""One experiment: fit the configured method (and its companions) on a task, score every round against the
reference posterior, and write the run's files.

Layout of ``output_dir``::

    .lock                       held while a process writes the directory (a second one is refused)
    config.yaml                 the resolved config
    reference.csv, .json        reference draws and how they were made
    <method>/rounds/round_XX.pt checkpoint per round (a neural posterior, or a baseline's result)
    <method>/samples_round_XX.csv, samples.csv   posterior draws per round, and the final ones
    <method>/rounds.json        the method's metric rows so far (rewritten after every round)
    <method>/checkpoints/       the estimator's resumable state (neural); scored.pt: that of the last round in rounds.json
    <method>/posterior.pt       the final neural posterior (dpsbi-sample loads it); result.pt for baselines
    <method>/complete           written last: the method is done
    metrics.csv, .json          one row per method and round: simulations, wall time, metrics
    summary.json                the final row of each method; written last: the run is finished
    pairplot.png, metrics.png   posterior vs reference vs truth; metrics against simulations
    ppc.png                     releases simulated from each method's final draws vs the observed release
    .hydra/, <job>.log          Hydra's record of the command line and the run's log

Rerunning into the same directory with the same config (up to :data:`IGNORED_KEYS`) prints a finished run's
summary, and resumes a killed one: complete methods are read back, the others continue from their last
scored round, so the result is that of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from .. import metrics
from ..files import BusyError, atomic_save, atomic_write, atomic_write_text, exclusive, first_line
from ..inference import checkpoint, load_posterior
from ..inference.release_check import outside_training_caught
from ..tasks import Task
from ..tasks.identity import differences
from . import config, methods
from .comparison import read_summary
from .outputs import (
    format_table,
    legend,
    read_draws,
    read_rows,
    write_draws,
    write_json,
    write_rows,
)
from .plots import metrics_plot, pair_plot, ppc_plot
from .reference import Reference, reference_posterior

log = logging.getLogger("dpsbi")

#: Config keys (dotted) that cannot change a run's results: a run may be rerun or resumed with other values.
IGNORED_KEYS = ("progress", "plots", "reference.cache_dir")
ROWS = "rounds.json"
COMPLETE = "complete"
#: The estimator's checkpoint in its ``checkpoint_dir`` (SequentialEstimator), and the runner's copy of it
#: as of the last round whose row is in ``rounds.json``.
#: The estimator's checkpoint, and the copy of it taken when a round's row is written (a killed run resumes there).
CHECKPOINT, SCORED_CHECKPOINT = checkpoint.FILE, "scored.pt"


@dataclass
class Scorer:
    """Scores of draws ``(n, dim_theta)``: C2ST, MMD and the spread ratios (sd, central 95 % width; their mean
    over the parameters, and each parameter's under ``sd_ratio[name]``) against the reference, NLOG at the true parameter,
    LMD at the observed release; a metric that does not apply (no reference, no truth) is left out, one that
    cannot be computed on these draws (NLOG's KDE on collapsed draws, draws outside the prior's support) is
    ``None`` (a blank cell), with its reason in the run's log, not a warning: the run goes on."""

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
            **{
                name: (lambda name=name: self.spread(name, draws, ref)) if ref is not None else None
                for name in metrics.SPREADS
            },
            "nlog": (lambda: metrics.nlog(draws, self.task.true_theta, self.task.transform))
            if self.task.true_theta is not None
            else None,
            "lmd": lambda: metrics.lmd(
                self.task, draws[: self.lmd_draws], generator=torch.Generator().manual_seed(self.seed)
            ),
        }
        scores = {}
        for name in self.metrics:
            if available[name] is None:
                continue
            try:
                value = available[name]()
            except (ValueError, RuntimeError) as error:
                log.info("%s not computed (left blank): %s", name, error)
                value = None
            scores.update(value if isinstance(value, dict) else {name: value})
        return scores

    def spread(self, name: str, draws: Tensor, ref: Tensor) -> dict[str, float]:
        """``name`` (one of :data:`dpsbi.metrics.SPREADS`): its mean over the parameters, and under
        ``name[parameter]`` each parameter's ratio."""
        ratios = metrics.spread_ratios(draws, ref)[name]
        names = self.task.parameter_names or [f"theta_{i + 1}" for i in range(len(ratios))]
        return {name: sum(ratios) / len(ratios), **{f"{name}[{p}]": r for p, r in zip(names, ratios)}}


def save_state(state: Any, path: Path) -> None:
    """Save a neural posterior (its ``.save``) or a baseline's result (its fields) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(state, "save"):
        state.save(path)
    else:
        atomic_save(asdict(state) if is_dataclass(state) else state, path)


def _copy(source: Path, target: Path) -> None:
    """Copy the file ``source`` onto ``target`` atomically."""
    atomic_write(target, lambda tmp: shutil.copyfile(source, tmp))


def _restore_scored_checkpoint(checkpoints: Path) -> None:
    """Make the estimator resume from the last scored round (or from scratch): a round it trained but whose
    row was not written before a kill is trained again, so that it gets its row."""
    if (checkpoints / SCORED_CHECKPOINT).is_file():
        _copy(checkpoints / SCORED_CHECKPOINT, checkpoints / CHECKPOINT)
    else:
        (checkpoints / CHECKPOINT).unlink(missing_ok=True)


def _fit_and_score(
    method: methods.Method, settings: dict, plan: config.Plan, cfg: DictConfig, directory: Path, score: Scorer
):
    """Fit one method, writing a checkpoint, draws and a metric row per round, resuming after the rows in
    ``rounds.json``. Returns all its rows, the final draws ``(n, dim_theta)`` and the final state."""
    task, names, checkpoints = plan.task, plan.task.parameter_names, directory / "checkpoints"
    rows = read_rows(directory / ROWS) if (directory / ROWS).is_file() else []
    if method.neural:
        _restore_scored_checkpoint(checkpoints)
    # Wall and CPU time: those of the rounds a killed run already reported, plus this process's fitting time so
    # far (CPU time: all its threads; the comparable figure when other jobs share the cores).
    resumed = (rows[-1]["wall_time"], rows[-1].get("cpu_time", 0.0)) if rows else (0.0, 0.0)
    start, scoring = (time.perf_counter(), time.process_time()), [0.0, 0.0]

    def on_round(round_number: int, draws: Tensor, num_simulations: int, state: Any) -> None:
        nonlocal rows
        tic = (time.perf_counter(), time.process_time())
        earlier = [
            row for row in rows if row["round"] < round_number
        ]  # a round reported again replaces its row
        elapsed = [resumed[i] + tic[i] - start[i] - scoring[i] for i in range(2)]
        save_state(state, directory / "rounds" / f"round_{round_number:02d}.pt")
        write_draws(directory / f"samples_round_{round_number:02d}.csv", draws, names)
        row = {
            "task": task.name,
            "epsilon": task.epsilon,
            "method": method.name,
            "round": round_number,
            "num_simulations": int(num_simulations),
            "wall_time": elapsed[0],
            "cpu_time": elapsed[1],
            **score(draws),
            **methods.chain_summary(state, int(cfg.evaluation.num_samples), int(cfg.seed)),
            # the fit's ReleaseOutsideTraining line about y_obs (``outside``, below): a column, not a warning
            **({"y_obs_outside": "yes", "y_obs_outside_detail": outside[-1]} if outside else {}),
        }
        log.info(
            "%s round %d: %s",
            method.name,
            round_number,
            ", ".join(
                f"{k}={_short(v)}"
                for k, v in row.items()
                if k not in ("task", "method", "round", "y_obs_outside_detail")
            ),
        )
        rows = earlier + [row]
        write_json(directory / ROWS, rows)
        if method.neural:
            _copy(checkpoints / CHECKPOINT, checkpoints / SCORED_CHECKPOINT)
        scoring[0] += time.perf_counter() - tic[0]
        scoring[1] += time.process_time() - tic[1]

    with outside_training_caught() as outside:
        state = methods.fit(
            method,
            task,
            settings,
            seed=int(cfg.seed),
            num_samples=int(cfg.evaluation.num_samples),
            checkpoint_dir=str(checkpoints),
            progress=bool(cfg.progress),
            on_round=on_round,
        )
    if not rows:
        raise RuntimeError(f"{method.name} finished without reporting a round (on_round_end never called)")
    draws, _ = read_draws(directory / f"samples_round_{rows[-1]['round']:02d}.csv")
    save_state(state, directory / ("posterior.pt" if method.neural else "result.pt"))
    write_draws(directory / "samples.csv", draws, names)
    atomic_write_text(
        directory / COMPLETE, "complete: posterior.pt or result.pt, samples.csv and rounds.json are final\n"
    )
    return rows, draws, state


def _method_result(
    method: methods.Method, settings: dict, plan: config.Plan, cfg: DictConfig, directory: Path, score: Scorer
):
    """A method's rows, final draws and final state: read back (state ``None``) when ``directory`` is
    complete, else fitted by :func:`_fit_and_score`."""
    if (directory / COMPLETE).is_file():
        log.info("%s: complete in %s, read back", method.name, directory)
        return read_rows(directory / ROWS), read_draws(directory / "samples.csv")[0], None
    return _fit_and_score(method, settings, plan, cfg, directory, score)


def _short(value: Any) -> Any:
    """A float as the log shows it (4 significant digits); anything else unchanged."""
    return f"{value:.4g}" if isinstance(value, float) else value


def _flatten(value: dict, prefix: str = "") -> dict:
    """A nest of dicts as ``{"dotted.key": leaf}`` (lists are leaves; empty dicts vanish)."""
    flat = {}
    for key, item in value.items():
        if isinstance(item, dict):
            flat.update(_flatten(item, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = item
    return flat


def _config_differences(stored: dict, current: dict) -> list[str]:
    """``"key: stored vs current"`` for every dotted key whose value differs between two resolved configs,
    leaving out :data:`IGNORED_KEYS`; empty when a run of ``stored`` is a run of ``current``."""
    a, b = ({k: v for k, v in _flatten(c).items() if k not in IGNORED_KEYS} for c in (stored, current))
    return differences(a, b)


def _print_summary(summary: list[dict], reference_note: str, last_line: str) -> None:
    """Print the summary table (one row per method), what its columns mean, the reference's note and ``last_line``."""
    print(f"\n{format_table(summary)}\n{legend(summary)}\nreference: {reference_note}\n{last_line}")


@contextlib.contextmanager
def _claim(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock for the block; :class:`~dpsbi.files.BusyError` (one line naming ``out``) at once
    when another process holds it."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(exclusive(out / ".lock", f"run directory {out}", timeout=0))
        except BusyError:
            raise BusyError(
                f"another dpsbi-run is writing to {out}; wait for it to end or choose another directory"
            ) from None
        yield


def _finished(out: Path, cfg: DictConfig) -> list[dict] | None:
    """The summary of the run in ``out`` when it is a finished run of ``cfg`` (``None`` when there is no
    finished run there); :class:`~dpsbi.experiment.config.ConfigError` naming every differing key when ``out``
    holds a run of another config."""
    if not (out / "config.yaml").is_file():
        return None
    differ = _config_differences(
        OmegaConf.to_container(OmegaConf.load(out / "config.yaml")), OmegaConf.to_container(cfg, resolve=True)
    )
    if differ:
        raise config.ConfigError(
            f"{out} holds a run of another config ({'; '.join(differ)}); use another directory, or the same settings to resume it"
        )
    path = out / "summary.json"
    if not path.is_file():
        return None
    try:
        stored = read_summary(path)
        runs, note = stored["runs"], stored["reference"]["note"]
    except (ValueError, KeyError, TypeError) as error:
        problem = error if isinstance(error, ValueError) else f"no reference note ({first_line(error)})"
        raise config.ConfigError(
            f"{path} is damaged: {problem}; delete it to run this config again there, or use another directory"
        ) from None
    _print_summary(runs, note, f"{out}: already finished with this config; nothing recomputed")
    return runs


def run_experiment(
    cfg: DictConfig, output_dir: str | Path, records: Mapping[str, str] | None = None
) -> list[dict]:
    """Run the experiment that config ``cfg`` (composed from ``dpsbi/configs/``) describes, writing into
    ``output_dir`` (and the text ``records``, relative path -> content, such as Hydra's); returns the summary:
    the final metric row of each method.

    Bad config values raise :class:`~dpsbi.experiment.config.ConfigError` before any simulation, and so does a
    directory holding a run of another config (naming the differing keys) before anything is written; a
    directory another process is writing raises :class:`~dpsbi.files.BusyError`. A finished run of the same
    config is reported, not recomputed; a killed one is resumed."""
    plan = config.plan(cfg)
    out = Path(output_dir)
    with _claim(out):
        finished = _finished(out, cfg)
        return finished if finished is not None else _run(cfg, plan, out, records or {})


def _run(cfg: DictConfig, plan: config.Plan, out: Path, records: Mapping[str, str]) -> list[dict]:
    """The body of :func:`run_experiment`, in the claimed directory ``out``."""
    task = plan.task
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    for name, text in records.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / name, text)
    evaluation = cfg.evaluation
    settings = OmegaConf.to_container(cfg.reference, resolve=True)
    reference = reference_posterior(
        task, plan.task_config, seed=int(cfg.seed), progress=bool(cfg.progress), **settings
    )
    log.info("reference: %s", reference.note)
    write_json(out / "reference.json", reference.describe())
    if reference.samples is not None:
        write_draws(out / "reference.csv", reference.samples, task.parameter_names)
    score = Scorer(task, reference, list(evaluation.metrics), int(evaluation.lmd_draws), int(cfg.seed))
    rows, summary, finals = [], [], {}
    for method, method_settings in plan.methods:
        directory = out / method.name
        method_rows, finals[method.name], state = _method_result(
            method, method_settings, plan, cfg, directory, score
        )
        rows += method_rows
        final = {**method_rows[-1], "reference": reference.kind}
        if method.neural and int(evaluation.calibration_runs) > 0:
            state = state if state is not None else load_posterior(directory / "posterior.pt", task=task)
            final["calibration"] = metrics.calibration(
                state,
                task,
                int(evaluation.calibration_runs),
                int(evaluation.calibration_samples),
                int(cfg.seed),
                bool(cfg.progress),
            )
        summary.append(final)
    write_rows(out / "metrics", rows)
    if cfg.plots:
        draws = {**finals, **({"reference": reference.samples} if reference.samples is not None else {})}
        figures = {
            "pairplot.png": lambda: pair_plot(
                draws, task.parameter_names, out / "pairplot.png", task.true_theta
            ),
            "metrics.png": lambda: metrics_plot(rows, list(evaluation.metrics), out / "metrics.png"),
        }
        if task.y_obs is not None and task.simulator is not None:  # releases from the posterior vs y_obs
            generator = torch.Generator(device=task.y_obs.device).manual_seed(int(cfg.seed))
            figures["ppc.png"] = lambda: ppc_plot(
                task, finals, out / "ppc.png", num_releases=200, generator=generator
            )
        for figure, draw in figures.items():
            try:
                draw()
            except Exception as error:  # a figure must never cost a finished run
                reason = " ".join(f"{type(error).__name__}: {error}".split())
                warnings.warn(
                    f"{out / figure} not drawn ({reason}); the run's results are kept", stacklevel=2
                )
    write_json(out / "summary.json", {"reference": reference.describe(), "runs": summary})
    _print_summary(summary, reference.note, f"outputs: {out}")
    return summary
