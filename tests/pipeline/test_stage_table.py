"""pipeline/dvc/stage_table.py: the stages of dvc.yaml as a table."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

pytest.importorskip("ruamel.yaml")

from pipeline.dvc import deps as dvc_deps
from pipeline.dvc import stage_table


@pytest.fixture(scope="module")
def stages(repo_root):
    return dvc_deps.load_stages(repo_root / "dvc.yaml")


def test_the_stage_table_prints_each_stage_with_its_command_and_files(repo_root, stages):
    """docs/pipeline.md shows the stages with ``python -m pipeline.dvc.stage_table``."""
    done = CliRunner().invoke(stage_table.main, ["--dvc-yaml", str(repo_root / "dvc.yaml")])
    assert done.exit_code == 0, done.output
    rows = done.output.splitlines()
    assert rows[0] == "| stage | command | params | reads | writes |"
    assert [r.split(" | ")[0] for r in rows[2:]] == [f"| `{name}`" for name in stages]
    (evaluate,) = [r for r in rows if r.startswith("| `evaluate` |")]
    assert "| `capsnet evaluate-stage --params params.yaml` | `evaluate`, " in evaluate
    assert "`data/prepared/mnist`" in evaluate and "`eval/summary.json`" in evaluate
    assert "capsnet/" not in evaluate.split(" | ")[3]  # code deps are not what it reads
