"""Files that are never half-written, never silently corrupt, and never written by two processes at once.

- :func:`atomic_save` / :func:`atomic_write_text`: write to a temporary name unique to this process and this
  call, then rename over the target, so a kill leaves the old file or the new one, and two writers never
  share a temporary file.
- :func:`save_sealed` / :func:`load_sealed`: a ``torch.save`` dict carrying the SHA-256 of its own content
  (tensors' bytes, dtypes and shapes, strings, numbers); a file whose content does not match is refused.
- :func:`exclusive`: a lock file (``filelock``) held while a process writes a directory or a cache entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from filelock import FileLock, Timeout

#: Key of the checksum inside a sealed payload.
SEAL = "sha256"


class CorruptFileError(ValueError):
    """A file that is unreadable, truncated, or whose content does not match its checksum."""


class BusyError(RuntimeError):
    """A lock held by another process."""


def temporary_path(path: str | os.PathLike) -> Path:
    """A sibling of ``path`` whose name is unique to this process and call (``<name>.<pid>.<random>.tmp``)."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


class WriteError(OSError):
    """A file that could not be written (a full disk, a folder that is not writable): one line naming it."""


def _process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts as alive; pid 0 and below never match a
    temporary file's, so they count as alive too)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (OSError, OverflowError):  # no such process (ProcessLookupError), or not a valid pid
        return False
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files of ``path`` (``<name>.<pid>.<8 hex>.tmp``, see :func:`temporary_path`) left by
    processes that no longer exist (killed during a save); never those of a live process. Returns them."""
    path = Path(path)
    pattern = re.compile(re.escape(path.name) + r"\.(\d+)\.[0-9a-f]{8}\.tmp")
    removed = []
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            match = pattern.fullmatch(entry.name)
            if match and not _process_alive(int(match.group(1))):
                with contextlib.suppress(OSError):
                    entry.unlink()
                    removed.append(entry)
    return removed


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary)`` and rename the temporary file onto ``path`` once it is complete and synced.
    Temporary files of ``path`` left by dead processes are removed first (:func:`remove_stale_temporaries`); a
    failing write (an ``OSError``, or torch's ``RuntimeError`` from a short write) raises :class:`WriteError`
    naming ``path`` and the likely cause."""
    path = Path(path)
    remove_stale_temporaries(path)
    tmp = temporary_path(path)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as error:
        if isinstance(error, (FileNotFoundError, WriteError)) or (
            isinstance(error, RuntimeError) and not _is_write_failure(error)
        ):
            raise
        raise WriteError(
            f"could not write {path}: the disk may be full or the folder not writable; free space or choose "
            f"another folder ({type(error).__name__}: {first_line(error)})",
        ) from error
    finally:
        tmp.unlink(missing_ok=True)


def _is_write_failure(error: RuntimeError) -> bool:
    """Whether torch's ``RuntimeError`` reports a failed write of its zip archive (e.g. ``[enforce fail at
    inline_container.cc:...] . unexpected pos ...`` on a full disk), not a problem with the payload."""
    text = str(error)
    return "inline_container" in text or "unexpected pos" in text or "file write failed" in text


def atomic_save(payload, path: str | os.PathLike) -> None:
    """``torch.save(payload)`` to ``path`` through :func:`atomic_write`."""
    atomic_write(path, lambda tmp: torch.save(payload, tmp))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through :func:`atomic_write`."""
    atomic_write(path, lambda tmp: tmp.write_text(text))


def digest(value) -> str:
    """SHA-256 (hex) of a nest of dicts, lists, tensors, strings, numbers and ``None``; tensors count by dtype,
    shape and bytes (on the CPU), dict keys in sorted order."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def _feed(h, value) -> None:
    if torch.is_tensor(value):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        h.update(f"D{len(value)}".encode())
        for key in sorted(value, key=str):
            _feed(h, str(key))
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, str):
        data = value.encode()
        h.update(f"S{len(data)}:".encode() + data)
    elif value is None or isinstance(value, (bool, int, float)):
        h.update(f"V{value!r};".encode())
    else:
        raise TypeError(f"cannot checksum a {type(value).__name__}")


def save_sealed(payload: dict, path: str | os.PathLike) -> None:
    """Save ``payload`` (tensors and plain containers) atomically, with its checksum under :data:`SEAL`."""
    atomic_save({**payload, SEAL: digest(payload)}, path)


def load_sealed(path: str | os.PathLike, what: str, map_location=None) -> dict:
    """The payload saved by :func:`save_sealed` at ``path`` (checksum removed). Raises ``FileNotFoundError``
    if there is no file and :class:`CorruptFileError` (naming the file and ``what`` it should be) if it cannot
    be read, is not a sealed dict, or its content does not match its checksum."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {what} at {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # truncated, flipped bytes in the archive, or a pickle of arbitrary objects
        raise CorruptFileError(
            f"{path} is not a readable {what} ({type(error).__name__}: {first_line(error)})"
        ) from None
    if not isinstance(payload, dict) or not isinstance(payload.get(SEAL), str):
        raise CorruptFileError(f"{path} is not a {what} written by this dpsbi (no checksum); refusing it")
    stored = payload.pop(SEAL)
    try:
        actual = digest(payload)
    except TypeError as error:
        raise CorruptFileError(f"{path} is not a {what} ({error})") from None
    if actual != stored:
        raise CorruptFileError(
            f"{path}: checksum mismatch, the {what} is corrupt (damaged or edited bytes); refusing it"
        )
    return payload


def first_line(error: Exception) -> str:
    """The first line of ``error``'s message, at most 200 characters: for a one-line refusal."""
    text = str(error).strip().splitlines()
    return text[0][:200] if text else ""


@contextlib.contextmanager
def exclusive(lock_path: str | os.PathLike, what: str, timeout: float = -1) -> Iterator[None]:
    """Hold the lock file ``lock_path`` (created if needed) for the block. ``timeout`` seconds to wait
    (``-1``: forever, ``0``: not at all); raises :class:`BusyError` naming ``what`` when it is not free."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path), timeout=timeout)
    try:
        lock.acquire()
    except Timeout:
        raise BusyError(
            f"{what} is in use by another process (lock file {lock_path}); wait for it or use another directory"
        ) from None
    try:
        yield
    finally:
        lock.release()
