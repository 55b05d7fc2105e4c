"""Atomic files, stale temporaries, a per-directory lock, reading the DISABLED marker.

A file is written to a temporary sibling ``.<name>.<host>-<pid>-<random>.tmp``, flushed,
fsynced and renamed over the target, so a reader sees the old bytes or the new ones, never a
part. A directory is built in a temporary sibling of the same form and swapped in with one
atomic exchange (Linux ``renameat2``); where that is missing the old one is first renamed
aside to ``.<name>.<host>-<pid>-<random>.old``. Temporaries are created with mode ``0o666``
(files) or ``0o777`` (directories) less the umask, like any new file.

Every writer first calls ``remove_stale`` on its target: temporaries whose process is gone
(a killed run) are removed, ``.old`` copies too, never renamed into place (anyone can plant
one). The host and pid in the names keep a live writer's temporaries safe. A device node,
FIFO or socket is never replaced. ``locked`` serialises the writers of one directory.

A stage whose input is switched off in params still has to produce its DVC outputs; its
output directory then holds ``DISABLED.txt`` saying why (``capsnet.io.outputset.write_disabled``
writes it, ``read_disabled`` reads it). Directories are published by ``capsnet.io.outputset``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from capsnet.io.errors import CapsnetError

DISABLED_MARKER = "DISABLED.txt"
TEMP_SUFFIX = ".tmp"
OLD_SUFFIX = ".old"
LOCK_NAME = ".capsnet.lock"
LOCK_TIMEOUT_ENV = "CAPSNET_LOCK_TIMEOUT"
#: A temporary made on another host is judged by its age alone: stale after a day.
FOREIGN_STALE_SECONDS = 24 * 3600
_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]
#: ``.<target>.<host>-<pid>-<random>.tmp|.old``, or ``.<target>.<random>.tmp`` of older runs.
_TEMP_RE = re.compile(
    r"\.(?P<target>.+)\.(?:(?P<host>[0-9a-f]{6})-(?P<pid>[0-9]{1,10})-)?[0-9a-f]{8}"
    r"(?P<kind>\.tmp|\.old)"
)


def fsync_dir(directory: str | os.PathLike) -> None:
    """Flush a directory entry (a rename) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_name(path: str | os.PathLike, suffix: str = TEMP_SUFFIX) -> Path:
    """A new temporary sibling name of ``path`` that ``remove_stale`` recognises."""
    path = Path(path)
    token = f"{_HOST}-{os.getpid()}-{secrets.token_hex(4)}"
    return path.with_name(f".{path.name}.{token}{suffix}")


def new_temp_file(path: str | os.PathLike) -> tuple[int, Path]:
    """(fd, path) of a new empty temporary sibling of ``path``, mode 0o666 less the umask."""
    while True:
        tmp = temp_name(path)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def new_temp_dir(path: str | os.PathLike) -> Path:
    """A new empty temporary sibling directory of ``path``, mode 0o777 less the umask."""
    while True:
        tmp = temp_name(path)
        try:
            os.mkdir(tmp, 0o777)
            return tmp
        except FileExistsError:
            continue


def _owner_gone(entry: Path, host: str | None, pid: str | None) -> bool:
    """Whether the process that made the temporary ``entry`` can no longer be writing it."""
    if host is None:  # the older form without host and pid: no writer makes these now
        return True
    if host != _HOST:
        try:
            return time.time() - entry.lstat().st_mtime > FOREIGN_STALE_SECONDS
        except FileNotFoundError:
            return False
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def stale_temporaries(directory: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Temporaries in ``directory`` (of the target ``name``, or of any) whose writer is gone."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in names:
        match = _TEMP_RE.fullmatch(entry)
        if match is None or (name is not None and match["target"] != name):
            continue
        path = Path(directory) / entry
        if _owner_gone(path, match["host"], match["pid"]):
            found.append(path)
    return sorted(found)


def remove_stale(path: str | os.PathLike) -> list[Path]:
    """Remove what killed writers of ``path`` left beside it (``.old`` copies included);
    return what was removed."""
    path = Path(path)
    removed = []
    for leftover in stale_temporaries(path.parent, path.name):
        _remove(leftover)
        removed.append(leftover)
    return removed


def remove_stale_in(directory: str | os.PathLike) -> list[Path]:
    """``remove_stale`` for every target in ``directory`` that a killed writer left debris of."""
    directory = Path(directory)
    targets = {_TEMP_RE.fullmatch(p.name)["target"] for p in stale_temporaries(directory)}
    return [removed for t in sorted(targets) for removed in remove_stale(directory / t)]


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file handle whose content replaces ``path`` when the block succeeds.

    On any error the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    refuse_special(path)
    refuse_read_only(path)
    remove_stale(path)
    fd, tmp = new_temp_file(path)
    try:
        with naming_target(path), os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


#: Errors of a write that name no file (a full disk, a quota, a file-size limit).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


@contextlib.contextmanager
def naming_target(path: str | os.PathLike) -> Iterator[None]:
    """Raise a write's OSError that names no file as one naming ``path``, the output it
    was writing, so the message blames that file and not some other path."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno in WRITE_ERRNOS:
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None
        raise


def refuse_read_only(path: str | os.PathLike, what: str = "") -> None:
    """CapsnetError when ``path`` exists without write permission: an atomic rename would
    replace it silently (even for root, hence the mode bits as well as ``os.access``)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISREG(mode) and (not os.access(path, os.W_OK) or not mode & 0o222):
        raise CapsnetError(f"{what or path}: read-only; not replaced")


SPECIAL_FILES = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                 (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def special_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it is a device node, FIFO or socket (links followed), else None."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return next((what for test, what in SPECIAL_FILES if test(mode)), None)


def input_problem(path: str | os.PathLike, kind: str = "file") -> str | None:
    """Why ``path`` cannot be read as an input ``kind`` ("file" or "directory"), or None:
    the one input check. Judged without opening it: opening a FIFO waits for a writer
    forever, and a device node or socket never ends; a NUL byte is no path at all."""
    if "\x00" in os.fsdecode(path):
        return "holds a NUL byte, which no path may hold"
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "not found"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    what = next((what for test, what in SPECIAL_FILES if test(mode)), None)
    if kind == "directory":
        return None if stat.S_ISDIR(mode) else f"is {what or 'a file'}, not a directory"
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    return None if what is None else f"is {what}, not a regular file"


def check_input(
    path: str | os.PathLike,
    error: type[CapsnetError] = CapsnetError,
    missing: str = "",
    kind: str = "file",
) -> None:
    """``error`` naming ``path`` when it cannot be read as an input ``kind``
    (``input_problem``; ``missing``: what makes a file that is not there)."""
    problem = input_problem(path, kind)
    if problem is not None:
        hint = f"; {missing}" if missing and problem == "not found" else ""
        shown = os.fsdecode(path).replace("\x00", "\\0")
        raise error(f"{shown}: {problem}{hint}")


def refuse_special(path: str | os.PathLike) -> None:
    """CapsnetError when ``path`` is a device node, FIFO or socket: never replaced."""
    if (what := special_kind(path)) is not None:
        raise CapsnetError(f"{path}: is {what}, not a regular file; write the output elsewhere")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; return the path."""
    with atomic_open(path) as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; return the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, payload: Any) -> Path:
    """Write ``payload`` as indented JSON plus a final newline to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(payload, indent=2) + "\n")


#: Deepest nesting of lists and objects a JSON file this project reads may have.
MAX_JSON_DEPTH = 32


def read_json(
    path: str | os.PathLike, missing: str = "", error: type[CapsnetError] = CapsnetError
) -> Any:
    """The JSON value in ``path``; ``error`` naming the file when it is missing (with
    ``missing``: what makes it), not valid JSON or nested deeper than MAX_JSON_DEPTH."""
    path = Path(path)
    too_deep = f"{path}: nested deeper than {MAX_JSON_DEPTH} levels"
    check_input(path, error, missing)
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise error(too_deep) from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise error(too_deep)
    return value


def json_depth(value: Any) -> int:
    """How deeply lists and dicts nest in ``value`` (0 for a scalar), found iteratively."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth + 1)
            stack += [(c, depth + 1) for c in (item.values() if isinstance(item, dict) else item)]
    return deepest


def _swap_in(staging: Path, path: Path) -> Path:
    """Put ``staging`` at ``path`` atomically; return where the replaced content now is."""
    if not os.path.lexists(path):
        os.replace(staging, path)
    elif not exchange(staging, path):
        old = temp_name(path, OLD_SUFFIX)
        os.replace(path, old)
        try:
            os.replace(staging, path)
        except BaseException:
            os.replace(old, path)
            raise
        staging = old
    fsync_dir(path.parent)
    return staging


_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP}


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap the two existing paths ``a`` and ``b`` in one step (Linux ``renameat2`` with
    RENAME_EXCHANGE); False where the system or the file system has no such call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), os.fspath(b))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


_held: dict[str, int] = {}  # directories this process holds the lock of -> depth


@contextlib.contextmanager
def locked(directory: str | os.PathLike, timeout: float | None = None) -> Iterator[Path]:
    """Hold the exclusive lock of ``directory`` (``flock`` on ``<directory>/.capsnet.lock``).

    A second process waits, saying so once on stderr, for up to ``timeout`` seconds (default:
    $CAPSNET_LOCK_TIMEOUT, else without limit) and then fails with one line. The lock is
    re-entrant within a process, released when the process dies, and its file is removed
    on release. Yields the lock file's path.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lock_path = directory / LOCK_NAME
    key = os.path.realpath(directory)
    if key in _held:
        _held[key] += 1
        try:
            yield lock_path
        finally:
            _held[key] -= 1
        return
    fd = _acquire(lock_path, _lock_timeout(timeout))
    _held[key] = 1
    try:
        yield lock_path
    finally:
        del _held[key]
        if fd is not None:
            lock_path.unlink(missing_ok=True)  # still held: a waiter on this file retries
            os.close(fd)


def _lock_timeout(timeout: float | None) -> float | None:
    if timeout is not None:
        return timeout
    text = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise CapsnetError(f"${LOCK_TIMEOUT_ENV}={text!r}: expected seconds, a finite number >= 0")
    return value


def _acquire(lock_path: Path, timeout: float | None) -> int | None:
    """An fd holding the flock of ``lock_path`` (None where the system has no flock)."""
    try:
        import fcntl
    except ImportError:
        return None
    deadline = None if timeout is None else time.monotonic() + timeout
    told = False
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _holder(lock_path)
            if deadline is not None and time.monotonic() >= deadline:
                raise CapsnetError(
                    f"{lock_path}: another capsnet command{holder} is still writing to "
                    f"{lock_path.parent} after {timeout:g} s; wait for it to finish, then rerun"
                ) from None
            if not told:
                print(f"waiting for {lock_path}: another capsnet command{holder} is writing to "
                      f"{lock_path.parent}", file=sys.stderr, flush=True)  # fmt: skip
                told = True
            time.sleep(0.2)
            continue
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # the holder removed the file as it released it: lock the new one


def _holder(lock_path: Path) -> str:
    try:
        pid = lock_path.read_text().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def read_disabled(path: str | os.PathLike) -> str | None:
    """The reason in ``<path>/DISABLED.txt``, or None when ``path`` is not marked disabled."""
    marker = Path(path) / DISABLED_MARKER
    if not marker.is_file():
        return None
    return marker.read_text(encoding="utf-8").strip()


def clear_disabled(path: str | os.PathLike) -> None:
    """Remove ``<path>/DISABLED.txt`` left by an earlier run with the input switched off."""
    (Path(path) / DISABLED_MARKER).unlink(missing_ok=True)


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary (or an ``.old`` copy) of this module's writers."""
    return _TEMP_RE.fullmatch(name) is not None


def run_name(name: str, tag: str, seed: int, first: int) -> str:
    """A run's (and its checkpoint's) name: ``name``, ``name@seed3``, ``name@tag``,
    ``name@tag-seed3``; the seed is named unless it is the ``first`` of the runs."""
    suffix = "-".join(part for part in (tag, f"seed{seed}" if seed != first else "") if part)
    return f"{name}@{suffix}" if suffix else name
