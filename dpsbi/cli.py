"""Command-line entry points.

- ``dpsbi-run [key=value ...]`` (Hydra; ``-m`` for sweeps): run an experiment from ``dpsbi/configs/``.
- ``dpsbi-sample RUN_DIR|POSTERIOR.pt [--release v1,v2,... | --release-file FILE | --releases FILE.csv]
  [--epsilon EPS]``: draws from a saved posterior, at one release or at many in one batched call.
- ``dpsbi-compare MULTIRUN_DIR``: table and figure comparing the runs of a sweep.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

# Importing the experiment config also registers its ${dpsbi_run_id:} resolver, which sweep jobs run in other
# processes (joblib, Slurm) need before Hydra resolves their directory.
from .experiment.config import ConfigError, config_dir
from .files import first_line


def run() -> None:
    """``dpsbi-run``: Hydra app over ``dpsbi/configs/config.yaml`` (or ``$DPSBI_CONFIG_DIR``)."""
    import hydra

    try:
        path = config_dir()
    except ConfigError as error:
        raise SystemExit(f"dpsbi-run: {error}") from None
    hydra.main(version_base="1.3", config_path=str(path), config_name="config")(_job)()


def _hydra_records(cfg, hydra_config) -> dict[str, str]:
    """What Hydra writes into ``.hydra/`` (dpsbi/configs/config.yaml sets ``hydra.output_subdir: null``): the runner
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


#: What ``--release-file`` holds, said in its refusals.
RELEASE_FILE_HOLDS = (
    "a release file holds one release: its numbers on one row or one a line (.csv/.txt), a list of numbers (.json), "
    "a 1-D array (.npy) or a 1-D tensor (.pt)"
)


def read_release(text: str | None = None, path: str | Path | None = None) -> torch.Tensor | None:
    """One release ``(1, d)`` from ``text`` (``--release``) or the file at ``path`` (``--release-file``); ``None``
    when neither is given. ``text``, and a ``.csv``/``.txt`` (any other suffix) file, is one row of numbers
    separated by commas and/or spaces (a file: or one number a line; no header; a trailing newline and a UTF-8
    byte-order mark are fine, an empty field between commas is refused). A ``.json`` file holds a list of numbers, a
    ``.npy`` file a numeric array and a ``.pt`` file a tensor (or a list of numbers), 1-D or of shape ``(1, d)`` or
    ``(d, 1)``. A file holding several releases (several rows), anything else, or a file that cannot be read is a
    ``ValueError`` naming the file (many releases: ``--releases FILE.csv``, :func:`read_releases`)."""
    if text is not None and path is not None:
        raise ValueError("give the release either inline (--release) or as a file (--release-file), not both")
    if path is not None:
        values = _release_file_values(Path(path))
    elif text is not None:
        values = _release_row(text, "--release")
    else:
        return None
    return torch.as_tensor(values, dtype=torch.get_default_dtype()).reshape(1, -1)


def _release_file_values(path: Path) -> np.ndarray:
    """The numbers of the release file at ``path`` (see :func:`read_release`), or a one-line ``ValueError``."""
    where = f"release file {path}"
    if not path.is_file():
        raise ValueError(f"{where} does not exist")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read {where} ({error.strerror or error})") from None
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            values = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, EOFError) as error:  # not an .npy file, truncated, or an array of objects
            reason = first_line(error)
            if "allow_pickle" in reason:  # numpy's advice to load it unsafely: not ours to give
                reason = "not an array of numbers saved by np.save"
            raise ValueError(f"{where} is not a readable .npy array ({reason})") from None
    elif suffix == ".pt":
        try:
            values = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as error:  # truncated, not a torch file, or a pickle of objects other than tensors
            reason = first_line(error)
            # torch's "Weights only load failed" advises loading it unsafely: not ours to give
            if "weights" in reason.lower() or not reason:
                reason = "not a file of tensors and numbers written by torch.save"
            reason = reason.split(". ")[0]
            raise ValueError(
                f"{where} is not a readable torch file ({type(error).__name__}: {reason})"
            ) from None
    elif suffix == ".json":
        try:
            values = json.loads(_utf8(data, where))
        except json.JSONDecodeError as error:
            raise ValueError(f"{where} is not valid JSON ({error})") from None
    else:
        return _release_row(_utf8(data, where), where)
    return _release_array(values, where)


def _utf8(data: bytes, where: str) -> str:
    """``data`` decoded as UTF-8 (a byte-order mark dropped), or a ``ValueError`` naming ``where``."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:  # UTF-16 without a byte-order mark decodes, with NUL bytes
        raise ValueError(f"{where} is not UTF-8 text (UTF-16 or binary?): save it as UTF-8")
    return text


def _release_row(text: str, where: str) -> np.ndarray:
    """The numbers of one row of ``text``, separated by commas and/or spaces (or of a column, a number a line),
    or a ``ValueError`` naming ``where``: several rows of several numbers (several releases), an empty field
    between commas, or a non-number."""
    rows = [line.strip() for line in text.splitlines() if line.strip()]
    if len(rows) > 1 and all(_is_number(row.rstrip(",")) for row in rows):  # a column, as np.savetxt writes
        return np.array([float(row.rstrip(",")) for row in rows], dtype=np.float64)
    if len(rows) > 1:
        first = rows[0].replace(",", " ").split()
        if first and not _is_number(first[0]):
            raise ValueError(
                f"{where}: a release is one row of numbers, without a header; got {rows[0][:80]!r}"
            )
        raise ValueError(_several(where, len(rows), "rows"))
    if not rows:
        raise ValueError(f"{where} holds no numbers: the release is empty")
    fields = [field.split() for field in rows[0].split(",")]
    if any(not field for field in fields):
        raise ValueError(f"{where}: an empty field between commas in {rows[0][:80]!r}; give every number")
    try:
        return np.array([float(v) for field in fields for v in field], dtype=np.float64)
    except ValueError:
        raise ValueError(f"{where}: a release is a list of numbers, got {rows[0][:80]!r}") from None


def _several(where: str, count: int, what: str) -> str:
    return (
        f"{where} holds {count} {what}: several releases, where one is read (one row of numbers); "
        "for many releases give --releases FILE.csv (a header row, one release a row)"
    )


def _release_array(values, where: str) -> np.ndarray:
    """``values`` loaded from a release file (an array, a tensor, a list or a number) as a 1-D float array, or a
    ``ValueError`` naming ``where`` and what a release file holds."""
    if isinstance(values, torch.Tensor):
        if values.dtype == torch.bool or values.is_complex():
            raise ValueError(f"{where} holds a tensor of {values.dtype}, not numbers; {RELEASE_FILE_HOLDS}")
        values = values.detach().cpu().double().numpy()
    elif isinstance(values, np.ndarray):
        if values.dtype.kind not in "iuf":
            raise ValueError(f"{where} holds an array of {values.dtype}, not numbers; {RELEASE_FILE_HOLDS}")
    elif not _only_numbers(values):
        raise ValueError(f"{where} holds {_described(values)}, not a release; {RELEASE_FILE_HOLDS}")
    try:
        array = np.asarray(values, dtype=np.float64)
    except ValueError:  # ragged lists
        raise ValueError(f"{where} holds lists of unequal lengths; {RELEASE_FILE_HOLDS}") from None
    if array.ndim > 2:
        raise ValueError(f"{where} holds an array of shape {tuple(array.shape)}; {RELEASE_FILE_HOLDS}")
    if array.ndim == 2 and 1 not in array.shape:  # a row or a column is one release
        raise ValueError(_several(where, array.shape[0], f"rows (shape {tuple(array.shape)})"))
    if array.size == 0:
        raise ValueError(f"{where} holds no numbers: the release is empty")
    return array.reshape(-1)


def _only_numbers(values) -> bool:
    """Whether ``values`` is a number or (nested) lists of numbers; ``True``/``False`` are not numbers."""
    if isinstance(values, (list, tuple)):
        return all(_only_numbers(v) for v in values)
    return isinstance(values, (int, float)) and not isinstance(values, bool)


def _described(values) -> str:
    """``values`` in a few words, for a refusal: ``a dict (keys 'mean', 'x')``."""
    if isinstance(values, dict):
        keys = ", ".join(repr(k) for k in list(values)[:4]) + (", ..." if len(values) > 4 else "")
        return f"a {type(values).__name__} (keys {keys})" if values else f"an empty {type(values).__name__}"
    if isinstance(values, (list, tuple)):
        return f"a {type(values).__name__} holding something other than numbers"
    return f"a {type(values).__name__} ({str(values)[:40]!r})"


#: Columns of ``dpsbi-sample --summary``: per release and parameter, the mean, sd and three quantiles, and
#: ``outside_training``: the release's coordinates that lie outside the simulated releases the posterior was
#: trained on (``jointly: <name>`` when only their combination does; empty inside, or for a posterior file
#: written before the check: :mod:`dpsbi.inference.release_check`).
RELEASE_SUMMARY_COLUMNS = ("release", "parameter", "mean", "sd", "q2.5", "q50", "q97.5", "outside_training")


def read_releases(path: str | Path, names: list[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Releases ``(B, d)`` and their epsilons ``(B,)`` (``None`` without an ``epsilon`` column) from a CSV whose
    header names its columns: the task's release ``names`` (``task.release_names``, in any order: they are read
    by name) and optionally ``epsilon``. A file without a header, or with a column missing, unknown (names are
    case-sensitive), duplicated or empty, is refused in one line naming it and the expected header."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"releases file {path} does not exist")
    with path.open(newline="") as f:
        rows = [row for row in csv.reader(f) if any(cell.strip() for cell in row)]
    expected = f"expected the header {','.join(names)} (then optionally ,epsilon), columns in any order"
    if not rows:
        raise ValueError(f"{path}: a releases CSV needs a header row and at least one release; {expected}")
    header = [name.strip() for name in rows[0]]
    if all(_is_number(name) for name in header):
        raise ValueError(
            f"{path}: the first row {rows[0]} is numbers, not a header: a header is required; {expected}"
        )
    problem = _header_problem(header, names)
    if problem:
        raise ValueError(f"{path}: {problem}; {expected}")
    if len(rows) < 2:
        raise ValueError(f"{path}: a header and no release; give at least one release a row")
    values = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ValueError(f"{path}, line {line}: {len(row)} values for {len(header)} columns {header}")
        try:
            values.append([float(v) for v in row])
        except ValueError:
            raise ValueError(f"{path}, line {line}: a release is numbers, got {row}") from None
    table = torch.tensor(values, dtype=torch.float64)
    releases = table[:, [header.index(name) for name in names]].to(torch.get_default_dtype())
    epsilon = table[:, header.index("epsilon")] if "epsilon" in header else None
    return releases, epsilon


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _header_problem(header: list[str], names: list[str]) -> str | None:
    """What is wrong with a releases CSV's ``header`` for release coordinates ``names``, or ``None``."""
    allowed = [*names, "epsilon"]
    duplicated = sorted({name for name in header if header.count(name) > 1})
    unknown = [_suggest(name, allowed) for name in header if name not in allowed]
    missing = [name for name in names if name not in header]
    problems = [
        f"{label} column{'s' if len(found) > 1 else ''} {', '.join(found)}"
        for label, found in (
            ("duplicated", [repr(n) for n in duplicated]),
            ("unknown", unknown),
            ("missing", [repr(n) for n in missing]),
        )
        if found
    ]
    return "; ".join(problems) or None


def _suggest(name: str, allowed: list[str]) -> str:
    """``name`` quoted, with the allowed name it matches but for case, if one does."""
    near = [a for a in allowed if a.lower() == name.lower()]
    return f"{name!r} (names are case-sensitive: {near[0]!r}?)" if near else repr(name)


def release_summary(draws: torch.Tensor, names, outside: list[str]) -> list[dict]:
    """Rows of :data:`RELEASE_SUMMARY_COLUMNS` for draws ``(n, B, d)``: per release (0-based index) and parameter;
    ``outside``: each release's ``outside_training`` flag."""
    x = draws.detach().cpu().double().numpy()
    mean, sd = x.mean(0), x.std(0, ddof=1) if x.shape[0] > 1 else np.zeros(x.shape[1:])
    q = np.quantile(x, [0.025, 0.5, 0.975], axis=0)
    return [
        {
            "release": b,
            "parameter": name,
            "mean": float(mean[b, j]),
            "sd": float(sd[b, j]),
            "q2.5": float(q[0, b, j]),
            "q50": float(q[1, b, j]),
            "q97.5": float(q[2, b, j]),
            "outside_training": outside[b],
        }
        for b in range(x.shape[1])
        for j, name in enumerate(names)
    ]


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
    """The task of the run in ``run_dir``, rebuilt from its ``config.yaml`` (its release is the run's own)."""
    from omegaconf import OmegaConf

    from . import tasks

    config = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml").task, resolve=True)
    try:
        return tasks.load(config.pop("name"), **config)
    except ValueError as error:
        raise ValueError(
            f"cannot rebuild the task of the run in {run_dir} ({error}); a custom task's module is imported from "
            "the working directory: run dpsbi-sample in the folder dpsbi-run ran in"
        ) from None


def sample(argv: list[str] | None = None) -> None:
    """``dpsbi-sample``: draw from a saved posterior at a release given inline or in a file (default: the
    run's observed release) and write them as CSV; or, with ``--releases FILE.csv``, at every release of the file
    in one batched call (each at its own epsilon with an ``epsilon`` column), writing the draws in long form
    (``-o``: release, draw, parameters) and a per-release summary (``--summary``: mean, sd, 2.5 / 50 / 97.5 %
    quantiles)."""
    parser = argparse.ArgumentParser(prog="dpsbi-sample", description=sample.__doc__)
    parser.add_argument("target", type=Path, help="a run directory of dpsbi-run, or a saved posterior (.pt)")
    parser.add_argument(
        "--release",
        help="the release, comma or space separated (default: the run's y_obs); write --release=-0.4,2.9 when it starts with a minus",
    )
    parser.add_argument(
        "--release-file",
        help="a file holding one release: its numbers on one row or one a line (.csv/.txt, comma or space separated, no "
        "header), a list of numbers (.json), a 1-D array (.npy) or a 1-D tensor (.pt); many releases: --releases",
    )
    parser.add_argument(
        "--releases",
        type=Path,
        help="a CSV of many releases, one a row, under a header of the task's release names (task.release_names; "
        "default y0,y1,...) and optionally epsilon, in any order",
    )
    parser.add_argument(
        "--epsilon",
        type=float,
        help="the releases' epsilon, for a posterior trained over an epsilon range (default: the task's own)",
    )
    parser.add_argument(
        "--summary", type=Path, help="with --releases: CSV of the per-release summary (mean, sd, quantiles)"
    )
    parser.add_argument("--method", help="which method of the run (default: the run's main method)")
    parser.add_argument("-n", "--num-samples", type=int, default=1000)
    parser.add_argument(
        "-o", "--output", type=Path, help="CSV file for the draws (default: print a summary only)"
    )
    parser.add_argument(
        "--correct",
        type=int,
        metavar="N",
        help="correct the flow's draws at the release by importance sampling: N proposals from the flow mixed "
        "with the prior, weighted by the exact private likelihood estimated by simulation (abc_is); prints the "
        "effective sample size",
    )
    parser.add_argument(
        "--simulations-per-draw",
        type=int,
        metavar="M",
        help="with --correct: simulations averaged per proposal (a less noisy likelihood estimate; default 4)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from . import load_posterior
    from .experiment.outputs import format_table, write_draws

    if args.simulations_per_draw is not None and args.correct is None:
        raise SystemExit("dpsbi-sample: error: --simulations-per-draw goes with --correct N")
    if args.releases is not None:
        if args.correct is not None:
            raise SystemExit("dpsbi-sample: error: --correct goes with one release, not --releases")
        _sample_releases(args)
        return
    try:
        if args.summary is not None:
            raise ValueError("--summary goes with --releases (one summary row per release and parameter)")
        if args.num_samples < 1:
            raise ValueError(f"--num-samples must be >= 1, got {args.num_samples}")
        if args.correct is not None and (
            args.correct < 1 or (args.simulations_per_draw is not None and args.simulations_per_draw < 1)
        ):
            raise ValueError(
                f"--correct and --simulations-per-draw must be >= 1, got {args.correct} and {args.simulations_per_draw}"
            )
        path, run_dir = _posterior_path(args.target, args.method)
        y = read_release(args.release, args.release_file)
        task = _task_of(run_dir) if run_dir is not None else None
        if y is not None and task is not None:
            y = task.check_release(y)
        posterior = load_posterior(path)
        with _outside_training_warned():
            if args.correct is None:
                draws = posterior.sample((args.num_samples,), y=y, seed=args.seed, epsilon=args.epsilon)
            else:
                draws = _corrected(posterior, y, args)
        draws = draws.detach().cpu()
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


def _corrected(posterior, y: torch.Tensor | None, args) -> torch.Tensor:
    """``--correct N``: the flow's draws at ``y`` corrected by importance sampling (``dpsbi.baselines.corrected``),
    resampled to ``--num-samples``; prints the effective sample size. Where it is below the draws asked for,
    plain resampling would repeat draws: they are drawn without repeats (``dpsbi.baselines.smoothed_resample``,
    as the stored SIR references are) where the ESS supports its covariance, else they repeat; either way with a
    warning line."""
    from .baselines import corrected, smoothed_resample
    from .baselines.correction import SIMULATIONS_PER_DRAW
    from .baselines.fitted_proposal import covariance_supported

    repeats = SIMULATIONS_PER_DRAW if args.simulations_per_draw is None else args.simulations_per_draw
    with warnings.catch_warnings():  # a collapse is said below, in dpsbi-sample's own warning line
        warnings.filterwarnings("ignore", "corrected: the importance weights collapsed")
        result = corrected(
            posterior,
            args.correct,
            y=y,
            epsilon=args.epsilon,
            simulations_per_draw=repeats,
            seed=args.seed,
            progress=False,
        )
    print(f"importance sampling: effective sample size {result.ess:.0f} of {args.correct} proposals")
    generator = torch.Generator().manual_seed(args.seed)
    if result.ess >= args.num_samples:
        return result.resample(args.num_samples, generator)
    smooth = covariance_supported(result.ess, posterior.task.dim_unconstrained)
    how = (
        "so they are drawn without repeats by a shrunk kernel (mean and covariance kept, the shape smoothed)"
        if smooth
        else "so draws repeat (too few effective draws even for a smoothing kernel's covariance)"
    )
    print(
        f"dpsbi-sample: warning: the effective sample size ({result.ess:.0f}) is below the {args.num_samples} "
        f"draws asked for, {how}: the flow is far from the posterior here, or the simulated likelihood too noisy "
        "(raise --correct or --simulations-per-draw)",
        file=sys.stderr,
    )
    if not smooth:
        return result.resample(args.num_samples, generator)
    return smoothed_resample(posterior.task, result.samples, result.weights, args.num_samples, generator)[0]


def _sample_releases(args) -> None:
    """``dpsbi-sample --releases FILE.csv``: one ``sample_batched`` call at every release of the file."""
    from . import load_posterior
    from .experiment.outputs import format_table, write_csv

    try:
        if args.release is not None or args.release_file is not None:
            raise ValueError(
                "give the releases either as --releases FILE.csv or one as --release/--release-file"
            )
        if args.num_samples < 1:
            raise ValueError(f"--num-samples must be >= 1, got {args.num_samples}")
        path, run_dir = _posterior_path(args.target, args.method)
        task = _task_of(run_dir) if run_dir is not None else None
        posterior = load_posterior(path)
        task = task or posterior.task
        y, epsilon = read_releases(args.releases, task.release_names)
        if epsilon is not None and args.epsilon is not None:
            raise ValueError(f"{args.releases} has an epsilon column: leave --epsilon out")
        epsilon = args.epsilon if epsilon is None else epsilon
        y = task.check_release(y)
        with _outside_training_warned(" (column outside_training of the summary)"):
            draws = posterior.sample_batched((args.num_samples,), y=y, epsilon=epsilon, seed=args.seed)
        draws = draws.detach().cpu()
        checked = posterior.training_releases
        outside = [""] * y.shape[0] if checked is None else checked.flags(y, task.release_names)
    except (ValueError, RuntimeError) as error:  # RuntimeError: non-finite draws, refused by the posterior
        raise SystemExit(f"dpsbi-sample: error: {error}") from None
    names = list(task.parameter_names)
    count = draws.shape[1]
    if args.output is not None:
        values = draws.double().numpy()
        write_csv(
            args.output,
            ["release", "draw", *names],
            ([b, i, *values[i, b].tolist()] for b in range(count) for i in range(args.num_samples)),
        )
    rows = release_summary(draws, names, outside)
    if args.summary is not None:
        write_csv(
            args.summary, RELEASE_SUMMARY_COLUMNS, ([row[c] for c in RELEASE_SUMMARY_COLUMNS] for row in rows)
        )
    if count <= 10:
        print(format_table(rows, RELEASE_SUMMARY_COLUMNS))
    written = [
        f"draws to {args.output}" if args.output else "",
        f"summary to {args.summary}" if args.summary else "",
    ]
    written = " and ".join(w for w in written if w)
    print(
        f"{args.num_samples} draws at each of {count} releases from {path}"
        + (f"; {written}" if written else "")
    )


@contextlib.contextmanager
def _outside_training_warned(note: str = ""):
    """Within it, a posterior's warning that a release lies outside its training releases is printed as one
    ``dpsbi-sample: warning:`` line on stderr (with ``note``), instead of Python's warning with its source."""
    from .inference.release_check import outside_training_caught

    with outside_training_caught() as lines:
        yield
    for line in lines:
        print(f"dpsbi-sample: warning: {line}{note}", file=sys.stderr)


def compare(argv: list[str] | None = None) -> None:
    """``dpsbi-compare``: table and figure of the final metrics of every run below a (multirun) directory."""
    parser = argparse.ArgumentParser(prog="dpsbi-compare", description=compare.__doc__)
    parser.add_argument("root", type=Path, help="a multirun directory (or any directory holding runs)")
    args = parser.parse_args(argv)
    from .experiment.comparison import compare_sweep

    compare_sweep(args.root, "dpsbi-compare")
