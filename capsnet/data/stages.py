"""The data stages: what ``capsnet data download|prepare NAME`` does, given the params.

Each stage reads its params section, calls one library function and writes one directory:
``<root>/raw/<dataset>`` (download) or ``<root>/prepared/<name>`` (prepare). A dataset
switched off in params gets a directory holding only DISABLED.txt, because DVC needs every
declared output to exist. A stage holds the lock of its data root (``capsnet.io.locked``), so
two commands writing into one root run one after the other, and first removes what killed
runs left in the directory it writes to.
"""

from __future__ import annotations

from pathlib import Path

from capsnet.config import Params
from capsnet.errors import DataError
from capsnet.io import clear_disabled, locked, read_disabled, remove_stale_in, write_disabled

DOWNLOADS = ("mnist", "affnist", "smallnorb")
PREPARES = ("mnist", "affnist", "affnist-synth", "smallnorb", "multimnist")


def _root(params: Params, root: str | Path | None) -> Path:
    from capsnet.data.datasets import DEFAULT_ROOT

    return Path(root) if root is not None else DEFAULT_ROOT


def download(name: str, params: Params, root=None, mirror=None, progress=False) -> Path:
    """Fetch and verify the raw files of ``name`` into ``<root>/raw/<name>``."""
    if name not in DOWNLOADS:
        raise DataError(
            f"unknown dataset {name!r} to download; choose one of {', '.join(DOWNLOADS)}"
        )
    root = _root(params, root)
    out = root / "raw" / name
    with locked(root):
        remove_stale_in(out.parent)
        remove_stale_in(out)
        return _download(name, params.data, out, mirror, progress)


def _download(name: str, data, out: Path, mirror, progress: bool) -> Path:
    from capsnet.data import affnist, mnist, smallnorb

    if not getattr(data, name).enabled:
        return write_disabled(out, f"data.{name}.enabled is false in params.yaml")
    if name == "affnist" and data.affnist.source == "synth":
        return write_disabled(out, "data.affnist.source is synth: the real files are not used")
    clear_disabled(out)
    if name == "mnist":
        mnist.download(out, mirror, progress)
    elif name == "smallnorb":
        smallnorb.download(out, mirror, progress)
    else:
        try:
            affnist.download(out, mirror, data.affnist.include_training, progress)
        except DataError as exc:
            if data.affnist.source != "auto":
                raise
            return write_disabled(
                out,
                f"data.affnist.source is auto and the real files are "
                f"unreachable, so evaluation uses affnist-synth: {exc}",
            )
    return out


def prepare(name: str, params: Params, root=None) -> Path:
    """Build ``<root>/prepared/<name>`` from the raw files or the prepared MNIST."""
    if name not in PREPARES:
        raise DataError(f"unknown dataset {name!r} to prepare; choose one of {', '.join(PREPARES)}")
    root = _root(params, root)
    with locked(root):
        remove_stale_in(root / "prepared")
        return _prepare(name, params.data, root)


def _prepare(name: str, data, root: Path) -> Path:
    from capsnet.data import affnist, mnist, multimnist, smallnorb

    out = root / "prepared" / name
    section = "affnist" if name == "affnist-synth" else name
    if not getattr(data, section).enabled:
        return write_disabled(out, f"data.{section}.enabled is false in params.yaml")
    if name == "mnist":
        return mnist.prepare(root / "raw" / "mnist", out)
    if name == "multimnist":
        m = data.multimnist
        return multimnist.build(
            root,
            out,
            seed=m.seed,
            shift=m.shift,
            pad=m.pad,
            merge=m.merge,
            train_pairs_per_digit=m.train_pairs_per_digit,
            test_pairs_per_digit=m.test_pairs_per_digit,
            redraw_each_epoch=m.redraw_each_epoch,
        )
    if name == "affnist-synth":
        s = data.affnist.synth
        return affnist.build_synth(
            root,
            out,
            seed=s.seed,
            rotation_degrees=s.rotation_degrees,
            shear=s.shear,
            scale=s.scale,
            limit=s.limit,
        )
    raw = root / "raw" / name
    reason = read_disabled(raw)
    if reason is not None:
        return write_disabled(out, reason)
    if name == "affnist":
        return affnist.prepare(raw, out)
    return smallnorb.prepare(raw, out, data.smallnorb.size)
