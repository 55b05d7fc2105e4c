"""``capsnet eval`` (checkpoints side by side on any evaluation set) and ``capsnet
evaluate-stage`` (the DVC ``evaluate`` stage). capsnet/cli/__init__.py attaches both."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from capsnet.cli.declared import Command
from capsnet.cli.options import (
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
from capsnet.config import EVAL_DATASETS, EvaluateParams, dataset_specs


def _stderr_log(line: str) -> None:
    click.echo(line, err=True)


COMMANDS = (
    Command(
        "eval",
        "eval_command",
        "Evaluate CHECKPOINT(s) side by side on the chosen test sets.",
    ),
    Command(
        "evaluate-stage",
        "evaluate_stage_command",
        "The DVC evaluate stage: every checkpoint in evaluate.models_dir -> evaluate.out_dir.",
        sections=("evaluate",),
        stages=("evaluate",),
    ),
)


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
    default=None,
    help="Evaluate on the first N test images of each set only  [default: evaluate.limit "
    "of the params file, as the evaluate stage]",
)
@click.option(
    "--batch-size",
    type=count(),
    default=None,
    help="[default: evaluate.batch_size of the params file]",
)
@click.option("--device", default=field_default(EvaluateParams, "device"), show_default=True)
@click.option(
    "--compile/--no-compile",
    "compile_routing",
    default=None,
    help="torch.compile the EM routing of em-capsnet checkpoints (a one-off compilation, "
    "then faster scoring)  [default: evaluate.compile of the params file]",
)
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
    default=None,
    help="[default: evaluate.robustness.epsilons of the params file]",
)
@click.option(
    "--bim-steps",
    type=count(2),
    default=None,
    help="[default: evaluate.robustness.bim_steps of the params file]",
)
@click.option(
    "--robustness-limit",
    type=count(),
    default=None,
    help="Attack the first N MNIST test images  [default: evaluate.robustness.limit of the "
    "params file]",
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
    help="Write the PNG figures (rotation curve, reconstructions, ...) here; the folder is "
    "replaced whole (it may hold only PNG files from an earlier run).",
)
@params_option(
    "its evaluate section gives the defaults; without the file, the built-in ones",
    default=None,
)
def eval_command(
    params_path,
    checkpoints,
    datasets,
    angles,
    limit,
    batch_size,
    device,
    compile_routing,
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

    from capsnet import config, evaluation
    from capsnet.evaluation.outputs import FIGURE_FILES
    from capsnet.io.outputset import OutputSet
    from capsnet.training.device import select_device

    _refuse_repeats(checkpoints)
    _refuse_foreign_figures(figures_dir)
    params = config.load_or_default(params_path)
    section = params.evaluate
    chosen_sets = datasets or dataset_specs.EVAL_DATASETS[:1]  # the first declared: MNIST
    rotated = dataset_specs.ROTATION_SETS if angles else ()
    datasets = list(dict.fromkeys([*chosen_sets, *rotated]))
    angles = tuple(angles) if angles else section.angles
    base = EvaluateParams(datasets=tuple(datasets), angles=angles, limit=_or(limit, section.limit))
    chosen = section.robustness
    settings = dataclasses.replace(
        base,
        batch_size=_or(batch_size, section.batch_size),
        device=str(select_device(device)),
        compile=_or(compile_routing, section.compile),
        robustness=dataclasses.replace(
            base.robustness,
            enabled=robustness,
            epsilons=tuple(_or(epsilons, chosen.epsilons)),
            bim_steps=_or(bim_steps, chosen.bim_steps),
            limit=_or(robustness_limit, chosen.limit),
        ),
        equivariance=dataclasses.replace(section.equivariance, enabled=equivariance),
    )
    log = _stderr_log if sys.stderr.isatty() else None
    request = evaluation.EvalRequest(
        settings, data=params.data, data_root=data_root, mirror=mirror, log=log
    )
    with OutputSet() as outputs:  # the figures folder and --out land together, or neither
        staging = None if figures_dir is None else outputs.directory(figures_dir, FIGURE_FILES)
        drawer = evaluation.FigureDrawer(staging) if staging is not None else None
        results = evaluation.evaluate_checkpoints(list(checkpoints), request, figures=drawer)
        if out is not None:
            outputs.file(out, evaluation.metrics_json(results))
    lines = evaluation.summary_lines(results) + ([f"wrote {out}"] if out is not None else [])
    if drawer is not None:
        lines.append(f"wrote {len(drawer.written)} figure(s) to {figures_dir}")
    click.echo("\n".join(lines))


def _or(given, default):
    """An option's value, or the params file's when the option was not given."""
    return default if given is None else given


def _refuse_foreign_figures(figures_dir: Path | None) -> None:
    """--figures is replaced whole: a folder holding anything but figures is refused."""
    from capsnet.evaluation.outputs import FIGURE_FILES

    if figures_dir is not None:
        check_output(figures_dir, "--figures", own=FIGURE_FILES)


def _refuse_repeats(checkpoints) -> None:
    """A checkpoint named twice (by any path) would count as two seeds: refused."""
    seen: dict[Path, Path] = {}
    for path in checkpoints:
        key = Path(path).resolve()
        if key in seen:
            raise click.BadParameter(
                f"{path} is {seen[key]} again; each checkpoint counts once",
                param_hint="CHECKPOINTS",
            )
        seen[key] = Path(path)


@click.command("evaluate-stage")
@params_option("section evaluate")
@data_root_option()
@mirror_option
def evaluate_stage_command(params_path, data_root, mirror):
    """The DVC evaluate stage: every checkpoint in evaluate.models_dir -> evaluate.out_dir."""
    from capsnet import config, evaluation
    from capsnet.evaluation.outputs import FIGURE_FILES, FIGURES_DIR

    params = config.load(params_path)
    key = f"{params_path.name}: evaluate.out_dir"
    check_output(params.evaluate.out_dir, key)
    check_output(Path(params.evaluate.out_dir) / FIGURES_DIR, key, own=FIGURE_FILES)
    mirror = resolve_mirror(mirror, params)
    written = evaluation.run_stage(params, data_root=data_root, mirror=mirror, log=_stderr_log)
    from capsnet.evaluation.outputs import fit_width
    from capsnet.evaluation.results import load_results

    headline = (f"{params.evaluate.confusion_angle:g}", "0")  # the full table: metrics.json
    for line in fit_width(evaluation.summary_lines(load_results(written["metrics"]), headline)):
        click.echo(line)
    click.echo(f"wrote {len(written)} file(s) to {params.evaluate.out_dir} (every angle there)")
