"""``capsnet eval`` (checkpoints side by side on any evaluation set) and ``capsnet
evaluate-stage`` (the DVC ``evaluate`` stage). capsnet/cli.py attaches both."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from capsnet.cli_options import data_root_option, mirror_option, params_option
from capsnet.config import EVAL_DATASETS

DEFAULT_ANGLES = "0,15,30,35,45,60,90,180"


def _parse_floats(what: str, low: float | None = None, high: float | None = None):
    def parse(ctx, param, value: str | None):
        if value is None:
            return None
        try:
            numbers = [float(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a comma-separated list of {what}") from None
        if not numbers:
            raise click.BadParameter(f"no {what} given")
        bad = [
            n for n in numbers if (low is not None and n <= low) or (high is not None and n > high)
        ]
        if bad:
            raise click.BadParameter(f"{bad[0]:g} is outside ({low:g}, {high:g}]")
        return numbers

    return parse


def _stderr_log(line: str) -> None:
    click.echo(line, err=True)


@click.command("eval")
@click.argument("checkpoints", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--dataset",
    "datasets",
    multiple=True,
    type=click.Choice(EVAL_DATASETS),
    help="Evaluation set (repeatable; default mnist). affnist is the real set when present, "
    "else affnist-synth (the output says which).",
)
@click.option(
    "--angles",
    callback=_parse_floats("degrees"),
    default=None,
    help=f"Rotated-MNIST angles (adds rotated-mnist), e.g. {DEFAULT_ANGLES}.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Evaluate on the first N test images of each set only.",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=500, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@data_root_option()
@mirror_option
@click.option(
    "--robustness/--no-robustness",
    default=False,
    show_default=True,
    help="FGSM and BIM accuracy at each --epsilons on MNIST.",
)
@click.option(
    "--epsilons",
    callback=_parse_floats("epsilons", 0.0, 1.0),
    default="0.05,0.1,0.2,0.3",
    show_default=True,
)
@click.option("--bim-steps", type=click.IntRange(min=2), default=10, show_default=True)
@click.option(
    "--robustness-limit",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="Attack the first N MNIST test images.",
)
@click.option(
    "--equivariance/--no-equivariance",
    default=False,
    show_default=True,
    help="Pose diagnostic: how the class capsule's pose moves as the input rotates.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the results as JSON here.",
)
@click.option(
    "--figures",
    "figures_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write the PNG figures (rotation curve, reconstructions, ...) here.",
)
def eval_command(
    checkpoints,
    datasets,
    angles,
    limit,
    batch_size,
    device,
    data_root,
    mirror,
    robustness,
    epsilons,
    bim_steps,
    robustness_limit,
    equivariance,
    out,
    figures_dir,
):
    """Evaluate CHECKPOINT(s) side by side on the chosen test sets."""
    import dataclasses

    from capsnet import eval as evaluation
    from capsnet.config import EvaluateParams
    from capsnet.io import atomic_write_text
    from capsnet.train import select_device

    if out is not None and out.is_dir():
        raise click.BadParameter(f"{out} is a directory", param_hint="--out")
    datasets = list(dict.fromkeys(datasets or ("mnist",)))
    if angles and "rotated-mnist" not in datasets:
        datasets.append("rotated-mnist")
    if angles is None:
        angles = [float(a) for a in DEFAULT_ANGLES.split(",")]
    base = EvaluateParams(datasets=tuple(datasets), angles=tuple(angles), limit=limit)
    settings = dataclasses.replace(
        base,
        batch_size=batch_size,
        device=str(select_device(device)),
        robustness=dataclasses.replace(
            base.robustness,
            enabled=robustness,
            epsilons=tuple(epsilons),
            bim_steps=bim_steps,
            limit=robustness_limit,
        ),
        equivariance=dataclasses.replace(base.equivariance, enabled=equivariance),
    )
    log = _stderr_log if sys.stderr.isatty() else None
    request = evaluation.EvalRequest(settings, data_root=data_root, mirror=mirror, log=log)
    drawer = evaluation.FigureDrawer(figures_dir) if figures_dir is not None else None
    results = evaluation.evaluate_checkpoints(list(checkpoints), request, figures=drawer)
    for line in evaluation.summary_lines(results):
        click.echo(line)
    if out is not None:
        atomic_write_text(out, evaluation.metrics_json(results))
        click.echo(f"wrote {out}")
    if drawer is not None:
        click.echo(f"wrote {len(drawer.written)} figure(s) to {figures_dir}")


@click.command("evaluate-stage")
@params_option("section evaluate")
@data_root_option()
@mirror_option
def evaluate_stage_command(params_path, data_root, mirror):
    """The DVC evaluate stage: every checkpoint in evaluate.models_dir -> evaluate.out_dir."""
    from capsnet import config
    from capsnet import eval as evaluation

    params = config.load(params_path)
    written = evaluation.run_stage(params, data_root=data_root, mirror=mirror, log=_stderr_log)
    import json

    results = json.loads(written["metrics"].read_text())
    for line in evaluation.summary_lines(results):
        click.echo(line)
    click.echo(f"wrote {len(written)} file(s) to {params.evaluate.out_dir}")
