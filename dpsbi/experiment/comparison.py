"""Comparison across the runs of a sweep: a table and a figure of the final metrics of every run."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from .config import METRICS
from .outputs import format_table, write_rows
from .plots import comparison_plot

#: What a sweep's job leaves in its directory when its configuration could not run.
ERROR_FILE = "error.txt"


def collect(root: str | Path) -> list[dict]:
    """The final metric rows of every run below ``root`` (each run's ``summary.json``), with its directory."""
    rows = []
    for path in sorted(Path(root).rglob("summary.json")):
        for row in json.loads(path.read_text())["runs"]:
            rows.append({**row, "run": str(path.parent.relative_to(root))})
    return rows


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


class CompareCallback(Callback):
    """Hydra callback (dpsbi/configs/config.yaml, ``hydra.callbacks.compare``): compares a sweep's runs when it ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """Compare the finished runs; then, if some jobs could not run, list them and exit with status 1."""
        root = Path(config.hydra.sweep.dir)
        try:
            compare(root)
        except FileNotFoundError as error:
            print(f"dpsbi-compare: {error}")
        failed = sorted(root.rglob(ERROR_FILE))
        if failed:
            lines = [f"  {path.parent.relative_to(root)}: {path.read_text().strip()}" for path in failed]
            raise SystemExit(
                f"dpsbi-run: {len(failed)} job(s) of the sweep could not run:\n" + "\n".join(lines)
            )
