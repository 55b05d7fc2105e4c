"""Fixtures for the data tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from datahelpers import write_tiny_mnist


@pytest.fixture
def tiny_root(tmp_path) -> Path:
    """A data root with tiny raw MNIST files (no download needed)."""
    write_tiny_mnist(tmp_path / "data" / "raw" / "mnist")
    return tmp_path / "data"


@pytest.fixture
def cli():
    """Invoke ``capsnet ARGS``; returns the click Result (stderr kept apart)."""
    from capsnet.cli import main

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return invoke
