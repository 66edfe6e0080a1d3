"""A command run by :mod:`prewarmed` sees what it would see as a fresh process: the same exit status, output,
``sys.argv``, ``sys.path`` head, directory, environment and ``__main__``; and dpsbi is imported afresh."""

import os
import subprocess
import sys
from pathlib import Path

import prewarmed
import pytest

SHOW = (
    "import os, sys, __main__; print(sys.argv, sys.path[0], os.getcwd(), os.environ.get('DPSBI_CACHE'), "
    "__name__, getattr(__main__, '__file__', None), 'dpsbi' in sys.modules, "
    "os.environ.get('PYTHONPATH', '').split(os.pathsep)[0] in sys.path)"
)


def both(command: list[str], cwd: Path, **extra: str) -> tuple:
    """``command``'s exit status, output and errors' last line, as a fresh process and from :mod:`prewarmed`."""
    env = {**os.environ, "DPSBI_CACHE": "x", **extra}
    fresh = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    warm = prewarmed.run(command, cwd=cwd, env=env, timeout=60)
    return tuple((run.returncode, run.stdout, run.stderr.strip().splitlines()[-1:]) for run in (fresh, warm))


@pytest.mark.parametrize(
    "body",
    [
        SHOW,
        "import sys; sys.exit(3)",
        "import sys; sys.exit('stopped')",
        "1 / 0",
        "import dpsbi; print(dpsbi)",
    ],
)
def test_a_command_sees_what_a_fresh_process_sees(body, tmp_path):
    (tmp_path / "script.py").write_text(body)
    fresh, warm = both([sys.executable, "-c", body, "a", "b"], tmp_path, PYTHONPATH=str(tmp_path / "lib"))
    assert warm == fresh
    fresh, warm = both([sys.executable, str(tmp_path / "script.py"), "c"], tmp_path)
    assert warm == fresh
    launcher = tmp_path / "launcher"  # as an entry point's, in the environment's bin folder
    launcher.write_text(f"#!{sys.executable}\n{body}\n")
    launcher.chmod(0o755)
    fresh, warm = both([str(launcher), "d"], tmp_path)
    assert warm == fresh and prewarmed._is_python([str(launcher)])


def test_a_command_past_its_time_is_killed_and_other_programs_run_as_subprocesses(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        prewarmed.run([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, dict(os.environ), 1)
    after = prewarmed.run([sys.executable, "-c", "print('next')"], tmp_path, dict(os.environ), 60)
    assert after.stdout == "next\n"
    assert prewarmed.run(["bash", "-c", "echo $0"], tmp_path, dict(os.environ), 60).stdout == "bash\n"
