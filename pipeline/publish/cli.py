"""``capsnet publish``: the publish stage's command (``pipeline.publish.stage.publish``)."""

from __future__ import annotations

from pathlib import Path

import click

from capsnet.cli.declared import Command
from capsnet.cli.options import check_output, params_option

COMMAND = Command(
    "publish",
    "publish_command",
    "report.html, results.md and W&B eval runs; with --readme the README's table.",
    sections=("publish",),
    stages=("publish",),
)


@click.command("publish")
@params_option("section publish")
@click.option(
    "--metrics",
    "metrics_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Evaluation results (default: <evaluate.out_dir>/metrics.json).",
)
@click.option(
    "--readme",
    "readme_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also copy the results table into this document (between the results markers).",
)
def publish_command(params_path, metrics_path, readme_path):
    """report.html, results.md and W&B eval runs; with --readme the README's table.

    W&B is offline unless configured; online, a W&B Report too."""
    from capsnet import config

    params = config.load(params_path)
    out_dir = Path(params.evaluate.out_dir)
    metrics_path = metrics_path or out_dir / "metrics.json"
    check_output(params.publish.html, f"{params_path.name}: publish.html", "file")
    check_output(params.publish.dir, f"{params_path.name}: publish.dir")
    if readme_path is not None:
        check_output(readme_path, "--readme", "file")
    from pipeline.publish.stage import publish

    summary = publish(
        params, metrics_path, out_dir / "figures", log=click.echo, readme_path=readme_path
    )
    click.echo(f"published {len(summary['runs'])} run(s); report {summary['html']}")
