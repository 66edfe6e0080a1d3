"""Python commands run as fresh processes would run them, less the ~5 s each spends importing libraries.

The results page's tiny-budget commands and the doc pages' blocks each start a Python process, and a process that
trains spends ~5 s of its ~9 importing torch, its compiler (which torch's optimizers import on first use), sbi,
scikit-learn, SciPy, Hydra and Matplotlib. :func:`run` pays that once per test worker: a server process imports
those libraries (:data:`LIBRARIES`, never dpsbi) and forks one child per command. The child takes the command's
directory, environment, ``sys.argv`` and ``sys.path``, imports dpsbi and runs the script (or ``-c`` code, or an
entry point's launcher) as ``__main__``, then exits as Python does (threads joined, ``atexit`` run, streams
flushed), so a command gets the exit status and output it would get alone. A command that is not this Python's
(``bash``) runs as a subprocess. The variables the libraries read on import (threads, Matplotlib's backend, and
every other one except :data:`READ_LATER`) are fixed per server: a command whose other variables differ gets a
server of its own."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

#: What a server imports before it forks (every command of the pages imports most of it).
LIBRARIES = (
    "torch",
    "torch._dynamo",
    "sbi.inference",
    "sbi.diagnostics",
    "sbi.utils.metrics",
    "sklearn.ensemble",
    "scipy.stats",
    "scipy.optimize",
    "hydra",
    "omegaconf",
    "nflows",
    "zuko",
    "matplotlib.pyplot",
)
#: Environment variables read after start-up (where caches and configs are, what the shell finds) or never read
#: by Python: a command's own values of these are set in its child; all others are fixed per server.
READ_LATER = {"PATH", "PYTHONPATH", "PWD", "OLDPWD", "PYTEST_CURRENT_TEST", "DPSBI_CACHE"}

_servers: dict[tuple, subprocess.Popen] = {}


def run(
    command: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``, the
    command forked from a server when it runs this Python: ``[sys.executable, script or "-c", ...]`` or a launcher
    (an entry point of this environment)."""
    if not _is_python(command):
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    server = _server(env)
    with tempfile.TemporaryDirectory() as streams:  # not in cwd, where a command may list what it finds
        out, err = Path(streams) / "out", Path(streams) / "err"
        request = dict(argv=list(command), cwd=str(cwd), env=env, out=str(out), err=str(err))
        server.stdin.write((json.dumps(request) + "\n").encode())
        server.stdin.flush()
        pid = int(_line(server, command, 60))
        try:
            code = int(_line(server, command, timeout))
        except BaseException:  # past its time, or interrupted: the command and what it started are stopped
            os.killpg(pid, signal.SIGKILL)
            _line(server, command, 60)
            raise
        return subprocess.CompletedProcess(command, code, out.read_text(), err.read_text())


def _is_python(command: list[str]) -> bool:
    """Whether ``command`` runs a script or code with this Python: ``sys.executable`` then a script or ``-c``
    (no other option), or a launcher whose first line names this Python."""
    if command[0] == sys.executable:  # bare, or with an option other than -c: a process of its own
        return len(command) > 1 and (command[1] == "-c" or not command[1].startswith("-"))
    if not Path(command[0]).is_file():  # a program on the PATH (bash)
        return False
    with open(command[0], "rb") as launcher:
        return launcher.readline().strip() == f"#!{sys.executable}".encode()


def _line(server: subprocess.Popen, command: list[str], timeout: float) -> str:
    """The server's next reply about ``command``, read byte by byte (nothing is left in a buffer for ``select``
    to miss)."""
    found = b""
    while not found.endswith(b"\n"):
        if not select.select([server.stdout], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(command, timeout)
        byte = os.read(server.stdout.fileno(), 1)
        if not byte:
            raise RuntimeError("the prewarmed server exited")
        found += byte
    return found.decode()


def _server(env: dict[str, str]) -> subprocess.Popen:
    """The server for ``env``'s fixed variables, started on first use."""
    key = tuple(sorted((k, v) for k, v in env.items() if k not in READ_LATER))
    if key not in _servers or _servers[key].poll() is not None:
        fixed = {k: v for k, v in env.items() if k not in READ_LATER} | {"PATH": os.environ["PATH"]}
        _servers[key] = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=fixed
        )
    return _servers[key]


@atexit.register
def _stop() -> None:
    """Close every server's input (it exits when it reads the end) and wait for it to exit."""
    for server in _servers.values():
        server.stdin.close()
        server.wait(60)
        server.stdout.close()


def _serve() -> None:
    """Import :data:`LIBRARIES`, then fork a child per request line on stdin; reply with its pid, then its exit
    status."""
    import importlib

    for library in LIBRARIES:
        importlib.import_module(library)
    base = sys.path[1:]  # this file's folder left out, as the commands' own first entries replace it
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _child(request, base)
            except BaseException:  # before its command ran (a missing directory): said in its errors
                traceback.print_exc()
            finally:
                os._exit(1)
        print(pid, flush=True)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)


def _child(request: dict, base: list[str]) -> None:
    """Run one request as ``__main__`` of a process of its own, then exit with its status (never returns)."""
    import runpy
    import threading
    import types

    for fd, path in ((1, request["out"]), (2, request["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.setpgid(0, 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(os.devnull)  # noqa: SIM115 (the process's own stdin, closed at exit)
    words = request["argv"][1:] if request["argv"][0] == sys.executable else request["argv"]
    if words[0] == "-c":  # python -c CODE ARGS
        sys.argv, first = ["-c", *words[2:]], ""
    else:  # python SCRIPT ARGS, or a launcher: SCRIPT ARGS
        sys.argv, first = words, str(Path(words[0]).resolve().parent)
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *base]
    code = 0
    try:
        if words[0] == "-c":
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(words[1], "<string>", "exec"), main.__dict__)
        else:
            runpy.run_path(words[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    _serve()
