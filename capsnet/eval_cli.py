"""``capsnet eval`` (checkpoints side by side on any evaluation set) and ``capsnet
evaluate-stage`` (the DVC ``evaluate`` stage). capsnet/cli.py attaches both."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from capsnet.cli_options import (
    FiniteFloat,
    FloatList,
    check_output,
    count,
    data_root_option,
    field_default,
    format_floats,
    mirror_option,
    output_option_check,
    params_option,
    resolve_mirror,
)
from capsnet.config import EVAL_DATASETS, EvaluateParams, RobustnessParams


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
    type=FloatList(),
    default=None,
    help="Rotated-MNIST angles in degrees (adds rotated-mnist)  [default: "
    f"{format_floats(field_default(EvaluateParams, 'angles'), ', ')}]",
)
@click.option(
    "--limit",
    type=count(),
    default=field_default(EvaluateParams, "limit"),
    help="Evaluate on the first N test images of each set only.",
)
@click.option(
    "--batch-size",
    type=count(),
    default=field_default(EvaluateParams, "batch_size"),
    show_default=True,
)
@click.option("--device", default=field_default(EvaluateParams, "device"), show_default=True)
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
    type=FloatList(FiniteFloat(0, 1, low_open=True)),
    default=format_floats(field_default(RobustnessParams, "epsilons")),
    show_default=True,
)
@click.option(
    "--bim-steps",
    type=count(2),
    default=field_default(RobustnessParams, "bim_steps"),
    show_default=True,
)
@click.option(
    "--robustness-limit",
    type=count(),
    default=field_default(RobustnessParams, "limit"),
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
    callback=output_option_check("file"),
    help="Write the results as JSON here.",
)
@click.option(
    "--figures",
    "figures_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    callback=output_option_check("root"),
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
    from capsnet.io import atomic_write_text
    from capsnet.train import select_device

    datasets = list(dict.fromkeys(datasets or ("mnist",)))
    if angles and "rotated-mnist" not in datasets:
        datasets.append("rotated-mnist")
    given = {"angles": angles} if angles else {}
    base = EvaluateParams(datasets=tuple(datasets), limit=limit, **given)
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
    check_output(params.evaluate.out_dir, f"{params_path.name}: evaluate.out_dir")
    mirror = resolve_mirror(mirror, params)
    written = evaluation.run_stage(params, data_root=data_root, mirror=mirror, log=_stderr_log)
    import json

    results = json.loads(written["metrics"].read_text())
    for line in evaluation.summary_lines(results):
        click.echo(line)
    click.echo(f"wrote {len(written)} file(s) to {params.evaluate.out_dir}")
