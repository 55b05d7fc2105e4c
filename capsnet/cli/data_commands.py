"""``capsnet data download|prepare|show``: thin wrappers over capsnet.data.stages and load."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from capsnet.cli.declared import Command
from capsnet.cli.options import (
    SEED,
    FiniteFloat,
    check_output,
    data_root_option,
    mirror_option,
    output_option_check,
    resolve_mirror,
)
from capsnet.config.dataset_specs import DATASETS
from capsnet.data.stages import DOWNLOADS, PREPARES

PARAMS_HELP = "params.yaml to read (default: ./params.yaml when present, else the defaults)."


def _params(path: Path | None):
    from capsnet.config import load_or_default

    return load_or_default(path)


params_option = click.option(
    "--params",
    "params_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=PARAMS_HELP,
)
root_option = data_root_option("--root")


COMMAND = Command(
    "data",
    "data_group",
    "Download, prepare and look at datasets (the DVC data stages).",
    sections=("data",),
    torch_free_help=False,
)


@click.group("data")
def data_group() -> None:
    """Download, prepare and look at datasets (the DVC data stages)."""


@data_group.command("download")
@click.argument("dataset", type=click.Choice(DOWNLOADS))
@params_option
@root_option
@mirror_option
def download_command(dataset, params_path, data_root, mirror) -> None:
    """Fetch and verify DATASET's raw files into DATA_ROOT/raw/DATASET."""
    from capsnet.data import stages

    check_output(data_root, "--data-root")
    params = _params(params_path)
    mirror = resolve_mirror(mirror, params)
    out = stages.download(dataset, params, data_root, mirror, sys.stderr.isatty())
    click.echo(f"{dataset}: {out}")


@data_group.command("prepare")
@click.argument("dataset", type=click.Choice(PREPARES))
@params_option
@root_option
def prepare_command(dataset, params_path, data_root) -> None:
    """Build DATA_ROOT/prepared/DATASET from the raw files (or the prepared MNIST)."""
    from capsnet.data import stages

    check_output(data_root, "--data-root")
    out = stages.prepare(dataset, _params(params_path), data_root)
    click.echo(f"{dataset}: {out}")


@data_group.command("show")
@click.argument("dataset", type=click.Choice(DATASETS))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    callback=output_option_check("file"),
    help="PNG file to write.",
)
@click.option("--split", default="test", show_default=True)
@click.option("--count", type=click.IntRange(1, 100), default=16, show_default=True)
@click.option("--angle", type=FiniteFloat(), default=None, help="Rotation for rotated-mnist.")
@click.option("--subset", default="all", show_default=True, help="smallnorb viewpoint subset.")
@click.option(
    "--augment",
    "strategy",
    default=None,
    help="Show training augmentation: none, shift, rotate, affine, elastic (settings from params).",
)
@click.option("--seed", type=SEED, default=0, show_default=True)
@params_option
@root_option
def show_command(dataset, out, split, count, angle, subset, strategy, seed, params_path, data_root):
    """Write a grid of DATASET samples with their labels to OUT (PNG)."""
    from capsnet.data.show import show

    params = _params(params_path)
    show(
        dataset,
        out,
        split=split,
        count=count,
        angle=angle,
        subset=subset,
        strategy=strategy,
        seed=seed,
        params=params,
        root=data_root,
        say=click.echo,
    )
    click.echo(f"wrote {out}")
