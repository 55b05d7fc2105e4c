"""``capsnet sweep`` and ``capsnet train-final``: thin click commands over pipeline.sweep
and pipeline.train_final. capsnet/cli.py attaches them lazily, so ``capsnet`` runs where
Ray and W&B are not installed.

``--section`` picks the params section: ``sweep`` / ``train`` (MNIST, the defaults) or
``smallnorb_sweep`` / ``smallnorb_train`` (the EM paper's smallNORB ablation). With
smallNORB switched off both commands exit 0 and write outputs marked DISABLED."""

from __future__ import annotations

from pathlib import Path

import click

from capsnet.cli_options import data_root_option, mirror_option, params_option, resolve_mirror

PARAMS_OPTION = params_option("sections sweep, train, smallnorb_sweep, smallnorb_train")
DATA_ROOT_OPTION = data_root_option()
SWEEP_SECTIONS = ("sweep", "smallnorb_sweep")
TRAIN_SECTIONS = ("train", "smallnorb_train")
#: Each sweep section's output directory (also where train-final reads best.json), so the
#: smallNORB sweep never writes over the MNIST one by default.
SWEEP_OUT = {"sweep": Path("sweep"), "smallnorb_sweep": Path("sweep-smallnorb")}


def _load(params_path: Path):
    from capsnet import config

    return config.load(params_path)


def _disabled(params, sweep, data_root) -> str | None:
    """Why the sweep's dataset cannot be used, or None (MNIST is always on here)."""
    from pipeline.sweep import smallnorb_disabled

    if sweep.dataset != "smallnorb":
        return None
    return smallnorb_disabled(params, data_root)


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
    type=click.IntRange(min=1),
    default=None,
    help="CPUs of a local Ray instance (default: all).",
)
@DATA_ROOT_OPTION
@mirror_option
def sweep_command(params_path, section, address, out_dir, num_cpus, data_root, mirror):
    """Run the Ray Tune sweep of a params section (resuming an interrupted one)."""
    from pipeline.results import write_disabled
    from pipeline.sweep import base_spec, run_sweep

    params = _load(params_path)
    sweep = getattr(params, section)
    out_dir = out_dir or SWEEP_OUT[section]
    reason = _disabled(params, sweep, data_root)
    if reason is not None:
        outputs = write_disabled(out_dir, sweep, reason)
        click.echo(f"{section}: not run, {reason}")
        click.echo("wrote " + ", ".join(outputs.values()) + " (marked disabled)")
        return
    base = base_spec(sweep, params, data_root, resolve_mirror(mirror, params))
    outcome = run_sweep(sweep, base, out_dir=out_dir, address=address, num_cpus=num_cpus)
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
    from pipeline.train_final import train_final, write_disabled

    params = _load(params_path)
    final = getattr(params, section)
    if sweep_section is None:
        sweep_section = "smallnorb_sweep" if section == "smallnorb_train" else "sweep"
    sweep = getattr(params, sweep_section)
    best_path = best_path or SWEEP_OUT[sweep_section] / "best.json"
    metrics_path = metrics_path or Path(final.out_dir) / "metrics.json"
    reason = _disabled(params, sweep, data_root)
    if reason is not None:
        out = write_disabled(final.out_dir, reason, metrics_path)
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
        if "smallnorb" in metrics:
            line += f", smallnorb test accuracy {metrics['smallnorb']['accuracy']:.4f}"
        click.echo(line)
    click.echo(f"wrote {metrics_path}")
