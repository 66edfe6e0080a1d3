"""Runs a markdown page as written: its ```python and ```bash blocks, in order, in a fresh directory (a block
starting ``# file: NAME`` is written to NAME; the others run in a process of their own, :mod:`prewarmed`'s).
Used by the tests of docs/YOUR_MODEL.md, docs/REAL_RELEASES.md, docs/REAL_DATA.md and the README's quick
start."""

import os
import re
import sys
from pathlib import Path

import prewarmed

BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.S)
FILE = re.compile(r"# file: (\S+)\n")


def blocks(path: Path) -> list[tuple[str, str]]:
    """``(language, code)`` of the python and bash blocks of a markdown file, in order."""
    return BLOCK.findall(path.read_text())


def run_block(language: str, code: str, cwd: Path) -> str:
    """Write a ``# file:`` block, or run the block in its own process; its output (fails the test on error)."""
    named = FILE.match(code)
    if named:
        (cwd / named.group(1)).write_text(code)
        return ""
    command = [sys.executable, "-c", code] if language == "python" else ["bash", "-e", "-c", code]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        # the page's folder first, then the caller's PYTHONPATH (a worktree's code when run as CONTRIBUTING says)
        "PYTHONPATH": os.pathsep.join(p for p in (str(cwd), os.environ.get("PYTHONPATH", "")) if p),
    }
    done = prewarmed.run(command, cwd=cwd, env=env, timeout=900)
    assert done.returncode == 0, (
        f"{language} block failed:\n{code}\n--- output ---\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout
