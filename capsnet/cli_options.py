"""click options that several ``capsnet`` commands share (click only; no torch import)."""

from __future__ import annotations

from pathlib import Path

import click

MIRROR_HELP = "Dataset mirror (default: $CAPSNET_MIRROR, then data.mirror)."
DATA_ROOT_HELP = "Data directory (default: $CAPSNET_DATA or ./data)."


def params_option(sections: str, default: str | None = "params.yaml"):
    """``--params FILE`` (stored as ``params_path``) for commands reading ``sections``."""
    return click.option(
        "--params",
        "params_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=default,
        show_default=default is not None,
        help=f"The params file ({sections}).",
    )


def data_root_option(name: str = "--data-root", default: str | None = None, help=DATA_ROOT_HELP):
    """The data directory option (``--data-root``; ``--root`` for ``capsnet data``)."""
    return click.option(
        name,
        type=click.Path(file_okay=False, path_type=Path),
        default=default,
        show_default=default is not None,
        help=help,
    )


mirror_option = click.option("--mirror", default=None, help=MIRROR_HELP)
