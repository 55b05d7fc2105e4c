"""Which params keys a command reads, and whether the params file still holds them.

Inside a DVC stage ($DVC_STAGE set) or with $CAPSNET_PARAMS_TRACE set to a file, every field
read from the loaded ``Params`` (a leaf, or a value that is no section) is recorded with the
value read. ``finish``, called by the CLI when a command has done its work:

- appends one line ``<stage>\\t<dotted key>`` per key read to $CAPSNET_PARAMS_TRACE
  (``<stage>`` is $DVC_STAGE, ``-`` outside DVC); ``pipeline.dvc.deps.unlisted_reads``
  compares what each stage read with the params dvc.yaml lists for it, so a stage that
  reads a key it does not list fails a test (tests/test_dvc_repro.py runs every stage
  traced);
- inside a stage, loads the params file again and fails, naming the key, when it no longer
  holds a value the command read: DVC records params.yaml's values at the stage's end, and
  outputs made from other values must not be recorded under them.

A command that fails still appends its reads at exit. Reads are seen through the
dataclasses' ``__getattribute__``, patched only while tracing, on the instances loaded
(their copies by ``dataclasses.replace`` read every field, which counts: the copy depends
on them).
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capsnet.io.errors import ConfigError

TRACE_ENV = "CAPSNET_PARAMS_TRACE"
STAGE_ENV = "DVC_STAGE"

_paths: dict[int, tuple[int, str]] = {}  # id(traced instance) -> (its load, dotted key)
_kept: list[Any] = []  # the traced instances, alive so their ids stay theirs
_fields: dict[type, frozenset[str]] = {}
_reads: dict[tuple[int, str], Any] = {}  # (load, dotted key) -> the value first read
_loads: list[tuple[Path, Callable[[], Any]]] = []  # each traced file and how to reread it
_written: set[str] = set()


def _traced_getattribute(self, name: str):
    value = object.__getattribute__(self, name)
    found = _paths.get(id(self))
    if found is not None and name in _fields[type(self)] and id(value) not in _paths:
        load, path = found
        key = (load, f"{path}.{name}" if path else name)
        if key not in _reads:
            _reads[key] = copy.deepcopy(value)
    return value


def _register(obj: Any, load: int, path: str) -> None:
    cls = type(obj)
    if cls not in _fields:
        _fields[cls] = frozenset(f.name for f in dataclasses.fields(cls))
        cls.__getattribute__ = _traced_getattribute
    _paths[id(obj)] = (load, path)
    _kept.append(obj)
    for item in dataclasses.fields(cls):
        value = object.__getattribute__(obj, item.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _register(value, load, f"{path}.{item.name}" if path else item.name)


def _trace_file() -> str | None:
    """$CAPSNET_PARAMS_TRACE, checked: ConfigError when it cannot take the reads."""
    trace_file = os.environ.get(TRACE_ENV)
    if not trace_file:
        return None
    if os.path.isdir(trace_file):
        raise ConfigError(f"${TRACE_ENV} names a directory ({trace_file}); name a file")
    try:
        with open(trace_file, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ConfigError(f"${TRACE_ENV} {trace_file}: cannot append: {exc.strerror}") from None
    return trace_file


def trace(params: Any, source: Path | None = None, reread: Callable[[], Any] | None = None):
    """Record the reads of ``params`` (loaded from ``source``; ``reread`` loads it again)
    inside a DVC stage or when $CAPSNET_PARAMS_TRACE names a file; return it."""
    trace_file = _trace_file()
    if trace_file is None and not os.environ.get(STAGE_ENV):
        return params
    _register(params, len(_loads), "")
    _loads.append((Path(source) if source is not None else Path(), reread or (lambda: None)))
    if trace_file is not None and trace_file not in _written:
        _written.add(trace_file)
        atexit.register(_write_at_exit, trace_file)
    return params


def reads() -> set[str]:
    """The dotted keys read so far from traced params."""
    return {key for _, key in _reads}


def _write(trace_file: str) -> None:
    stage = os.environ.get(STAGE_ENV) or "-"
    with open(trace_file, "a", encoding="utf-8") as fh:
        fh.writelines(f"{stage}\t{key}\n" for key in sorted(reads()))


def _write_at_exit(trace_file: str) -> None:
    """The reads of a command that ended without ``finish`` (a failure)."""
    if trace_file not in _written:
        return
    try:
        _write(trace_file)
    except OSError as exc:
        print(f"Error: ${TRACE_ENV} {trace_file}: {exc.strerror}", file=sys.stderr)


def _value(params: Any, key: str) -> Any:
    for part in key.split("."):
        params = object.__getattribute__(params, part)
    return params


def changed_reads() -> list[tuple[Path, str, Any, Any]]:
    """(file, key, value read, value now) of each read its params file no longer holds;
    ConfigError when the file no longer loads."""
    changed = []
    for load, (source, reread) in enumerate(_loads):
        keys = sorted(k for i, k in _reads if i == load)
        if not keys:
            continue
        try:
            now = reread()
        except ConfigError as exc:
            raise ConfigError(f"{source} changed while the command ran: {exc}") from None
        if now is None:
            continue
        for key in keys:
            value = _value(now, key)
            if value != _reads[(load, key)]:
                changed.append((source, key, _reads[(load, key)], value))
    return changed


def finish() -> None:
    """Append the reads to $CAPSNET_PARAMS_TRACE and, inside a DVC stage, fail when the
    params file no longer holds a value the command read (see the module doc)."""
    for trace_file in sorted(_written):
        _written.discard(trace_file)
        try:
            _write(trace_file)
        except OSError as exc:
            raise ConfigError(f"${TRACE_ENV} {trace_file}: {exc.strerror}") from None
    if not os.environ.get(STAGE_ENV):
        return
    changed = changed_reads()
    if changed:
        source, key, old, new = changed[0]
        more = f" (and {len(changed) - 1} more key(s))" if len(changed) > 1 else ""
        raise ConfigError(
            f"{source}: {key} changed from {old!r} to {new!r} while the stage ran{more}; "
            "its outputs come from the old values, so DVC must not record the new ones: "
            "run the stage again"
        )
