"""Command-line entry points.

- ``dpsbi-run [key=value ...]`` (Hydra; ``-m`` for sweeps): run an experiment from ``configs/``.
- ``dpsbi-sample RUN_DIR|POSTERIOR.pt [--release v1,v2,... | --release-file FILE]``: draws from a saved posterior.
- ``dpsbi-compare MULTIRUN_DIR``: table and figure comparing the runs of a sweep.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

# Importing the experiment config also registers its ${dpsbi_run_id:} resolver, which sweep jobs run in other
# processes (joblib, Slurm) need before Hydra resolves their directory.
from .experiment.config import ConfigError, config_dir


def run() -> None:
    """``dpsbi-run``: Hydra app over ``configs/config.yaml`` (or ``$DPSBI_CONFIG_DIR``)."""
    import hydra

    try:
        path = config_dir()
    except ConfigError as error:
        raise SystemExit(f"dpsbi-run: {error}") from None
    hydra.main(version_base="1.3", config_path=str(path), config_name="config")(_job)()


def _hydra_records(cfg, hydra_config) -> dict[str, str]:
    """What Hydra writes into ``.hydra/`` (configs/config.yaml sets ``hydra.output_subdir: null``): the runner
    writes it once it holds the run directory, so that a run refused there leaves the directory untouched."""
    from omegaconf import OmegaConf

    return {
        ".hydra/config.yaml": OmegaConf.to_yaml(cfg),
        ".hydra/hydra.yaml": OmegaConf.to_yaml({"hydra": hydra_config}),
        ".hydra/overrides.yaml": OmegaConf.to_yaml(hydra_config.overrides.task),
    }


def _job(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .baselines import SimulationBudgetExceeded
    from .experiment import run_experiment
    from .experiment.comparison import ERROR_FILE
    from .files import BusyError

    hydra_config = HydraConfig.get()
    output_dir = Path(hydra_config.runtime.output_dir)
    try:
        run_experiment(cfg, output_dir, records=_hydra_records(cfg, hydra_config))
    except BusyError as error:  # another process writes this directory: touch nothing there
        raise SystemExit(f"dpsbi-run: {error}") from None
    except (
        ConfigError,
        SimulationBudgetExceeded,
    ) as error:  # a bad value, or a method out of budget: one line
        kind = "config error" if isinstance(error, ConfigError) else "out of simulation budget"
        message = f"dpsbi-run: {kind}: {error}"
        if hydra_config.mode != RunMode.MULTIRUN:
            raise SystemExit(message) from None
        # In a sweep, one bad combination (say mhaar on a task without records) must not stop the others:
        # the job leaves error.txt, and the sweep-end comparison lists it and exits non-zero.
        (output_dir / ERROR_FILE).write_text(message + "\n")
        print(message, file=sys.stderr)
    else:  # a sweep rerun after a refusal: the point is no longer failed
        (output_dir / ERROR_FILE).unlink(missing_ok=True)


def read_release(text: str | None = None, path: str | Path | None = None) -> torch.Tensor | None:
    """A release ``(1, d)`` from comma/space separated ``text`` or a file (``.npy``, ``.pt``, ``.json`` list, or
    text/CSV with one row); ``None`` when neither is given."""
    if text is not None and path is not None:
        raise ValueError("give the release either inline (--release) or as a file (--release-file), not both")
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"release file {path} does not exist")
        if path.suffix == ".npy":
            values = np.load(path)
        elif path.suffix == ".pt":
            values = torch.load(path, map_location="cpu", weights_only=True)
        elif path.suffix == ".json":
            values = json.loads(path.read_text())
        else:
            text = path.read_text()
    if text is not None:
        try:
            values = [float(v) for v in text.replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"a release is a list of numbers, got {text.strip()[:80]!r}") from None
    if text is None and path is None:
        return None
    release = torch.as_tensor(np.asarray(values, dtype=np.float64), dtype=torch.get_default_dtype())
    if release.numel() == 0:
        raise ValueError("the release is empty")
    return release.reshape(1, -1)


def _posterior_path(target: Path, method: str | None) -> tuple[Path, Path | None]:
    """The posterior file of ``target`` (a run directory or a ``.pt`` file) and the run's directory."""
    if target.is_file():  # <run>/<method>/posterior.pt or <run>/<method>/rounds/round_XX.pt
        return target, next((p for p in target.parents[:3] if (p / "config.yaml").is_file()), None)
    if not (target / "config.yaml").is_file():
        raise ValueError(f"{target} is neither a posterior file nor a run directory (no config.yaml)")
    if method is None:
        from omegaconf import OmegaConf

        method = OmegaConf.load(target / "config.yaml").method.name
    path = target / method / "posterior.pt"
    if not path.is_file():
        saved = (
            "its draws at y_obs are in samples.csv"
            if (target / method / "samples.csv").is_file()
            else "nothing was saved"
        )
        raise ValueError(
            f"{method!r} in {target} has no saved posterior ({path} missing): it is not an amortized neural "
            f"posterior and cannot be sampled at a new release; {saved}"
        )
    return path, target


def _task_of(run_dir: Path):
    from omegaconf import OmegaConf

    from .experiment import build_task

    return build_task(OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml").task, resolve=True))


def sample(argv: list[str] | None = None) -> None:
    """``dpsbi-sample``: draw from a saved posterior at a release given inline or in a file (default: the
    run's observed release) and write them as CSV."""
    parser = argparse.ArgumentParser(prog="dpsbi-sample", description=sample.__doc__)
    parser.add_argument("target", type=Path, help="a run directory of dpsbi-run, or a saved posterior (.pt)")
    parser.add_argument(
        "--release",
        help="the release, comma or space separated (default: the run's y_obs); write --release=-0.4,2.9 when it starts with a minus",
    )
    parser.add_argument("--release-file", help="a file holding the release (.csv/.txt, .npy, .pt, .json)")
    parser.add_argument("--method", help="which method of the run (default: the run's main method)")
    parser.add_argument("-n", "--num-samples", type=int, default=1000)
    parser.add_argument(
        "-o", "--output", type=Path, help="CSV file for the draws (default: print a summary only)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from . import load_posterior
    from .experiment.outputs import format_table, write_draws

    try:
        if args.num_samples < 1:
            raise ValueError(f"--num-samples must be >= 1, got {args.num_samples}")
        path, run_dir = _posterior_path(args.target, args.method)
        y = read_release(args.release, args.release_file)
        task = _task_of(run_dir) if run_dir is not None else None
        if y is not None and task is not None:
            y = task.check_release(y)
        posterior = load_posterior(path)
        draws = posterior.sample((args.num_samples,), y=y, seed=args.seed).detach().cpu()
    except (ValueError, RuntimeError) as error:  # RuntimeError: non-finite draws, refused by the posterior
        raise SystemExit(f"dpsbi-sample: error: {error}") from None
    names = (task or posterior.task).parameter_names
    if args.output is not None:
        write_draws(args.output, draws, names)
    rows = [
        {"parameter": n, "mean": float(m), "sd": float(s)}
        for n, m, s in zip(names, draws.mean(0), draws.std(0))
    ]
    print(format_table(rows, ("parameter", "mean", "sd")))
    print(f"{args.num_samples} draws from {path}" + (f" written to {args.output}" if args.output else ""))


def compare(argv: list[str] | None = None) -> None:
    """``dpsbi-compare``: table and figure of the final metrics of every run below a (multirun) directory."""
    parser = argparse.ArgumentParser(prog="dpsbi-compare", description=compare.__doc__)
    parser.add_argument("root", type=Path, help="a multirun directory (or any directory holding runs)")
    args = parser.parse_args(argv)
    from .experiment import compare as compare_runs

    try:
        compare_runs(args.root)
    except FileNotFoundError as error:
        raise SystemExit(f"dpsbi-compare: error: {error}") from None
