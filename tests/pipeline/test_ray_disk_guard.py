"""The tests' Ray clusters spill a full object store whatever the shared disk holds.

Ray refuses a put that needs spilling once the disk under its temp folder is more than
``local_fs_capacity_threshold`` used (0.95 by default), counting every other user of the
disk. tests/conftest.py and .ci/run set ``RAY_local_fs_capacity_threshold=1`` (off)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

#: Four 40 MB puts into an 80 MiB store: the last ones spill to disk.
SPILL = """
import sys
import numpy as np
import ray

ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
         object_store_memory=80 * 2**20)
try:
    refs = [ray.put(np.zeros(5 * 10**6)) for _ in range(4)]
    print("spilled", len(refs))
except ray.exceptions.OutOfDiskError:
    print("refused")
"""


def _spill(threshold: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_local_fs_capacity_threshold"] = threshold
    result = subprocess.run(
        [sys.executable, "-c", SPILL], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_the_suites_ray_spills_however_full_the_disk_is():
    assert os.environ["RAY_local_fs_capacity_threshold"] == "1"
    assert (
        "RAY_local_fs_capacity_threshold=1"
        in (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    )
    # the setting reaches the raylet: at 0 any disk counts as full and the spill is refused
    # (at 1 the suite's clusters spill: CI failed without it, OutOfDiskError at 95%)
    assert _spill("0") == "refused"
