"""Shared fixtures: offline environment, the MNIST mirror, a prepared data root."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

for _key, _value in {
    "DVC_NO_ANALYTICS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "NO_ALBUMENTATIONS_UPDATE": "1",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
}.items():
    os.environ.setdefault(_key, _value)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_MIRROR = REPO_ROOT.parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def mnist_mirror() -> Path:
    """The faithful MNIST mirror beside the repository (skips when absent)."""
    mirror = Path(os.environ.get("CAPSNET_MIRROR") or SHARED_MIRROR)
    if not (mirror / "mnist" / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"no MNIST mirror at {mirror}")
    return mirror


@pytest.fixture(scope="session")
def mnist_root(tmp_path_factory, mnist_mirror) -> Path:
    """A data root holding the verified raw MNIST files (copied from the mirror once)."""
    root = tmp_path_factory.mktemp("data")
    raw = root / "raw" / "mnist"
    raw.mkdir(parents=True)
    for gz in (mnist_mirror / "mnist").glob("*.gz"):
        shutil.copy(gz, raw / gz.name)
    return root
