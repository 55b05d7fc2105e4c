"""``capsnet train-final``: the best sweep config and the baselines (pipeline/final/stage.py)."""

from __future__ import annotations

from pathlib import Path

import click

from capsnet.cli.declared import Command
from capsnet.cli.options import check_output, mirror_option, resolve_mirror
from pipeline.sweep.sections import (
    DATA_ROOT_OPTION,
    PARAMS_OPTION,
    SWEEP_OUT,
    SWEEP_SECTIONS,
    TRAIN_SECTIONS,
    load_params,
)

COMMAND = Command(
    "train-final",
    "train_final_command",
    "Train the best sweep config and the baselines; write <out_dir>/<model>.pt.",
    sections=("train", "smallnorb_train"),
    stages=("train", "train_smallnorb"),
)


@click.command("train-final")
@PARAMS_OPTION
@click.option(
    "--section",
    type=click.Choice(TRAIN_SECTIONS),
    default="train",
    show_default=True,
    help="The params section of the final training: train (MNIST) or smallnorb_train.",
)
@click.option(
    "--sweep-section",
    type=click.Choice(SWEEP_SECTIONS),
    default=None,
    help="The sweep section (dataset, W&B settings) [default: smallnorb_sweep for "
    "--section smallnorb_train, else sweep].",
)
@click.option(
    "--best",
    "best_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The sweep's best config [default: best.json in the sweep section's output "
    "directory: sweep/ or sweep-smallnorb/].",
)
@click.option(
    "--metrics",
    "metrics_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the final metrics as JSON here (default: <train.out_dir>/metrics.json).",
)
@DATA_ROOT_OPTION
@mirror_option
def train_final_command(
    params_path, section, sweep_section, best_path, metrics_path, data_root, mirror
):
    """Train the best sweep config and the baselines; write <out_dir>/<model>.pt."""
    from capsnet.data.stages import why_off
    from capsnet.io.outputset import write_disabled
    from pipeline.final.stage import model_dir_files, train_final

    params = load_params(params_path)
    final = getattr(params, section)
    if sweep_section is None:
        sweep_section = "smallnorb_sweep" if section == "smallnorb_train" else "sweep"
    sweep = getattr(params, sweep_section)
    best_path = best_path or SWEEP_OUT[sweep_section] / "best.json"
    if metrics_path is not None:
        check_output(metrics_path, "--metrics", "file")
    metrics_path = metrics_path or Path(final.out_dir) / "metrics.json"
    own = model_dir_files(metrics_path, final.out_dir)
    check_output(final.out_dir, f"{params_path.name}: {section}.out_dir", own=own)
    reason = why_off(params, sweep.dataset, data_root)
    if reason is not None:
        out = write_disabled(final.out_dir, reason, [metrics_path], own=own)
        click.echo(f"{section}: not run, {reason}")
        click.echo(f"wrote {out / 'DISABLED.txt'}, {metrics_path} (marked disabled)")
        return
    results = train_final(
        final,
        sweep,
        params,
        best_path=best_path,
        data_root=data_root,
        mirror=resolve_mirror(mirror, params),
        metrics_path=metrics_path,
        log=lambda line: click.echo(line, err=True),
    )
    for name, metrics in results.items():
        val = metrics.get("val_accuracy")
        line = f"{name}: val accuracy " + (f"{val:.4f}" if val is not None else "n/a")
        if "test_accuracy" in metrics:
            line += f", {metrics['dataset']} test accuracy {metrics['test_accuracy']:.4f}"
        click.echo(line)
    click.echo(f"wrote {metrics_path}")
