"""Readers for the official binary formats (IDX for MNIST)."""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path

import torch

from capsnet.io.errors import DataError
from capsnet.io.files import check_input

IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049


def read_bytes(path: str | os.PathLike) -> bytes:
    """File content, decompressed when the name ends in .gz; a clear error otherwise."""
    path = Path(path)
    check_input(path, DataError)
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
    from capsnet.io.files import atomic_write_bytes

    tensor = tensor.to(torch.uint8).contiguous()
    magic = {3: IDX_IMAGES_MAGIC, 1: IDX_LABELS_MAGIC}.get(tensor.dim(), 0x0800 + tensor.dim())
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in tensor.shape)
    payload = header + tensor.numpy().tobytes()
    if str(path).endswith(".gz"):
        payload = gzip.compress(payload, compresslevel=6, mtime=0)
    atomic_write_bytes(path, payload)


# --- smallNORB binary (data/smallnorb.md) --------------------------------------------------

NORB_DTYPES = {
    0x1E3D4C55: "uint8",
    0x1E3D4C54: "int32",
    0x1E3D4C51: "float32",
    0x1E3D4C53: "float64",
    0x1E3D4C56: "int16",
}
NORB_MAGIC = {dtype: magic for magic, dtype in NORB_DTYPES.items()}


#: Each smallNORB part's element type and dimensions: images, category labels, and the
#: instance/elevation/azimuth/lighting rows.
NORB_PARTS = {"dat": ("uint8", 4), "cat": ("int32", 1), "info": ("int32", 2)}
#: The largest smallNORB matrix this reader accepts (the official training images hold
#: 447,897,600 bytes).
NORB_MAX_BYTES = 1 << 31


def norb_part(path: str | os.PathLike) -> str | None:
    """The part (``dat``, ``cat`` or ``info``) an official smallNORB file name says it holds."""
    name = Path(path).name.removesuffix(".gz").removesuffix(".mat")
    stem, dash, part = name.rpartition("-")
    return part if stem and dash and part in NORB_PARTS else None


def read_norb(path: str | os.PathLike, part: str | None = None):
    """A smallNORB binary matrix (optionally .gz) -> numpy array of its dtype and dims.

    Header: little-endian int32 magic, ndim, then max(3, ndim) dims (the extra ones ignored).
    ``part`` (default: from the official file name) fixes the dtype and the number of dims
    the header must declare, so a labels file holding floats is refused, not reinterpreted.
    """
    import numpy as np

    part = part or norb_part(path)
    data = read_bytes(path)
    if len(data) < 8:
        raise DataError(f"{path}: too short for a smallNORB header ({len(data)} bytes)")
    magic, ndim = (int(v) for v in np.frombuffer(data, "<i4", count=2))
    if magic not in NORB_DTYPES:
        raise DataError(f"{path}: smallNORB magic {magic:#x} unknown")
    if part is not None and NORB_DTYPES[magic] != NORB_PARTS[part][0]:
        raise DataError(
            f"{path}: smallNORB magic {magic:#x} says {NORB_DTYPES[magic]}, but a {part} file "
            f"holds {NORB_PARTS[part][0]}"
        )
    if not 0 < ndim <= 8:
        raise DataError(f"{path}: smallNORB header ndim {ndim} out of range 1..8")
    if part is not None and ndim != NORB_PARTS[part][1]:
        raise DataError(
            f"{path}: smallNORB header declares {ndim} dims, a {part} file has "
            f"{NORB_PARTS[part][1]}"
        )
    header = 8 + 4 * max(3, ndim)
    if len(data) < header:
        raise DataError(f"{path}: truncated smallNORB header")
    dims = [int(d) for d in np.frombuffer(data, "<i4", count=ndim, offset=8)]
    dtype = np.dtype(NORB_DTYPES[magic]).newbyteorder("<")
    if min(dims) < 0:
        raise DataError(f"{path}: header dims {dims} include a negative size")
    expected = math.prod(dims) * dtype.itemsize  # Python integers: no wrap-around
    if expected > NORB_MAX_BYTES:
        raise DataError(
            f"{path}: header dims {dims} ({NORB_DTYPES[magic]}) claim {expected} bytes, more "
            f"than any smallNORB file ({NORB_MAX_BYTES})"
        )
    if len(data) - header != expected:
        raise DataError(
            f"{path}: header dims {dims} ({NORB_DTYPES[magic]}) need {expected} bytes but the "
            f"file holds {len(data) - header}"
        )
    return np.frombuffer(data, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def write_norb(path: str | os.PathLike, array) -> None:
    """Write ``array`` in the smallNORB binary format (gzip when the name ends in .gz)."""
    import numpy as np

    from capsnet.io.files import atomic_write_bytes

    array = np.ascontiguousarray(array)
    magic = NORB_MAGIC[array.dtype.name]
    dims = list(array.shape) + [1] * max(0, 3 - array.ndim)
    header = np.array([magic, array.ndim, *dims], dtype="<i4").tobytes()
    payload = header + array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    if str(path).endswith(".gz"):
        payload = gzip.compress(payload, compresslevel=1, mtime=0)
    atomic_write_bytes(path, payload)


# --- affNIST MATLAB files (data/affnist.md) -----------------------------------------------

AFFNIST_FIELDS = ("image", "label_int", "label_one_of_n", "human_readable_transform")
AFFNIST_SIDE = 40


def read_affnist_mat(path: str | os.PathLike) -> tuple[torch.Tensor, torch.Tensor]:
    """An affNIST .mat file -> images uint8 (N, 40, 40) and labels int64 (N,).

    The struct ``affNISTdata`` holds ``image`` (1600, N), one row-major image per column.
    """
    import numpy as np
    import scipy.io

    path = Path(path)
    check_input(path, DataError)
    try:
        mat = scipy.io.loadmat(path, struct_as_record=False, squeeze_me=True)
    except (ValueError, TypeError, OSError, EOFError, NotImplementedError) as exc:
        raise DataError(f"{path}: not a readable MATLAB file ({exc})") from None
    if "affNISTdata" not in mat:
        raise DataError(
            f"{path}: no affNISTdata struct (found {sorted(k for k in mat if k[:2] != '__')})"
        )
    struct = mat["affNISTdata"]
    names = set(getattr(struct, "_fieldnames", []) or [])
    missing = [f for f in ("image", "label_int") if f not in names]
    if missing:
        raise DataError(f"{path}: affNISTdata lacks field(s) {', '.join(missing)}")
    image = np.asarray(struct.image)
    labels = np.atleast_1d(np.asarray(struct.label_int))
    if image.ndim == 1:  # squeeze_me drops N when N == 1
        image = image[:, None]
    if image.ndim != 2 or image.shape[0] != AFFNIST_SIDE * AFFNIST_SIDE:
        raise DataError(f"{path}: affNISTdata.image has shape {image.shape}, expected (1600, N)")
    if labels.shape[0] != image.shape[1]:
        raise DataError(f"{path}: {image.shape[1]} images but {labels.shape[0]} labels")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{path}: label {int(labels.max())} out of range 0..9")
    images = np.ascontiguousarray(image.T).astype(np.uint8).reshape(-1, AFFNIST_SIDE, AFFNIST_SIDE)
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))  # (N,40,40), (N,)


def write_affnist_mat(
    path: str | os.PathLike, images: torch.Tensor, labels: torch.Tensor, transforms=None
) -> None:
    """Write images uint8 (N, 40, 40) and labels (N,) as an official-layout affNIST .mat."""
    import io

    import numpy as np
    import scipy.io

    from capsnet.io.files import atomic_write_bytes

    images = images.to(torch.uint8).numpy().reshape(images.shape[0], -1)  # (N, 1600)
    labels = labels.numpy().astype(np.uint8)
    one_hot = np.zeros((10, labels.shape[0]), np.uint8)
    one_hot[labels, np.arange(labels.shape[0])] = 1
    if transforms is None:
        transforms = np.zeros((7, labels.shape[0]))
    struct = {
        "image": np.ascontiguousarray(images.T),  # (1600, N)
        "label_int": labels[None, :],  # (1, N)
        "label_one_of_n": one_hot,  # (10, N)
        "human_readable_transform": transforms,
    }
    buffer = io.BytesIO()
    scipy.io.savemat(buffer, {"affNISTdata": struct}, do_compression=True)
    atomic_write_bytes(path, buffer.getvalue())
