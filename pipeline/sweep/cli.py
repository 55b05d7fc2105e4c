"""``capsnet sweep``: the Ray Tune sweep of a params section (pipeline/sweep/stage.py)."""

from __future__ import annotations

from pathlib import Path

import click

from capsnet.cli.declared import Command
from capsnet.cli.options import check_output, count, mirror_option, resolve_mirror
from capsnet.io.errors import CapsnetError
from pipeline.sweep.sections import (
    DATA_ROOT_OPTION,
    PARAMS_OPTION,
    SWEEP_OUT,
    SWEEP_SECTIONS,
    check_ray_address,
    check_sweep_outputs,
    load_params,
    sigint_seen,
)

COMMAND = Command(
    "sweep",
    "sweep_command",
    "Run the Ray Tune sweep of a params section (resuming an interrupted one).",
    sections=("sweep", "smallnorb_sweep"),
    stages=("sweep", "sweep_smallnorb"),
)


@click.command("sweep")
@PARAMS_OPTION
@click.option(
    "--section",
    type=click.Choice(SWEEP_SECTIONS),
    default="sweep",
    show_default=True,
    help="The params section of the sweep: sweep (MNIST) or smallnorb_sweep.",
)
@click.option(
    "--address",
    envvar="RAY_ADDRESS",
    default="local",
    show_default=True,
    help="Ray cluster to run on (also $RAY_ADDRESS): 'local' starts a private "
    "instance; 'auto', host:port or ray://host:10001 join a cluster.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory for results.csv, best.json and plots/ [default: sweep, or "
    "sweep-smallnorb for --section smallnorb_sweep].",
)
@click.option(
    "--num-cpus",
    type=count(),
    default=None,
    help="CPUs of a local Ray instance (default: all).",
)
@DATA_ROOT_OPTION
@mirror_option
def sweep_command(params_path, section, address, out_dir, num_cpus, data_root, mirror):
    """Run the Ray Tune sweep of a params section (resuming an interrupted one)."""
    from capsnet.data.stages import why_off
    from pipeline.sweep.results import write_disabled
    from pipeline.sweep.stage import SweepInterrupted, base_spec, run_sweep

    params = load_params(params_path)
    sweep = getattr(params, section)
    out_dir = out_dir or SWEEP_OUT[section]
    check_output(out_dir, "--out")
    reason = why_off(params, sweep.dataset, data_root)
    if reason is not None:
        outputs = write_disabled(out_dir, sweep, reason)
        click.echo(f"{section}: not run, {reason}")
        click.echo("wrote " + ", ".join(outputs.values()) + " (marked disabled)")
        return
    check_sweep_outputs(params_path, section, sweep)
    check_ray_address(address)
    base = base_spec(sweep, params, data_root, resolve_mirror(mirror, params))
    with sigint_seen() as (interrupted, poll):
        try:
            outcome = run_sweep(
                sweep, base, out_dir=out_dir, address=address, num_cpus=num_cpus,
                interrupted=poll,
            )  # fmt: skip
        except SweepInterrupted as exc:
            stopped = exc
        else:
            stopped = None
    if interrupted[0]:
        raise KeyboardInterrupt
    if stopped is not None:  # unfinished trials though nothing interrupted this run
        raise CapsnetError(
            f"the sweep ended with unfinished trials though it was not interrupted: its saved "
            f"state in {stopped.experiment_path} is incomplete; remove it to start afresh"
        )
    verb = "resumed" if outcome.restored else "ran"
    click.echo(f"{verb} {len(outcome.rows)} trial(s); state in {outcome.experiment_path}")
    if outcome.best is not None:
        best = outcome.best
        shown = ", ".join(f"{k}={v}" for k, v in best["config"].items())
        click.echo(
            f"best {best['metric']} {best['metrics'][best['metric']]:.4f} "
            f"(trial {best['trial_id']}): {shown}"
        )
    click.echo("wrote " + ", ".join(outcome.outputs.values()))
