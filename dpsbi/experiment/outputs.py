"""Files of a run: draws as CSV, metric rows as CSV and JSON, and the summary table. Every file is written
atomically (:func:`dpsbi.files.atomic_write`): a killed run leaves the old version or the new one."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from ..files import atomic_write, atomic_write_text

#: Columns of the summary table, in order (missing ones are left out).
SUMMARY_COLUMNS = (
    "task",
    "epsilon",
    "reference",
    "method",
    "round",
    "num_simulations",
    "wall_time",
    "cpu_time",
    "c2st",
    "mmd",
    "sd_ratio",
    "width95_ratio",
    "nlog",
    "lmd",
    "rhat",
    "ess_bulk",
    "y_obs_outside",
)


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence]) -> None:
    """Write ``rows`` under ``header`` as CSV to ``path`` (its directory made where missing)."""

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(rows)

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write)


def write_draws(path: Path, draws: Tensor, names: Sequence[str]) -> None:
    """Write ``draws (n, d)`` as CSV with a header of parameter ``names``."""
    write_csv(path, names, draws.detach().cpu().double().tolist())


def read_draws(path: Path) -> tuple[Tensor, list[str]]:
    """Draws ``(n, d)`` and parameter names from a CSV written by :func:`write_draws`."""
    with Path(path).open() as f:
        rows = list(csv.reader(f))
    return torch.tensor([[float(v) for v in row] for row in rows[1:]]), rows[0]


def write_rows(stem: Path, rows: list[dict]) -> None:
    """Write metric ``rows`` to ``stem.csv`` and ``stem.json`` (columns: the union of the rows' keys)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            writer.writerows(rows)

    stem.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(stem.with_suffix(".csv"), write)
    write_json(stem.with_suffix(".json"), rows)


def write_json(path: Path, value) -> None:
    """Write ``value`` (dicts, lists, numbers, strings; tensors as lists) as indented JSON to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(value, indent=2, default=_json_default))


def read_json(path: Path):
    """The value of a JSON file written by :func:`write_json`."""
    return json.loads(Path(path).read_text())


def read_rows(path: Path) -> list[dict]:
    """Rows written by :func:`write_rows` (from the ``.json`` file)."""
    return read_json(Path(path).with_suffix(".json"))


def _json_default(value):
    return value.tolist() if isinstance(value, Tensor) else str(value)


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


#: What each column of the summary table means, and which direction is better.
COLUMN_MEANINGS = {
    "reference": "how the reference posterior was made (closed_form, rejection: exact; importance: approximate)",
    "round": "rounds fitted",
    "num_simulations": "simulations of the model used by the method",
    "wall_time": "seconds spent fitting (scoring excluded)",
    "cpu_time": "CPU seconds spent fitting, all threads (scoring excluded): comparable when jobs share the cores",
    "c2st": "accuracy of a classifier telling the draws from the reference's: 0.5 = indistinguishable (best), 1 = disjoint",
    "mmd": "maximum mean discrepancy between the draws and the reference's: lower is better, 0 = same distribution",
    "sd_ratio": "posterior sd over the reference's, mean over parameters (each in metrics.json): 1 is best, above 1 too wide",
    "width95_ratio": "central 95 % interval width over the reference's, mean over parameters (each in metrics.json): 1 is best, above 1 too wide tails",
    "nlog": "minus log posterior density (KDE of the draws) at the true parameter: lower is better",
    "lmd": "log median distance between releases simulated from the draws and the observed release: lower is better",
    "rhat": "MCMC chains' rank-normalized split R-hat (ArviZ), largest over parameters: near 1 when the chains agree (Vehtari et al. ask < 1.01; chains of 20 draws read 1.01-1.02 even for independent draws)",
    "ess_bulk": "MCMC chains' bulk effective sample size (ArviZ), smallest over parameters: their worth in independent draws (SPLE: its chains run on to 20 draws each, 10000 for 500 chains)",
    "y_obs_outside": "yes: y_obs lies outside the releases the method trained on, so its posterior extrapolates there (why: y_obs_outside_detail in summary.json); expected of naive_npe, which trains on noiseless summaries",
}


def legend(rows: Iterable[dict]) -> str:
    """One line per column of the summary table of ``rows`` that :data:`COLUMN_MEANINGS` explains."""
    rows = list(rows)
    shown = [c for c in COLUMN_MEANINGS if any(c in row for row in rows)]
    width = max(map(len, shown), default=0)
    return "\n".join(f"  {c.ljust(width)}  {COLUMN_MEANINGS[c]}" for c in shown)


def format_table(rows: Iterable[dict], columns: Sequence[str] = SUMMARY_COLUMNS) -> str:
    """A fixed-width text table of ``rows`` over the ``columns`` that at least one row has."""
    rows = list(rows)
    columns = [c for c in columns if any(c in row for row in rows)]
    cells = [columns] + [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(line, widths)) for line in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])
