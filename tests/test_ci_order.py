"""The order CI's pytest-xdist workers take the test files in (tests/ciorder.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ciorder import SLOWEST_FIRST, slowest_first

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_every_listed_slow_file_exists_once():
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST)
    missing = [name for name in SLOWEST_FIRST if not (REPO_ROOT / name).is_file()]
    assert not missing, f"SLOWEST_FIRST names files that are gone: {missing}"


def test_listed_files_come_first_in_their_order_and_the_rest_as_collected():
    ids = [
        "tests/test_io.py::test_a",
        f"{SLOWEST_FIRST[1]}::test_b",
        "tests/test_cells.py::test_c",
        f"{SLOWEST_FIRST[0]}::test_d",
        "tests/test_io.py::test_e",
        f"{SLOWEST_FIRST[1]}::test_f[1]",
    ]
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    slowest_first(items)
    assert [item.nodeid for item in items] == [
        f"{SLOWEST_FIRST[0]}::test_d",
        f"{SLOWEST_FIRST[1]}::test_b",
        f"{SLOWEST_FIRST[1]}::test_f[1]",
        "tests/test_io.py::test_a",
        "tests/test_cells.py::test_c",
        "tests/test_io.py::test_e",
    ]
