"""Comparison across the runs of a sweep: a table and a figure of the final metrics of every run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ..files import first_line
from .config import METRICS
from .outputs import format_table, write_rows
from .plots import comparison_plot

#: What a sweep's job leaves in its directory when its configuration could not run.
ERROR_FILE = "error.txt"


#: The fields of a summary row that the comparison reads, and what each must be; every row has the first five.
ROW_FIELDS = {
    "task": "text",
    "method": "text",
    "epsilon": "a number or null",
    "num_simulations": "an integer",
    "wall_time": "a number",
    "reference": "text",
    **dict.fromkeys(METRICS, "a number or null"),
}
_REQUIRED = tuple(ROW_FIELDS)[:5]
_NUMBER = (int, float)
_IS = {
    "text": lambda v: isinstance(v, str),
    "an integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "a number": lambda v: isinstance(v, _NUMBER) and not isinstance(v, bool),
    "a number or null": lambda v: v is None or (isinstance(v, _NUMBER) and not isinstance(v, bool)),
}


def read_summary(path: str | Path) -> dict:
    """A run's ``summary.json`` at ``path`` (written by dpsbi-run), its final rows under ``"runs"``; ``ValueError``
    saying what is wrong when the file cannot be read or its rows lack a field of :data:`ROW_FIELDS` or have one of
    another type, so that no wrong row enters a comparison."""
    try:
        stored = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"cannot read it ({first_line(error)})") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"not JSON ({first_line(error)})") from None
    runs = stored.get("runs") if isinstance(stored, dict) else None
    if not isinstance(runs, list) or not runs:
        raise ValueError("no list of rows under 'runs': not a dpsbi-run summary")
    for i, row in enumerate(runs):
        if not isinstance(row, dict):
            raise ValueError(f"runs[{i}] is not an object")
        for field, kind in ROW_FIELDS.items():
            if field not in row:
                if field in _REQUIRED:
                    raise ValueError(f"runs[{i}] has no {field!r}")
            elif not _IS[kind](row[field]):
                raise ValueError(f"runs[{i}].{field} is {json.dumps(row[field])[:40]}, not {kind}")
    return stored


def collect(root: str | Path) -> list[dict]:
    """The final metric rows of every run below ``root`` (each run's ``summary.json``), with its directory. A
    summary that :func:`read_summary` refuses is skipped with one line on stderr naming it and the problem."""
    rows = []
    for path in sorted(Path(root).rglob("summary.json")):
        try:
            runs = read_summary(path)["runs"]
        except ValueError as error:
            print(f"dpsbi-compare: skipped {path}: {error}", file=sys.stderr)
            continue
        rows += [{**row, "run": str(path.parent.relative_to(root))} for row in runs]
    return rows


def failed(root: str | Path) -> list[str]:
    """One line per run below ``root`` that could not run (its :data:`ERROR_FILE`): its directory and the
    first line of the reason."""
    lines = []
    for path in sorted(Path(root).rglob(ERROR_FILE)):
        try:
            reason = (path.read_text(errors="replace").strip().splitlines() or [""])[0]
        except OSError as error:
            reason = f"(its {ERROR_FILE} cannot be read: {first_line(error)})"
        lines.append(f"  {path.parent.relative_to(root)}: {reason}")
    return lines


def compare(root: str | Path) -> list[dict]:
    """Write ``comparison.csv/.json`` and ``comparison.png`` into ``root`` (a multirun directory) and print
    the table; returns the rows. Raises ``FileNotFoundError`` when no run below ``root`` has finished."""
    root = Path(root)
    rows = collect(root)
    if not rows:
        raise FileNotFoundError(f"no finished runs (summary.json) below {root}")
    write_rows(root / "comparison", rows)
    comparison_plot(rows, METRICS, root / "comparison.png")
    print(
        f"\n{format_table(rows, ('task', 'epsilon', 'reference', 'method', 'num_simulations', 'wall_time', *METRICS, 'run'))}"
    )
    print(f"comparison: {root / 'comparison.png'}")
    return rows


def compare_sweep(root: str | Path, prog: str) -> list[dict]:
    """:func:`compare` the finished runs below ``root``, then list the runs that could not run (:func:`failed`)
    and exit with status 1 if there are any; with no finished run, exit with a line saying so. ``prog`` begins
    the lines. Returns the rows."""
    root = Path(root)
    try:
        rows, missing = compare(root), None
    except FileNotFoundError as error:
        rows, missing = [], f"{prog}: error: {error}"
    lines = failed(root)
    if lines:
        heading = f"{prog}: {len(lines)} job(s) of the sweep could not run:"
        raise SystemExit("\n".join([*([missing] if missing else []), heading, *lines]))
    if missing:
        raise SystemExit(missing)
    return rows


class CompareCallback(Callback):
    """Hydra callback (dpsbi/configs/config.yaml, ``hydra.callbacks.compare``): compares a sweep's runs when it ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """Compare the finished runs; then, if some jobs could not run, list them and exit with status 1."""
        compare_sweep(config.hydra.sweep.dir, "dpsbi-run")
