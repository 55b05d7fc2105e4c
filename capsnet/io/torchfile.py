"""Reading ``torch.save`` files without trusting them: what a file is, before torch reads it.

``read(path)`` tells apart a file that is no PyTorch file at all (empty, text, random
bytes), one cut short or damaged, a foreign format (a TorchScript archive, a NumPy file, a
plain Python pickle) and one whose pickle names Python objects; only then does it call
``torch.load(weights_only=True)``, so no pickled code runs and torch's own advice to load
with ``weights_only=False`` never reaches the user. Callers turn ``Unreadable`` into their
own one-line error naming the file.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
NUMPY_MAGIC = b"\x93NUMPY"
#: The pickled magic number that opens torch's legacy (non-zip) format: LONG1 of 10 bytes.
LEGACY_MAGIC = b"\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")


class Unreadable(Exception):
    """Why a file cannot be read as a PyTorch file: ``kind`` is one of not-torch,
    truncated, damaged, foreign or unsafe; ``str()`` is a short reason without the path."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind

    def message(self, what: str) -> str:
        """One line for a file that should have been ``what`` (e.g. "a capsnet checkpoint")."""
        return f"not {what}: {self}" if self.kind in ("not-torch", "foreign") else str(self)


def read(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """The object ``torch.save`` wrote to ``path``, loaded with ``weights_only=True``;
    ``Unreadable`` says why not (OSError when the file cannot be opened)."""
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(64)
    if head.startswith(ZIP_MAGIC):
        _check_zip(path)
    elif head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        if LEGACY_MAGIC not in head[:32]:
            raise Unreadable(
                "foreign",
                "a plain Python pickle (not unpickled: a pickle can run code)",
            )
    else:
        raise Unreadable("not-torch", _not_torch(head))
    return _torch_load(path, map_location)


def write(path: str | os.PathLike, payload: Any) -> Path:
    """``torch.save(payload)`` to ``path`` atomically (``capsnet.io.files``). The bytes are built
    in memory first, so a full disk or a file-size limit surfaces as the OSError of the
    write (torch's zip writer would hide it in a RuntimeError)."""
    from capsnet.io.files import atomic_write_bytes

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return atomic_write_bytes(path, buffer.getvalue())


def within_storage(tensor: torch.Tensor) -> bool:
    """Each element backed by its own bytes of the tensor's storage: a loaded tensor cannot
    claim more values than the file holds (an expanded view with stride 0 would)."""
    if tensor.numel() == 0:
        return True
    extent = tensor.storage_offset() + 1
    extent += sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    nbytes = tensor.untyped_storage().nbytes()
    return tensor.numel() <= extent and extent * tensor.element_size() <= nbytes


def _not_torch(head: bytes) -> str:
    """The reason for a file that opens as neither a zip archive nor a pickle."""
    if not head:
        return "an empty file (was its write interrupted?)"
    if head.startswith(NUMPY_MAGIC):
        return "a NumPy .npy array"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a character cut at the end of the head is fine
        text = head[: exc.start].decode("utf-8") if exc.start >= len(head) - 3 else ""
    if text and all(ch.isprintable() or ch in "\t\r\n" for ch in text):
        return "a text file"
    return "unknown bytes, neither a zip archive nor a pickle as torch.save writes"


#: How many times its size on disk a checkpoint's members may declare, uncompressed.
#: torch.save stores members uncompressed, so a real checkpoint declares at most its own size.
MAX_EXPANSION = 2
#: Declared bytes any archive may hold beyond MAX_EXPANSION times its size.
EXPANSION_SLACK = 1 << 20


def _check_sizes(path: Path, archive: zipfile.ZipFile) -> None:
    """Refuse an archive whose members declare more bytes than torch.save could have
    written into a file of this size (a zip bomb), before any member is inflated."""
    on_disk = path.stat().st_size
    declared = sum(info.file_size for info in archive.infolist())
    if declared > MAX_EXPANSION * on_disk + EXPANSION_SLACK:
        raise Unreadable(
            "damaged",
            f"refused: its members would inflate to {declared} bytes from {on_disk} on disk "
            "(torch.save stores them uncompressed)",
        )


def _check_zip(path: Path) -> None:
    """A complete zip archive laid out as torch.save writes it, every member's CRC intact."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            _check_sizes(path, archive)
            bad = archive.testzip()
    except zipfile.BadZipFile:
        raise Unreadable(
            "truncated",
            "truncated: the zip archive ends before its directory (an interrupted copy or write?)",
        ) from None
    except (EOFError, OSError, ValueError, NotImplementedError, RuntimeError) as exc:
        raise Unreadable("damaged", f"damaged zip archive ({type(exc).__name__})") from None
    if bad is not None:
        raise Unreadable("damaged", f"damaged: member {bad} fails its CRC check")
    if any(name.endswith("/constants.pkl") or "/code/" in name for name in names):
        raise Unreadable(
            "foreign",
            "a TorchScript archive (torch.jit.save); scripted programs are not loaded",
        )
    if names and all(name.endswith(".npy") for name in names):
        raise Unreadable("foreign", "a NumPy .npz archive")
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) != 1 or not any(name.endswith("/data.pkl") for name in names):
        raise Unreadable("foreign", "a zip archive that torch.save did not write (no data.pkl)")


def _torch_load(path: Path, map_location: Any) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's hints would reach the user's terminal
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if found or "Unsupported global" in str(exc):
            what = found.group(1) if found else "a Python object"
            raise Unreadable(
                "unsafe",
                f"refused: it carries Python objects ({what}), which are not loaded on purpose "
                "(unpickling them could run code)",
            ) from None
        raise Unreadable(
            "unsafe", "refused: its pickle uses instructions that weights-only loading refuses"
        ) from None
    except EOFError:
        raise Unreadable("truncated", "truncated: the file ends early") from None
    except (RuntimeError, ValueError, KeyError, IndexError, TypeError, OSError) as exc:
        if "EOF" in str(exc):
            raise Unreadable("truncated", "truncated: the file ends early") from None
        raise Unreadable("damaged", f"damaged PyTorch file ({type(exc).__name__})") from None
