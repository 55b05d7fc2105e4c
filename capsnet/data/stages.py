"""The data stages: what ``capsnet data download|prepare NAME`` does, given the params.

Each stage reads its dataset's declaration (``capsnet.config.dataset_specs``) and params section,
calls the declared function and writes one directory: ``<root>/raw/<dataset>`` (download)
or ``<root>/prepared/<name>`` (prepare). A dataset switched off in params gets a directory
holding only DISABLED.txt, because DVC needs every declared output to exist; so does a
prepared set whose raw directory says DISABLED. A stage holds the lock of its data root
(``capsnet.io.files.locked``), so two commands writing into one root run one after the other,
and first removes what killed runs left in the directory it writes to.
"""

from __future__ import annotations

from pathlib import Path

from capsnet.config import Params
from capsnet.config.data import DATA_ROOT
from capsnet.config.dataset_specs import DOWNLOADS, PREPARED_FILES, PREPARES, RAW_FILES, get
from capsnet.data.registry import resolve
from capsnet.io.files import clear_disabled, locked, read_disabled, remove_stale_in
from capsnet.io.outputset import write_disabled

__all__ = ["DOWNLOADS", "PREPARES", "download", "prepare", "why_off"]


def _root(root: str | Path | None) -> Path:
    return Path(root if root is not None else DATA_ROOT)


def download(name: str, params: Params, root=None, mirror=None, progress=False) -> Path:
    """Fetch and verify the raw files of ``name`` into ``<root>/raw/<name>``."""
    spec = get(name, DOWNLOADS, "dataset to download")
    root = _root(root)
    out = root / "raw" / name
    with locked(root):
        remove_stale_in(out.parent)
        remove_stale_in(out)
        section = spec.settings(params.data)
        if not section.enabled:
            return write_disabled(out, _switched_off(spec), own=RAW_FILES)
        clear_disabled(out)
        stand_in = resolve(spec.stand_in) if spec.stand_in else None
        return resolve(spec.download)(out, section, mirror, progress, stand_in)


def prepare(name: str, params: Params, root=None) -> Path:
    """Build ``<root>/prepared/<name>`` from the raw files or the prepared MNIST."""
    spec = get(name, PREPARES, "dataset to prepare")
    root = _root(root)
    with locked(root):
        remove_stale_in(root / "prepared")
        out = root / "prepared" / name
        section = spec.settings(params.data)
        if not section.enabled:
            return write_disabled(out, _switched_off(spec), own=PREPARED_FILES)
        if spec.download:
            reason = read_disabled(root / "raw" / name)
            if reason is not None:
                return write_disabled(out, reason, own=PREPARED_FILES)
        return resolve(spec.prepare)(root, out, section)


def _switched_off(spec) -> str:
    return f"data.{spec.section}.enabled is false in params.yaml ({spec.name} is switched off)"


def why_off(params: Params, name: str, root=None) -> str | None:
    """Why dataset ``name`` cannot be used: its params section switched off, or its
    prepared folder under ``root`` holding DISABLED.txt; None when it can."""
    spec = get(name)
    if not spec.settings(params.data).enabled:
        return _switched_off(spec)
    prepared = _root(root) / "prepared" / name
    reason = read_disabled(prepared)
    if reason is None:
        return None
    return f"{prepared} is switched off ({reason}); run `dvc repro prepare_{name}`"
