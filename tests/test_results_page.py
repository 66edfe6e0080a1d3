"""docs/RESULTS.md stays runnable: every command in its ``sh`` blocks names a script or entry point that exists, the
results files it reads exist, every figure it shows exists, and the commands that only read committed results
(reports) run and reproduce the page's tables from them."""

import glob
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "RESULTS.md"


def commands() -> list[list[str]]:
    """The page's commands, as argument lists (environment assignments and ``.venv/bin/`` dropped)."""
    text = PAGE.read_text()
    blocks = text.split("```sh\n")[1:]
    out = []
    for block in blocks:
        for line in block.split("```")[0].splitlines():
            words = [w for w in shlex.split(line) if "=" not in w.split("/")[0] or w.startswith("-")]
            if words:
                out.append([w.removeprefix(".venv/bin/") for w in words])
    return out


def test_every_command_names_a_script_or_entry_point_that_exists():
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    entry_points = set(re.findall(r"^([\w-]+) = ", scripts, re.M))
    assert entry_points >= {"dpsbi-run", "dpsbi-sample"}
    found = commands()
    assert len(found) >= 15
    for words in found:
        if words[0] == "python":
            assert (ROOT / words[1]).is_file(), words
        else:
            assert words[0] in entry_points, words


def test_the_results_files_read_and_the_figures_shown_exist():
    for words in commands():
        for word in words:
            if word.startswith("results/") and word.endswith(".jsonl"):
                assert glob.glob(str(ROOT / word)), word
    for figure in re.findall(r"!\[[^\]]*\]\((figures/[^)]+)\)", PAGE.read_text()):
        assert (ROOT / "docs" / figure).is_file(), figure


REPORTS = [
    words for words in commands() if words[:2] == ["python", "scripts/stop_rule.py"] or "report" in words
]


@pytest.mark.parametrize("words", REPORTS, ids=[" ".join(w[1:3]) for w in REPORTS])
def test_the_report_commands_run_on_the_committed_results(words, tmp_path):
    """Reports read committed rows (``results/``); figures go to a temporary directory. Reports whose inputs are
    kept out of git (a census run's references) are skipped where absent."""
    if "census_scale.py" in words[1]:
        pytest.skip("census_scale's report reads its working files, kept out of git")
    args = []
    for i, word in enumerate(words[1:]):
        if words[i] == "--figure":
            args.append(str(tmp_path / "figure.png"))
        elif "*" in word:
            args.extend(sorted(glob.glob(word, root_dir=ROOT)))
        else:
            args.append(word)
    run = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "|" in run.stdout and ("--figure" not in words or (tmp_path / "figure.png").is_file()), run.stdout[
        -500:
    ]
