"""Every DVC stage as a markdown table, read from dvc.yaml as it stands: the command it
runs, the params keys it lists, what it reads besides code and what it writes.

    python -m pipeline.dvc.stage_table   # docs/pipeline.md shows the stages with this
"""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.dvc import deps as dvc_deps


def stage_table(root: Path, stages: dict) -> str:
    """The stages as a markdown table: the command each runs, the params it lists, what it
    reads besides code (its other deps) and what it writes (outs, metrics, plots)."""

    def cell(paths: list[str]) -> str:
        return ", ".join(f"`{p}`" for p in paths) or "–"

    packages = dvc_deps.project_packages(root)
    lines = ["| stage | command | params | reads | writes |", "|---|---|---|---|---|"]
    for name, stage in stages.items():
        cmd = stage.get("cmd", "")
        cmd = " ".join(cmd) if isinstance(cmd, list) else str(cmd)
        params = [dvc_deps.dep_path(p) for p in stage.get("params") or []]
        deps = [dvc_deps.dep_path(d) for d in stage.get("deps") or []]
        outs = [
            dvc_deps.dep_path(o)
            for key in ("outs", "metrics", "plots")
            for o in stage.get(key) or []
        ]
        reads = [d for d in deps if not dvc_deps.is_code(d, packages)]
        command = f"`{cmd.partition(' -m ')[2] or cmd}`"
        lines.append(f"| `{name}` | {command} | {cell(params)} | {cell(reads)} | {cell(outs)} |")
    return "\n".join(lines)


@click.command()
@dvc_deps.DVC_YAML_OPTION
def main(dvc_yaml: Path) -> None:
    """Print every stage of the pipeline file: command, params, what it reads and writes."""
    click.echo(stage_table(dvc_yaml.resolve().parent, dvc_deps.load_stages(dvc_yaml)))


if __name__ == "__main__":
    main()
