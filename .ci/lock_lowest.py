"""Write .ci/lowest.txt: dpsbi[test] with each direct dependency at its lower bound in pyproject.toml.

Run it after changing a bound (``make test`` fails until the two agree, tests/test_packaging.py):

    python -m venv /tmp/uv && /tmp/uv/bin/pip install uv
    python .ci/lock_lowest.py /tmp/uv/bin/uv

Each ``name>=X`` becomes the constraint ``name==X`` (uv's ``--resolution lowest-direct`` alone can land above
a bound when a newer indirect dependency asks for more); the indirect dependencies take their newest versions
that fit. torch is resolved as the CPU build that the Makefile installs (``TORCH``), found where pip finds it
(``PIP_FIND_LINKS``), and left out of the file.
"""

import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".ci" / "lowest.txt"
TORCH_BUILD = "torch==2.13.0+cpu"  # the Makefile's TORCH, as the local CPU wheel names it


def floors() -> list[str]:
    """``name==X`` for each ``name>=X`` among the dependencies and the test extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = []
    for requirement in project["dependencies"] + project["optional-dependencies"]["test"]:
        match = re.match(r"^([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement)
        if match and match[1] != "torch":
            pins.append(f"{match[1]}=={match[2]}")
    return pins + [TORCH_BUILD]


def main(uv: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("\n".join(floors()) + "\n")
        constraints.flush()
        command = [
            uv, "pip", "compile", "pyproject.toml", "--extra", "test", "--python-version", "3.11",
            "--resolution", "lowest-direct", "-c", constraints.name, "--no-emit-package", "torch",
            "--no-header", "--no-annotate", "-q",
        ]  # fmt: skip
        for links in os.environ.get("PIP_FIND_LINKS", "").split():
            command += ["--find-links", links]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stderr)
    header = (
        "# dpsbi[test] at the lower bounds of pyproject.toml, every package pinned (written by\n"
        "# .ci/lock_lowest.py; `make test-lowest` installs it with --no-deps after the Makefile's TORCH).\n"
    )
    OUT.write_text(header + done.stdout)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "uv")
