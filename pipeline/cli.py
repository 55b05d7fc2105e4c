"""``capsnet sweep`` and ``capsnet train-final``: thin click commands over pipeline.tune
and pipeline.train_final. capsnet/cli.py attaches them lazily, so ``capsnet`` runs where
Ray and W&B are not installed."""

from __future__ import annotations

from pathlib import Path

import click

PARAMS_OPTION = click.option(
    "--params",
    "params_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default="params.yaml",
    show_default=True,
    help="The params file (sections sweep, train).",
)
DATA_ROOT_OPTION = click.option(
    "--data-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Data directory (default: $CAPSNET_DATA or ./data).",
)
MIRROR_OPTION = click.option(
    "--mirror", default=None, help="Dataset mirror (default: $CAPSNET_MIRROR, data.mirror)."
)


def _load(params_path: Path):
    from capsnet import config

    return config.load(params_path)


@click.command("sweep")
@PARAMS_OPTION
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
    default=Path("sweep"),
    show_default=True,
    help="Directory for results.csv, best.json and plots/.",
)
@click.option(
    "--num-cpus",
    type=click.IntRange(min=1),
    default=None,
    help="CPUs of a local Ray instance (default: all).",
)
@DATA_ROOT_OPTION
@MIRROR_OPTION
def sweep_command(params_path, address, out_dir, num_cpus, data_root, mirror):
    """Run the Ray Tune sweep of params.yaml ``sweep`` (resuming an interrupted one)."""
    from pipeline.tune import run_sweep

    params = _load(params_path)
    outcome = run_sweep(
        params.sweep,
        out_dir=out_dir,
        data_root=data_root,
        mirror=params.data.resolved_mirror(mirror),
        address=address,
        num_cpus=num_cpus,
        augment_params=params.augment,
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


@click.command("train-final")
@PARAMS_OPTION
@click.option(
    "--best",
    "best_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("sweep/best.json"),
    show_default=True,
    help="The sweep's best config.",
)
@click.option(
    "--metrics",
    "metrics_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the final metrics as JSON here (default: <train.out_dir>/metrics.json).",
)
@DATA_ROOT_OPTION
@MIRROR_OPTION
def train_final_command(params_path, best_path, metrics_path, data_root, mirror):
    """Train the best sweep config and the baselines; write <train.out_dir>/<model>.pt."""
    from pipeline.train_final import train_final

    params = _load(params_path)
    metrics_path = metrics_path or Path(params.train.out_dir) / "metrics.json"
    results = train_final(
        params.train,
        params.sweep,
        best_path=best_path,
        data_root=data_root,
        mirror=params.data.resolved_mirror(mirror),
        augment_params=params.augment,
        metrics_path=metrics_path,
        log=lambda line: click.echo(line, err=True),
    )
    for name, metrics in results.items():
        val = metrics.get("val_accuracy")
        click.echo(f"{name}: val accuracy " + (f"{val:.4f}" if val is not None else "n/a"))
    click.echo(f"wrote {metrics_path}")
