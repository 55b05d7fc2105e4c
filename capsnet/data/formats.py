"""Readers for the official binary formats (IDX for MNIST)."""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import torch

from capsnet.errors import DataError

IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049


def read_bytes(path: str | os.PathLike) -> bytes:
    """File content, decompressed when the name ends in .gz; a clear error otherwise."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (EOFError, OSError, zlib.error) as exc:
        raise DataError(f"{path}: truncated or corrupt gzip ({exc})") from None


def read_idx(path: str | os.PathLike, expected_magic: int) -> torch.Tensor:
    """Read an IDX file of unsigned bytes (big-endian header) into a uint8 tensor."""
    data = read_bytes(path)
    if len(data) < 8:
        raise DataError(f"{path}: too short for an IDX header ({len(data)} bytes)")
    magic = int.from_bytes(data[0:4], "big")
    if magic != expected_magic:
        raise DataError(f"{path}: IDX magic {magic}, expected {expected_magic}")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    count = 1
    for d in dims:
        count *= d
    if len(data) - header != count:
        raise DataError(
            f"{path}: header says {dims} ({count} bytes) but the file holds "
            f"{len(data) - header} bytes of data"
        )
    flat = torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8)
    return flat.view(*dims)


def read_idx_images(path: str | os.PathLike) -> torch.Tensor:
    """IDX image file -> uint8 (N, H, W)."""
    images = read_idx(path, IDX_IMAGES_MAGIC)
    if images.dim() != 3:
        raise DataError(f"{path}: expected 3 image dimensions, found {images.dim()}")
    return images


def read_idx_labels(path: str | os.PathLike, num_classes: int = 10) -> torch.Tensor:
    """IDX label file -> int64 (N,), every label checked to lie in [0, num_classes)."""
    labels = read_idx(path, IDX_LABELS_MAGIC)
    if labels.dim() != 1:
        raise DataError(f"{path}: expected 1 label dimension, found {labels.dim()}")
    if labels.numel() and int(labels.max()) >= num_classes:
        raise DataError(f"{path}: label {int(labels.max())} out of range 0..{num_classes - 1}")
    return labels.long()


def write_idx(path: str | os.PathLike, tensor: torch.Tensor) -> None:
    """Write a uint8 tensor in IDX format (gzip when the name ends in .gz); for tests and
    mirrors."""
    from capsnet.data.sources import atomic_write_bytes

    tensor = tensor.to(torch.uint8).contiguous()
    magic = {3: IDX_IMAGES_MAGIC, 1: IDX_LABELS_MAGIC}.get(tensor.dim(), 0x0800 + tensor.dim())
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in tensor.shape)
    payload = header + tensor.numpy().tobytes()
    if str(path).endswith(".gz"):
        payload = gzip.compress(payload, compresslevel=6)
    atomic_write_bytes(path, payload)
