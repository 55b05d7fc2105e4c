"""The ``capsnet`` command line: one click group that imports each command when it is used.

Each command module declares its command (``COMMAND = Command(...)``), and the group finds
the declarations by reading, not importing, the modules of ``capsnet.cli.declared.PACKAGES``:
``capsnet --help`` and shell completion import neither torch nor the pipeline's libraries,
and nothing in capsnet/ imports pipeline/.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

import click

from capsnet.cli.boundary import user_error, without_temporaries
from capsnet.cli.declared import Command, DeclarationError, discover
from capsnet.cli.lifetime import die_with_dvc
from capsnet.cli.options import dvc_stage
from capsnet.io.errors import CapsnetError

DEBUG_ENV = "CAPSNET_DEBUG"
#: The folder holding capsnet/ (a checkout, or site-packages): the command packages' root.
ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def declared() -> tuple[Command, ...]:
    """Every command, as its module declares it (``capsnet.cli.declared``), found once."""
    from capsnet.config import SECTIONS

    return discover(ROOT, sections=SECTIONS)


def __getattr__(name: str):
    """``DECLARED`` (the discovered commands), ``COMMANDS`` (name -> ``"module:attribute"``)
    and ``SHORT_HELP`` (name -> help line), made on first use so that a broken declaration
    is a one-line error of ``capsnet`` rather than of this import."""
    tables = {
        "DECLARED": declared,
        "COMMANDS": lambda: {c.name: c.target for c in declared()},
        "SHORT_HELP": lambda: {c.name: c.help for c in declared()},
    }
    if name not in tables:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value = tables[name]()
    return value


def _commands() -> dict[str, str]:
    """The module's ``COMMANDS`` (the one table, which tests extend)."""
    return sys.modules[__name__].COMMANDS


def _short_help() -> dict[str, str]:
    """The module's ``SHORT_HELP``."""
    return sys.modules[__name__].SHORT_HELP


#: Optional modules -> the extra that installs them.
EXTRAS = {
    "albumentations": "data",
    "scipy": "data",
    "matplotlib": "data",
    "ray": "pipeline",
    "dvc": "pipeline",
    "wandb": "pipeline",
    "wandb_workspaces": "pipeline",
}


class MissingPart(CapsnetError):
    """A command whose package or optional libraries are not installed."""


def _missing(command: str, exc: ModuleNotFoundError) -> MissingPart | None:
    """The one-line reason ``command`` cannot run without ``exc.name``, or None (a bug)."""
    top = (exc.name or "").split(".")[0]
    if top == "benchmarks":
        return MissingPart(
            f"capsnet {command} needs benchmarks/, which only a source checkout of "
            "capsnet-pipeline has: run it from one"
        )
    if top == "pipeline":
        return MissingPart(
            f"capsnet {command} needs pipeline/: install capsnet-pipeline[pipeline] "
            "from a source checkout (pip install -e '.[pipeline]')"
        )
    if top in EXTRAS:
        return MissingPart(
            f"capsnet {command} needs {top}: pip install 'capsnet-pipeline[{EXTRAS[top]}]'"
        )
    return None


def source_checkout() -> Path | None:
    """The checkout capsnet/ was imported from when it holds benchmarks/, else None."""
    return ROOT if (ROOT / "benchmarks" / "__init__.py").is_file() else None


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        checkout = source_checkout()
        if exc.name != "benchmarks" or checkout is None or str(checkout) in sys.path:
            raise
        sys.path.append(str(checkout))  # editable installs map capsnet/ and pipeline/ only
        return importlib.import_module(name)


def load_command(name: str) -> click.Command:
    """Import the command ``COMMANDS[name]`` names (a one-line error when not installed)."""
    module_name, attribute = _commands()[name].split(":")
    try:
        module = _import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = _missing(name, exc)
        if missing is None:
            raise
        raise missing from None
    return getattr(module, attribute)


class LazyGroup(click.Group):
    """A click group over the declared commands. Every error a user, the file system or the machine
    causes ends as one line on stderr (capsnet.cli.boundary); a bug keeps its traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_commands())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in _commands() else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, _short_help()[name]) for name in self.list_commands(ctx)])

    def shell_complete(self, ctx: click.Context, incomplete: str):
        from click.shell_completion import CompletionItem

        names = [n for n in self.list_commands(ctx) if n.startswith(incomplete)]
        items = [CompletionItem(name, help=_short_help()[name]) for name in names]
        return items + click.Command.shell_complete(self, ctx, incomplete)

    def main(self, args=None, prog_name=None, **extra):
        words = sys.argv[1:] if args is None else [str(a) for a in args]
        if args is None and dvc_stage():
            die_with_dvc()
        try:
            declared()
        except DeclarationError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(1)
        try:
            rv = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
            _finish_params_trace()
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            _fail(f"Error: {exc.format_message()}", exc.exit_code, words)
        except click.exceptions.Abort as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, EOFError):  # click turns any EOFError into Abort
                _fail(f"Error: {user_error(cause, words)}", 1, words)
            _fail("Interrupted.", 130, words)
        except KeyboardInterrupt:
            _fail("Interrupted.", 130, words)
        except CapsnetError as exc:
            _fail(f"Error: {exc}", 1, words)
        except ModuleNotFoundError as exc:
            missing = _missing(_invoked(words), exc)
            if missing is None:
                raise
            _fail(f"Error: {missing}", 1, words)
        except Exception as exc:
            line = user_error(exc, words)
            if line is None:
                raise  # a programming error: its traceback is the report
            _fail(f"Error: {line}", 1, words)
        sys.exit(rv if isinstance(rv, int) else 0)


def _finish_params_trace() -> None:
    """``capsnet.config.trace.finish`` when the command loaded params (a stage whose
    params.yaml changed under it fails here)."""
    trace = sys.modules.get("capsnet.config.trace")
    if trace is not None:
        trace.finish()


def debug_requested(words: list[str]) -> bool:
    """``--debug`` before the command name, or $CAPSNET_DEBUG set to a true value."""
    if os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    command = next((i for i, w in enumerate(words) if w in _commands()), len(words))
    return "--debug" in words[:command]


def _fail(line: str, code: int, words: list[str]) -> NoReturn:
    """Print ``line`` (after the traceback under --debug) and exit with ``code``."""
    if debug_requested(words) and sys.exc_info()[1] is not None:
        traceback.print_exc()
    click.echo(without_temporaries(" ".join(line.splitlines())), err=True)
    sys.exit(code)


def _invoked(words: list[str]) -> str:
    """The command name in ``words``."""
    return next((w for w in words if w in _commands()), "")


@click.group(cls=LazyGroup)
@click.version_option(package_name="capsnet-pipeline")
@click.option(
    "--debug",
    is_flag=True,
    help=f"Show the traceback of every error before its one-line message (also ${DEBUG_ENV}=1).",
)
def main(debug: bool) -> None:
    """Capsule networks: train, evaluate and benchmark models, prepare data.

    Errors end as one line on stderr: exit 2 for a usage error, 1 for anything else,
    130 for Ctrl+C."""
