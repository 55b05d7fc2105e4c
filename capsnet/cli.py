"""The ``capsnet`` command line (click)."""

from __future__ import annotations

import sys

import click

from capsnet.errors import CapsnetError


class CapsnetGroup(click.Group):
    """A click group whose user errors end as one line on stderr, never a traceback."""

    def main(self, args=None, prog_name=None, **extra):
        try:
            rv = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"Error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)
        except CapsnetError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=CapsnetGroup)
@click.version_option(package_name="capsnet-pipeline")
def main() -> None:
    """Capsule networks: train, evaluate and benchmark models, prepare data."""


@main.command(
    "bench",
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_command(args) -> None:
    """Throughput benchmark (benchmarks/throughput.py; `capsnet bench --help` for options)."""
    from capsnet import bench

    code = bench.main(list(args))
    if code:
        sys.exit(code)


def _register_lazy_groups() -> None:
    """Attach commands that live beside the code they drive. Commands of pipeline/ (Ray,
    W&B) import those libraries only when run, so `capsnet` works with torch alone."""
    from capsnet.train_cli import models_command, train_command

    main.add_command(models_command)
    main.add_command(train_command)
    from capsnet.eval_cli import eval_command, evaluate_stage_command

    main.add_command(eval_command)
    main.add_command(evaluate_stage_command)
    from capsnet.viewpoints_cli import viewpoints_command

    main.add_command(viewpoints_command)
    try:
        from capsnet.data.cli import data_group
    except ModuleNotFoundError as exc:  # the data extras are optional
        if exc.name not in ("albumentations", "scipy", "matplotlib", "yaml"):
            raise
    else:
        main.add_command(data_group)
    try:
        from pipeline.cli import sweep_command, train_final_command
        from pipeline.publish import publish_command
    except ModuleNotFoundError as exc:  # pipeline/ is not installed beside capsnet/
        if exc.name not in ("pipeline", "pipeline.cli", "pipeline.publish"):
            raise
    else:
        main.add_command(sweep_command)
        main.add_command(train_final_command)
        main.add_command(publish_command)


_register_lazy_groups()
