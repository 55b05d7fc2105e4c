"""`dvc repro` of the data stages in a temporary copy of the repository, from the mirror."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def shrink(params: str) -> str:
    """The real params.yaml, shrunk: 500 affnist-synth digits, the smallNORB stand-in
    rendered at 48x48 (the prepared size)."""
    import yaml

    values = yaml.safe_load(params)
    values["data"]["affnist"]["synth"]["limit"] = 500
    values["data"]["smallnorb"]["synth"]["side"] = 48
    return yaml.safe_dump(values, sort_keys=False)


def data_stages(dvc_yaml: Path) -> str:
    """dvc.yaml restricted to the data stages (those running `python -m capsnet data ...`)."""
    import yaml

    pipeline = yaml.safe_load(dvc_yaml.read_text())
    stages = {
        name: stage
        for name, stage in pipeline["stages"].items()
        if " capsnet data " in f" {stage.get('cmd', '')}"
    }
    assert {"download_mnist", "prepare_mnist", "build_multimnist"} <= set(stages)
    return yaml.safe_dump({"stages": stages}, sort_keys=False)


def run(args, cwd, env):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_dvc_repro_data_stages_then_nothing_to_do(tmp_path, repo_root, mnist_mirror):
    pytest.importorskip("dvc")
    bin_dir = Path(sys.executable).parent
    dvc = shutil.which("dvc", path=str(bin_dir)) or shutil.which("dvc")
    if dvc is None or shutil.which("capsnet", path=str(bin_dir)) is None:
        pytest.skip("dvc or the capsnet command is not installed")
    work = tmp_path / "repo"
    shutil.copytree(
        repo_root / "capsnet", work / "capsnet", ignore=shutil.ignore_patterns("__pycache__")
    )
    (work / "dvc.yaml").write_text(data_stages(repo_root / "dvc.yaml"))
    (work / "params.yaml").write_text(shrink((repo_root / "params.yaml").read_text()))
    env = {
        **os.environ,
        "CAPSNET_MIRROR": str(mnist_mirror),
        "DVC_NO_ANALYTICS": "1",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("CAPSNET_DATA", None)
    run([dvc, "init", "--no-scm", "-q"], work, env)

    first = run([dvc, "repro"], work, env)
    assert "Running stage 'prepare_mnist'" in first
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

    second = run([dvc, "repro"], work, env)
    assert "Running stage" not in second and "up to date" in second

    # a param change invalidates exactly the stage that reads it
    params = work / "params.yaml"
    params.write_text(params.read_text().replace("    shift: 4", "    shift: 6"))
    status = run([dvc, "status"], work, env)
    assert "build_multimnist" in status
    assert "prepare_mnist" not in status and "build_affnist_synth" not in status
