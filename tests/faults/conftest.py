"""The fault-injection suite's fixtures: the tally, a prepared MNIST root, a checkpoint,
and small file systems (full, read-only) where this machine lets a test mount one."""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
from pathlib import Path

import pytest
from faulthelpers import Tally, invoke, tmpfs

_TALLY = Tally()
_WRITTEN: list[Path] = []


@pytest.fixture(scope="session")
def tally(tmp_path_factory) -> Tally:
    """The session's counts, written to <basetemp>/faults.json when the session ends."""
    yield _TALLY
    _WRITTEN.append(_TALLY.write(tmp_path_factory.getbasetemp() / "faults.json"))


#: Seconds one test of the suite may take before it counts as a hang and fails.
TEST_DEADLINE = 900


@pytest.fixture(autouse=True)
def deadline(tally):
    """Every case ends within TEST_DEADLINE seconds: past it the test fails as a hang."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        tally.hangs += 1
        raise TimeoutError(f"the case ran past its {TEST_DEADLINE} s deadline (a hang)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_DEADLINE)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def pytest_terminal_summary(terminalreporter):
    if _TALLY.inputs or _TALLY.faults:
        where = f" (counts in {_WRITTEN[-1]})" if _WRITTEN else ""
        terminalreporter.write_line(_TALLY.line() + where)


@pytest.fixture(scope="session")
def prepared_root(tmp_path_factory, mnist_mirror) -> Path:
    """A data root with the raw and prepared MNIST (prepared by ``capsnet data prepare``)."""
    root = tmp_path_factory.mktemp("faults-data")
    raw = root / "raw" / "mnist"
    raw.mkdir(parents=True)
    for gz in (mnist_mirror / "mnist").glob("*.gz"):
        shutil.copy(gz, raw / gz.name)
    done = invoke("data", "prepare", "mnist", "--data-root", root)
    assert done.code == 0, done.stderr
    return root


@pytest.fixture(scope="session")
def lenet_checkpoint(tmp_path_factory) -> Path:
    """An untrained lenet5 checkpoint."""
    import torch

    from capsnet import models
    from capsnet.models import checkpoint

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("faults-ckpt") / "lenet5.pt"
    return checkpoint.save(path, models.build("lenet5"))


@pytest.fixture
def blocker(tmp_path) -> Path:
    """A regular file: every path under it is unwritable, whoever runs the test."""
    path = tmp_path / "a-file"
    path.write_text("not a directory\n")
    return path


def fill(directory: Path) -> None:
    """Write into ``directory`` until its file system has no space left."""
    with open(directory / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)


@pytest.fixture
def full_disk(tmp_path) -> Path:
    """A directory on a 64 KiB tmpfs that is already full."""
    with tmpfs(tmp_path / "full", "size=64k") as where:
        fill(where)
        yield where


@pytest.fixture
def read_only(tmp_path) -> Path:
    """A directory on a read-only tmpfs."""
    with tmpfs(tmp_path / "ro", "ro,size=64k") as where:
        yield where
