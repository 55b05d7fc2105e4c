"""The data stages of dvc.yaml, from the mirror, in the shrunk pipeline that
tests/conftest.py reproduced (`dvc repro` of every stage): their outputs, nothing left to do
afterwards, and a data param that invalidates exactly the stage reading it."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_dvc_repro import run

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def data_stages(dvc_yaml: Path) -> list[str]:
    """The data stages of dvc.yaml (those running `python -m capsnet data ...`)."""
    import yaml

    pipeline = yaml.safe_load(dvc_yaml.read_text())
    stages = [
        name
        for name, stage in pipeline["stages"].items()
        if " capsnet data " in f" {stage.get('cmd', '')}"
    ]
    assert {"download_mnist", "prepare_mnist", "build_multimnist"} <= set(stages)
    return stages


def test_dvc_repro_data_stages_then_nothing_to_do(project_copy):
    work, dvc, env, first = project_copy  # the first `dvc repro` (tests/conftest.py)
    stages = data_stages(work / "dvc.yaml")
    for stage in stages:
        assert f"Running stage '{stage}'" in first, stage
    prepared = work / "data" / "prepared"
    assert sorted(p.name for p in (prepared / "mnist").iterdir()) == ["test.pt", "train.pt"]
    assert (prepared / "multimnist" / "train.pt").is_file()
    assert (prepared / "affnist-synth" / "test.pt").is_file()
    # on by default: the stand-in, rendered offline (no official files in the mirror)
    assert sorted(p.name for p in (prepared / "smallnorb").iterdir()) == ["test.pt", "train.pt"]
    source = work / "data" / "raw" / "smallnorb" / "SOURCE.txt"
    assert source.read_text().strip() == "smallnorb-synth"
    assert (prepared / "affnist" / "DISABLED.txt").is_file()  # source: synth by default
    assert not (prepared / "rotated-mnist").exists()  # rotated when loaded, never stored

    second = run([dvc, "repro", *stages], work, env)
    assert "Running stage" not in second and "up to date" in second

    # a param change invalidates exactly the stage that reads it
    params = work / "params.yaml"
    params.write_text(params.read_text().replace("    shift: 4", "    shift: 6"))
    status = run([dvc, "status", *stages], work, env)
    assert "build_multimnist" in status
    assert "prepare_mnist" not in status and "build_affnist_synth" not in status
