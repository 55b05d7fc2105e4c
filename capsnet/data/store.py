"""Prepared-data files: tensors plus metadata in one ``.pt`` file, written atomically.

A prepared file is ``torch.save({"tensors": {...}, "meta": {...}})``, read back with
``weights_only=True`` (no pickled code). A stage that writes several files builds them in a
temporary directory and swaps it into place only when everything succeeded, so a failing
stage leaves no partial output behind.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import torch

from capsnet.errors import DataError
from capsnet.io import atomic_write_bytes


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
