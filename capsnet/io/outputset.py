"""Outputs published as one unit: every file and directory of a stage written to
temporaries first, then renamed into place together (``OutputSet``), targets a rename
would silently replace or could not replace refused (``refuse_target``), and a directory
replaced whole only when it holds nothing but what its writer makes (``check_owned``).
``atomic_directory`` (one directory) and ``write_disabled`` (the outputs of a stage whose
input is switched off) are OutputSets. Built on capsnet/io/files.py."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from capsnet.io import files as io  # through the module, so its helpers are one implementation
from capsnet.io.errors import CapsnetError


def refuse_target(path: str | os.PathLike, kind: str = "file") -> None:
    """CapsnetError naming ``path`` when a ``kind`` ("file" or "directory") output cannot
    take its place there: a directory where a file goes, a device node, FIFO or socket,
    a read-only file, or a parent that is not a directory."""
    path = Path(path)
    io.refuse_special(path)
    if kind == "file" and path.is_dir() and not path.is_symlink():
        raise CapsnetError(f"{path}: is a directory, not a file; remove it or write elsewhere")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise CapsnetError(f"{path}: {parent} is not a directory")
            break
    if kind == "file":
        io.refuse_read_only(path)


def foreign_files(directory: str | os.PathLike, own: Iterable[str]) -> list[str]:
    """Sorted paths under ``directory`` (relative, "/"-separated) that none of the ``own``
    patterns matches (``fnmatch``; a directory matched is owned whole), besides
    DISABLED.txt, the lock and temporaries: what replacing the directory whole would
    destroy that its writer did not make. [] when the directory is missing."""
    root, patterns = Path(directory), (*own, io.DISABLED_MARKER)
    try:
        if not root.is_dir() or root.is_symlink():
            return []
        pending, found = [root], []
        while pending:
            folder = pending.pop()
            for entry in folder.iterdir():
                relative = entry.relative_to(root).as_posix()
                if entry.name == io.LOCK_NAME or io.is_temporary(entry.name):
                    continue
                if any(fnmatch.fnmatchcase(relative, p) for p in patterns):
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    pending.append(entry)
                else:
                    found.append(relative)
    except OSError as exc:
        raise CapsnetError(f"{directory}: cannot be listed ({exc.strerror or exc})") from None
    return sorted(found)


def check_owned(directory: str | os.PathLike, own: Iterable[str]) -> None:
    """The one output-directory rule: a directory output replaced whole must be missing or
    hold only what its writer makes (``own``, see ``foreign_files``); otherwise a
    CapsnetError naming it and the first foreign files (``capsnet.cli.options.check_output``
    names the option or params key too, before any work)."""
    others = foreign_files(directory, own)
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise CapsnetError(
            f"{directory} holds files this command does not write ({shown}); it is "
            "replaced whole, so move them or name a new or empty directory"
        )


class OutputSet:
    """Outputs published as one unit. ``directory(path)`` gives a staging folder to fill,
    ``file(path, data)`` writes a temporary at once; nothing at the targets changes until
    ``commit``, which swaps every directory in, then renames every file in the order added
    (a manifest added last lands last). Every target is checked (``refuse_target``) when
    added and again before the first is replaced, so one that cannot be replaced changes
    none. Leaving the ``with`` block by an error removes every temporary and leaves every
    target as it was."""

    def __init__(self) -> None:
        self._dirs: list[tuple[Path, Path]] = []
        self._owns: dict[Path, tuple[str, ...]] = {}
        self._files: list[tuple[Path, Path]] = []

    def directory(self, path: str | os.PathLike, own: Iterable[str]) -> Path:
        """A staging folder that replaces ``path`` at ``commit``; ``own``: patterns of what
        its writer makes there (``check_owned``), checked now and again at ``commit``."""
        path = Path(path)
        refuse_target(path, "directory")
        self._owns[path] = tuple(own)
        check_owned(path, self._owns[path])
        path.parent.mkdir(parents=True, exist_ok=True)
        io.remove_stale(path)
        staging = io.new_temp_dir(path)
        self._dirs.append((path, staging))
        return staging

    def file(self, path: str | os.PathLike, data: str | bytes) -> Path:
        path = Path(path)
        refuse_target(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        io.remove_stale(path)
        fd, tmp = io.new_temp_file(path)
        self._files.append((path, tmp))
        with io.naming_target(path), os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        return path

    def commit(self) -> list[Path]:
        """Swap the directories in and rename the files; the targets, in that order. A
        rename that fails leaves the targets not reached as they were and no temporary."""
        done = []
        try:
            for path, _ in self._dirs:
                refuse_target(path, "directory")
                check_owned(path, self._owns[path])
            for path, _ in self._files:
                refuse_target(path)
            while self._dirs:
                path, staging = self._dirs[0]
                with io.locked(path.parent):
                    io.remove_stale(path)
                    replaced = io._swap_in(staging, path)
                self._dirs.pop(0)
                io._remove(replaced)
                done.append(path)
            while self._files:
                path, tmp = self._files[0]
                os.replace(tmp, path)
                self._files.pop(0)
                io.fsync_dir(path.parent)
                done.append(path)
        except BaseException:
            self.discard()
            raise
        return done

    def discard(self) -> None:
        for _, temporary in [*self._dirs, *self._files]:
            io._remove(temporary)
        self._dirs, self._files = [], []

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, own: Iterable[str]) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces ``path`` when the block succeeds
    (an ``OutputSet`` of one directory; ``own``: what its writer makes there, see
    ``check_owned``); on any error ``path`` is left as it was."""
    with OutputSet() as outputs:
        yield outputs.directory(path, own)


def write_disabled(
    directory: str | os.PathLike,
    reason: str,
    json_files: Iterable[str | os.PathLike] = (),
    files: Mapping[str | os.PathLike, str] | None = None,
    replace: bool = True,
    own: Iterable[str] = (),
) -> Path:
    """The one DISABLED writer: publish, as one unit, ``directory`` holding
    ``DISABLED.txt`` with ``reason``, each of ``json_files`` holding ``{"disabled":
    reason}`` and ``files`` ({path: text}); a path inside ``directory`` goes into it.
    ``replace``: the directory is swapped in holding only these (``own``: what the
    stage makes there otherwise, ``check_owned``); else they are added to it in place. DVC
    needs every stage output to exist, even for data switched off."""
    directory = Path(directory)
    texts = {directory / io.DISABLED_MARKER: reason.rstrip() + "\n"}
    texts |= {Path(p): json.dumps({"disabled": reason}, indent=2) + "\n" for p in json_files}
    texts |= {Path(p): text for p, text in (files or {}).items()}
    with OutputSet() as outputs:
        staging = outputs.directory(directory, own) if replace else None
        for path, text in texts.items():
            relative = inside(path, directory)
            if staging is not None and relative is not None:
                io.atomic_write_text(staging / relative, text)
            else:
                outputs.file(path, text)
    return directory


def inside(path: str | os.PathLike, directory: str | os.PathLike) -> Path | None:
    """``path`` relative to ``directory`` when it lies inside, else None."""
    path, directory = Path(path).resolve(), Path(directory).resolve()
    return path.relative_to(directory) if path.is_relative_to(directory) else None
