"""The docs run as written: every ```python and ```bash block of docs/YOUR_MODEL.md, in order, in a fresh
directory (a block starting ``# file: NAME`` is written to NAME; the others run in their own process), and
the README's quick start."""

import re
import subprocess
from pathlib import Path

from docs_runner import blocks, run_block

ROOT = Path(__file__).parents[1]


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


#: A run of path characters; one holding a ``/`` and a ``..`` step is a relative path to resolve.
PATH_TOKEN = re.compile(r"[\w.@+~/-]+")
#: Absolute paths into a machine's own directories (``/tmp`` is left out: scratch space a command writes, such as
#: ``--out /tmp/rqmc``, not material the repository depends on).
ABSOLUTE_PATH = re.compile(r"(?<![\w.~$}/-])/(?:work|home|Users|root|mnt|shared|scratch)/[\w.@+~/-]*")
#: The project's notes outside the repository, named from anywhere (their content lives in docs/DESIGN.md).
SHARED_NOTES = "/".join(["..", "shared"])


def paths_outside(relative: str, text: str) -> list[str]:
    """The paths named in ``text``, the content of the file at ``relative`` (from the repository root), that
    lead outside the repository: a relative path whose ``..`` steps climb above the root from that file's
    directory, the shared notes, and absolute paths of :data:`ABSOLUTE_PATH`."""
    found = [m.group() for m in ABSOLUTE_PATH.finditer(text)]
    found += [SHARED_NOTES] if SHARED_NOTES in text else []
    for token in PATH_TOKEN.findall(text):
        steps = token.split("/")
        if token.startswith("/") or len(steps) < 2 or ".." not in steps:
            continue
        depth = len(Path(relative).parent.parts)
        for step in steps:
            depth += -1 if step == ".." else 0 if step in ("", ".") else 1
            if depth < 0:
                found.append(token)
                break
    return found


def test_no_tracked_file_names_a_path_outside_the_repository():
    """A newcomer's clone is all there is: no tracked text file names a file outside it (the design notes, once
    next to the repository, are docs/DESIGN.md)."""
    planted = "Design notes: `" + "/".join(["..", "shared", "DESIGN.md"]) + "` (architecture)."
    assert paths_outside("README.md", planted)  # the pointer the README had
    assert paths_outside("docs/EXPERIMENTS.md", "see " + "/".join(["..", "..", "x.md"]))
    assert paths_outside("Makefile", "cd " + "/".join(["", "work", "main"]))
    assert not paths_outside("experiments/README.md", "[configs](" + "/".join(["..", "configs", "x"]) + ")")
    assert not paths_outside("dpsbi/inference/sppe.py", "from .. import tasks; y_1, ..., y_n; 0..n; .../x")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    outside = {}
    for relative in tracked.stdout.splitlines():
        path = ROOT / relative
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):  # figures, weights; deleted files
            continue
        found = paths_outside(relative, text)
        if found:
            outside[relative] = sorted(set(found))
    assert not outside, f"tracked files name paths outside the repository: {outside}"
