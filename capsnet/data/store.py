"""Prepared-data files: tensors plus metadata in one ``.pt`` file, written atomically.

A prepared file is ``torch.save({"tensors": {...}, "meta": {...}})``, read back with
``weights_only=True`` (no pickled code). A stage that writes several files builds them in a
temporary directory and swaps it into place only when everything succeeded, so a failing
stage leaves no partial output behind.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from capsnet.data.sources import _fsync_dir, atomic_write_bytes
from capsnet.errors import DataError

DISABLED_MARKER = "DISABLED.txt"


def save_prepared(path: str | os.PathLike, tensors: dict[str, torch.Tensor], **meta) -> Path:
    """Write ``tensors`` and JSON-like ``meta`` to ``path`` atomically."""
    buffer = io.BytesIO()
    torch.save({"tensors": {k: v.contiguous() for k, v in tensors.items()}, "meta": meta}, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)


def load_prepared(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, meta) of a prepared file; a DataError naming the file when it is unusable."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: prepared file not found (run `capsnet data prepare`)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        return payload["tensors"], payload.get("meta", {})
    except Exception as exc:  # torch raises many types for a damaged file
        raise DataError(f"{path}: not a readable prepared file ({type(exc).__name__})") from None


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces ``path`` when the block succeeds.

    On any error the temporary directory is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield staging
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(staging, path)
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_disabled(path: str | os.PathLike, reason: str) -> Path:
    """Make ``path`` a directory holding only a marker saying why the stage produced no data
    (DVC needs every stage output to exist, even for a dataset switched off in params)."""
    with atomic_directory(path) as tmp:
        (tmp / DISABLED_MARKER).write_text(reason.rstrip() + "\n")
    return Path(path)


def is_disabled(path: str | os.PathLike) -> bool:
    return (Path(path) / DISABLED_MARKER).is_file()
