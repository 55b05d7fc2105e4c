"""The order CI's pytest-xdist workers take the test files in (tests/conftest.py)."""

from __future__ import annotations

#: The slowest test files, slowest first (CI's `--durations`). `.ci/run` hands whole files to
#: its pytest-xdist workers in collection order (`--no-loadscope-reorder`; xdist's default
#: order puts files with few tests, the slow end-to-end ones, last), so the long files start
#: first and the short ones fill in at the end. tests/test_dvc_experiments.py leads: its
#: worker reproduces the shrunk DVC project (``reproduced_project``) while the other worker
#: runs slow files that do not need it; the files that use the project come later
#: (tests/pipeline/test_cluster_path.py seeds its RayJob's DVC remote from it).
SLOWEST_FIRST = (
    "tests/test_dvc_experiments.py",
    "tests/data/test_reproducible.py",
    "tests/pipeline/test_sweep.py",
    "tests/test_smallnorb_synth_training.py",
    "tests/pipeline/test_gpu_worker.py",
    "tests/test_em.py",
    "tests/data/test_dvc.py",
    "tests/faults/test_fault_boundary.py",
    "tests/pipeline/test_gpu_profile.py",
    "tests/pipeline/test_cluster_path.py",
    "tests/test_dvc_repro.py",
    "tests/test_bench.py",
    "tests/pipeline/test_sweep_cluster.py",
    "tests/pipeline/test_smallnorb_sweep.py",
    "tests/test_train.py",
    "tests/faults/test_fault_experiments.py",
    "tests/faults/test_fault_stages.py",
    "tests/test_viewpoints.py",
    "tests/faults/test_fault_writes.py",
    "tests/test_gpu_check.py",
    "tests/test_outputs.py",
    "tests/faults/test_fault_hostile.py",
)


def slowest_first(items: list) -> None:
    """Sort pytest ``items`` in place: ``SLOWEST_FIRST`` first, in its order; every other
    file after them, as collected."""
    rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
