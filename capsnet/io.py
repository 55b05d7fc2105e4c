"""Atomic files and directories, and the DISABLED marker.

A file is written to a temporary sibling ``.<name>.<random>.tmp``, flushed, fsynced and
renamed over the target, so a reader sees the old bytes or the new ones, never a part. The
temporary file is created with mode ``0o666`` and the process umask applies, as for any new
file (``tempfile.mkstemp`` would give ``0o600``). A directory is built in a temporary sibling
and renamed into place only when everything in it was written.

A stage whose input is switched off in params still has to produce its DVC outputs; its
output directory then holds ``DISABLED.txt`` saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

DISABLED_MARKER = "DISABLED.txt"
TEMP_SUFFIX = ".tmp"


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


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def _new_temp_file(path: Path) -> tuple[int, Path]:
    """(fd, path) of a new empty sibling of ``path``, mode 0o666 less the umask."""
    while True:
        tmp = _temp_name(path)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def _new_temp_dir(path: Path) -> Path:
    """A new empty sibling directory of ``path``, mode 0o777 less the umask."""
    while True:
        tmp = _temp_name(path)
        try:
            os.mkdir(tmp, 0o777)
            return tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file handle whose content replaces ``path`` when the block succeeds.

    On any error the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temp_file(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


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


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces ``path`` when the block succeeds.

    An existing ``path`` is renamed aside, the new one renamed in, and the old one removed;
    if the second rename fails the old one is put back. On any error in the block the
    temporary directory is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = _new_temp_dir(path)
    try:
        yield staging
        old = None
        if path.exists() or path.is_symlink():
            old = _temp_name(path)
            os.replace(path, old)
        try:
            os.replace(staging, path)
        except BaseException:
            if old is not None:
                os.replace(old, path)
            raise
        fsync_dir(path.parent)
        if old is not None:
            _remove(old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_marker(directory: str | os.PathLike, reason: str) -> Path:
    """Write ``<directory>/DISABLED.txt`` holding ``reason`` (atomically); return its path."""
    return atomic_write_text(Path(directory) / DISABLED_MARKER, reason.rstrip() + "\n")


def write_disabled(path: str | os.PathLike, reason: str) -> Path:
    """Make ``path`` a directory holding only DISABLED.txt with ``reason``, swapped in
    atomically (DVC needs every stage output to exist, even for data switched off)."""
    with atomic_directory(path) as tmp:
        write_marker(tmp, reason)
    return Path(path)


def read_disabled(path: str | os.PathLike) -> str | None:
    """The reason in ``<path>/DISABLED.txt``, or None when ``path`` is not marked disabled."""
    marker = Path(path) / DISABLED_MARKER
    if not marker.is_file():
        return None
    return marker.read_text(encoding="utf-8").strip()


def is_disabled(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory marked with DISABLED.txt."""
    return (Path(path) / DISABLED_MARKER).is_file()


def clear_disabled(path: str | os.PathLike) -> None:
    """Remove ``<path>/DISABLED.txt`` left by an earlier run with the input switched off."""
    (Path(path) / DISABLED_MARKER).unlink(missing_ok=True)
