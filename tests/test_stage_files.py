"""A new DVC stage is five files (docs/guides/pipeline.md, "Adding a stage"): a toy stage added to
a copy of the repository (its folder pipeline/toystage/ holding cli.py and stage.py) runs,
is listed, has exact deps and passes the walls, with nothing else edited."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from repohelpers import tracked_copy
from test_layout import import_graph, layer_breaches, package_cycles
from test_walls import dataset_comparisons, dvc_stage_commands, wall_breaches

from capsnet.cli.declared import discover
from pipeline.dvc import deps as dvc_deps
from pipeline.dvc.stage_table import stage_table

TOY_FILES = {
    "pipeline/toystage/stage.py": '''
        """The toy stage: the sum of its section's numbers, written as one file."""

        from __future__ import annotations

        from pathlib import Path

        from capsnet.io.files import atomic_write_text


        def run(params) -> Path:
            section = params.toystage
            return atomic_write_text(section.out, f"{sum(section.numbers)}\\n")
    ''',
    "pipeline/toystage/cli.py": '''
        """``capsnet toystage``: the toy stage (pipeline/toystage/stage.py)."""

        from __future__ import annotations

        import click

        from capsnet.cli.declared import Command
        from capsnet.cli.options import params_option

        COMMAND = Command(
            "toystage",
            "toystage_command",
            "Write the sum of toystage.numbers to toystage.out.",
            sections=("toystage",),
            stages=("toystage",),
        )


        @click.command("toystage")
        @params_option("section toystage")
        def toystage_command(params_path):
            """Write the sum of toystage.numbers to toystage.out."""
            from capsnet import config
            from pipeline.toystage import stage

            click.echo(f"wrote {stage.run(config.load(params_path))}")
    ''',
    "capsnet/config/toystage.py": '''
        """params.yaml ``toystage``."""

        from __future__ import annotations

        from dataclasses import dataclass
        from typing import ClassVar

        from capsnet.config.schema import Section


        @dataclass(frozen=True)
        class ToyStageParams(Section):
            SECTION: ClassVar[str] = "toystage"

            numbers: tuple[int, ...] = (1, 2)
            out: str = "toy.txt"
    ''',
}
PARAMS = "\ntoystage:\n  numbers: [1, 2, 3]\n  out: toy.txt\n"
STAGE = """
  toystage:
    cmd: python -m capsnet toystage --params params.yaml
    params:
      - toystage
    outs:
      - toy.txt
"""


def _run(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(cwd)}  # the copy's code, as DVC would run it
    for key in ("DVC_STAGE", "CAPSNET_PARAMS_TRACE"):
        env.pop(key, None)
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def copy(repo_root, tmp_path_factory) -> Path:
    """The repository's git-tracked files, committed in a fresh git repository."""
    return tracked_copy(repo_root, tmp_path_factory.mktemp("stagefiles") / "repo")


def test_a_new_stage_is_five_files(copy):
    for name, text in TOY_FILES.items():
        (copy / name).parent.mkdir(exist_ok=True)
        (copy / name).write_text(text.replace("\n        ", "\n").lstrip("\n"))
    with open(copy / "params.yaml", "a") as fh:
        fh.write(PARAMS)
    with open(copy / "dvc.yaml", "a") as fh:
        fh.write(STAGE)
    python = [sys.executable, "-m"]

    listed = " ".join(_run([*python, "capsnet", "--help"], copy).split("Commands:")[1].split())
    assert "toystage Write the sum of toystage.numbers to toystage.out." in listed
    assert _run([*python, "capsnet", "toystage", "--params", "params.yaml"], copy) == (
        "wrote toy.txt\n"
    )
    assert (copy / "toy.txt").read_text() == "6\n"
    _run([*python, "pipeline.dvc.deps", "--write"], copy)
    assert "every stage's code deps are" in _run([*python, "pipeline.dvc.deps"], copy)
    stages = dvc_deps.load_stages(copy / "dvc.yaml")
    assert {"pipeline/toystage/cli.py", "pipeline/toystage/stage.py"} <= set(
        stages["toystage"]["deps"]
    )
    assert "capsnet/config/toystage.py" in stages["train"]["deps"]  # every stage loads Params

    row = "| `toystage` | `capsnet toystage --params params.yaml` | `toystage` | – | `toy.txt` |"
    assert row in stage_table(copy, stages).splitlines()  # docs/guides/pipeline.md's table
    declared = {stage: c.name for c in discover(copy) for stage in c.stages}
    assert declared["toystage"] == dvc_stage_commands(copy)["toystage"] == "toystage"
    assert wall_breaches(copy / "capsnet") == dataset_comparisons(copy) == []
    graph = import_graph(copy)
    assert layer_breaches(graph) == package_cycles(graph) == []

    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=copy, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert sorted(line[3:] for line in status.splitlines()) == sorted(
        [*TOY_FILES, "params.yaml", "dvc.yaml", "toy.txt"]
    )
    assert yaml.safe_load((copy / "params.yaml").read_text())["toystage"]["numbers"] == [1, 2, 3]
