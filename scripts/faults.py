"""Fault injection for the reliability tests (``tests/test_fault_injection.py``) and the report script
(``scripts/fault_injection.py``): damaged files, killed and concurrent ``dpsbi-run`` processes.

Every damaged file must be refused (or recomputed) or, when the damage hit bytes its reader ignores, give
exactly what the intact file gives; a killed run rerun into its directory must end with the outputs of an
uninterrupted run; concurrent runs must never mix their files.
"""

from __future__ import annotations

import csv
import os
import random
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

#: Outcomes of loading a damaged file: refused with an error, loaded giving the intact file's result,
#: or loaded giving something else (the silent failure that must never happen).
REFUSED, IDENTICAL, DIFFERENT = "refused", "identical", "different"


def flip_bytes(path: Path, rng: random.Random, places: int = 12, width: int = 16) -> None:
    """XOR ``width`` bytes at ``places`` random offsets of ``path`` with random non-zero bytes."""
    data = bytearray(path.read_bytes())
    for _ in range(places):
        start = rng.randrange(max(len(data) - width, 1))
        for i in range(start, min(start + width, len(data))):
            data[i] ^= rng.randrange(1, 256)
    path.write_bytes(bytes(data))


def truncate(path: Path, rng: random.Random) -> None:
    """Cut ``path`` at a random length (at least one byte shorter)."""
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(len(data))])


def damaged_copies(
    source: Path, directory: Path, rng: random.Random, flips: int, truncations: int
) -> Iterator[tuple[str, Path]]:
    """``(kind, path)`` of ``flips`` byte-flipped and ``truncations`` truncated copies of ``source``, one at a
    time in ``directory`` under ``source``'s name (each replaces the previous one)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / source.name
    for kind, damage, count in (("flip", flip_bytes, flips), ("truncate", truncate, truncations)):
        for _ in range(count):
            shutil.copyfile(source, target)
            damage(target, rng)
            yield kind, target


#: Errors that count as a refusal: ``ValueError`` (refused at load), ``RuntimeError`` (NaN draws refused).
REFUSALS = (ValueError, RuntimeError)


def judge(
    load: Callable[[], object], intact: object, refusal: tuple[type[BaseException], ...] = REFUSALS
) -> str:
    """Run ``load()``: :data:`REFUSED` if it raises one of ``refusal``, :data:`IDENTICAL` if it returns
    ``intact`` (compared with ``==``), :data:`DIFFERENT` otherwise. Any other exception propagates."""
    try:
        result = load()
    except refusal:
        return REFUSED
    return IDENTICAL if result == intact else DIFFERENT


def corruption_trials(
    source: Path,
    directory: Path,
    load: Callable[[Path], object],
    rng: random.Random,
    flips: int,
    truncations: int,
) -> Counter:
    """Counts of outcomes over damaged copies of ``source``, each judged against ``load(source)``."""
    intact = load(source)
    return Counter(
        judge(lambda: load(path), intact)
        for _, path in damaged_copies(source, directory, rng, flips, truncations)
    )


# ---- processes ------------------------------------------------------------------------------------------
def dpsbi_run(args: Sequence[str]) -> list[str]:
    """The command line of ``dpsbi-run`` with ``args``, through this Python interpreter."""
    return [sys.executable, "-c", "from dpsbi.cli import run; run()", *args]


def start(args: Sequence[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """Start ``dpsbi-run args`` in its own process group, output captured."""
    return subprocess.Popen(
        dpsbi_run(args),
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def kill_after(process: subprocess.Popen, seconds: float) -> bool:
    """SIGKILL ``process``'s group after ``seconds`` unless it ended before; True if it was killed."""
    try:
        process.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return True


def finish(
    args: Sequence[str], cwd: Path, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run ``dpsbi-run args`` to its end."""
    return subprocess.run(
        dpsbi_run(args),
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_outputs(run_dir: Path) -> dict:
    """What a finished run produced, for comparison: every ``samples*.csv`` and the metric rows without
    their wall times. Empty if the run did not finish."""
    run_dir = Path(run_dir)
    if not (run_dir / "summary.json").is_file():
        return {}
    samples = {str(p.relative_to(run_dir)): p.read_text() for p in sorted(run_dir.glob("*/samples*.csv"))}
    with (run_dir / "metrics.csv").open() as f:
        rows = [{k: v for k, v in row.items() if k != "wall_time"} for row in csv.DictReader(f)]
    return {"samples": samples, "metrics": rows, "seed": _config_seed(run_dir)}


def _config_seed(run_dir: Path) -> str | None:
    for line in (run_dir / "config.yaml").read_text().splitlines():
        if line.startswith("seed:"):
            return line.split(":", 1)[1].strip()
    return None
