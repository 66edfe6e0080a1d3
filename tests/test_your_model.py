"""The docs run as written: every ```python and ```bash block of docs/YOUR_MODEL.md, in order, in a fresh
directory (a block starting ``# file: NAME`` is written to NAME; the others run in their own process), and
the README's quick start."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
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
        "PYTHONPATH": str(cwd),
    }
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (
        f"{language} block failed:\n{code}\n--- output ---\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def test_the_your_model_page_runs_as_written(tmp_path):
    outputs = [
        run_block(language, code, tmp_path) for language, code in blocks(ROOT / "docs" / "YOUR_MODEL.md")
    ]
    text = "\n".join(outputs)
    scores = [float(v) for v in re.findall(r"C2ST vs exact ([0-9.]+)", text)]
    assert len(scores) == 2 and max(scores) <= 0.65, text  # SPPE and SPLE near the exact posterior
    assert (
        "0.5 = indistinguishable" in text and "already finished" not in text
    )  # the run's table explains itself
    assert (tmp_path / "draws.csv").is_file() and len(
        (tmp_path / "draws.csv").read_text().splitlines()
    ) == 1001
    assert len(list((tmp_path / "runs" / "survey_by_epsilon").glob("*/summary.json"))) == 2


def test_the_readme_quick_start_runs_as_written(tmp_path):
    (code,) = [code for language, code in blocks(ROOT / "README.md") if language == "python"]
    out = run_block("python", code, tmp_path)
    assert float(out.strip().splitlines()[-1]) <= 0.6, out


def test_no_link_points_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    texts = [p for p in tracked if p.endswith((".md", ".py", ".yaml", ".toml", ".txt"))]
    linked = [p for p in texts if re.search(r"https?://", (ROOT / p).read_text())]
    assert not linked, f"links outside the repository in {linked}"
