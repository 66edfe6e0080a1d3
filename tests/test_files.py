"""dpsbi.files: temporary files of killed saves are cleaned up; a failing write names the file and the disk."""

import errno
import os
import subprocess
import sys

import pytest
import torch

from dpsbi import files


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_save_removes_temporaries_of_dead_processes_only(tmp_path):
    target = tmp_path / "posterior.pt"
    dead = tmp_path / f"posterior.pt.{_dead_pid()}.0123abcd.tmp"
    live = tmp_path / f"posterior.pt.{os.getpid()}.89abcdef.tmp"  # a save of this (live) process in flight
    other = tmp_path / f"samples.csv.{_dead_pid()}.0123abcd.tmp"  # another target's: left for its own save
    for path in (dead, live, other):
        path.write_bytes(b"half a file")
    files.atomic_save({"x": torch.zeros(2)}, target)
    assert not dead.exists()
    assert live.exists() and other.exists()
    assert torch.equal(torch.load(target)["x"], torch.zeros(2))


@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0"),
        OSError(errno.ENOSPC, "No space left on device"),
    ],
)
def test_a_failing_write_names_the_file_and_the_disk(failure, tmp_path, monkeypatch):
    def full_disk(payload, path):
        open(path, "wb").close()
        raise failure

    monkeypatch.setattr(files.torch, "save", full_disk)
    target = tmp_path / "checkpoint.pt"
    with pytest.raises(OSError, match="disk may be full") as caught:
        files.atomic_save({"x": torch.zeros(2)}, target)
    message = str(caught.value)
    assert str(target) in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


def test_an_error_in_the_payload_is_not_blamed_on_the_disk(tmp_path):
    with pytest.raises(RuntimeError) as caught:
        files.atomic_write(tmp_path / "x.txt", lambda tmp: (_ for _ in ()).throw(RuntimeError("bad payload")))
    assert "disk" not in str(caught.value)
