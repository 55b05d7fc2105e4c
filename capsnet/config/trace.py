"""Which params keys a command reads: with $CAPSNET_PARAMS_TRACE set to a file, every field
read from the loaded ``Params`` (a leaf, or a value that is no section) is recorded, and at
exit one line ``<stage>\\t<dotted key>`` per key is appended to that file; ``<stage>`` is
$DVC_STAGE (``-`` outside DVC). ``pipeline.dvc_deps.unlisted_reads`` compares what each
stage read with the params dvc.yaml lists for it, so a stage that reads a key it does not
list fails a test (tests/test_dvc_repro.py runs every stage traced).

Reads are seen through the dataclasses' ``__getattribute__``, patched only while tracing,
on the instances loaded (their copies by ``dataclasses.replace`` read every field, which
counts: the copy depends on them).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
from typing import Any

TRACE_ENV = "CAPSNET_PARAMS_TRACE"
STAGE_ENV = "DVC_STAGE"

_paths: dict[int, str] = {}  # id(traced instance) -> its dotted key ("" for Params)
_kept: list[Any] = []  # the traced instances, alive so their ids stay theirs
_fields: dict[type, frozenset[str]] = {}
_reads: set[str] = set()
_files: set[str] = set()


def _traced_getattribute(self, name: str):
    value = object.__getattribute__(self, name)
    path = _paths.get(id(self))
    if path is not None and name in _fields[type(self)] and id(value) not in _paths:
        _reads.add(f"{path}.{name}" if path else name)
    return value


def _register(obj: Any, path: str) -> None:
    cls = type(obj)
    if cls not in _fields:
        _fields[cls] = frozenset(f.name for f in dataclasses.fields(cls))
        cls.__getattribute__ = _traced_getattribute
    _paths[id(obj)] = path
    _kept.append(obj)
    for item in dataclasses.fields(cls):
        value = object.__getattribute__(obj, item.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _register(value, f"{path}.{item.name}" if path else item.name)


def _write(trace_file: str) -> None:
    stage = os.environ.get(STAGE_ENV) or "-"
    with open(trace_file, "a", encoding="utf-8") as fh:
        fh.writelines(f"{stage}\t{key}\n" for key in sorted(_reads))


def trace(params: Any) -> Any:
    """Record the reads of ``params`` when $CAPSNET_PARAMS_TRACE names a file; return it."""
    trace_file = os.environ.get(TRACE_ENV)
    if not trace_file:
        return params
    _register(params, "")
    if trace_file not in _files:
        _files.add(trace_file)
        atexit.register(_write, trace_file)
    return params


def reads() -> set[str]:
    """The dotted keys read so far from traced params."""
    return set(_reads)
