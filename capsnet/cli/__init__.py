"""The ``capsnet`` command line: one click group that imports each command when it is used.

Commands are named by ``"module:attribute"`` strings, so ``capsnet --help`` and shell
completion import neither torch nor the pipeline's libraries, and nothing in capsnet/
imports pipeline/: the strings in ``DECLARED`` are its only mention.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import click

from capsnet.cli.boundary import user_error, without_temporaries
from capsnet.cli.lifetime import die_with_dvc
from capsnet.cli.options import dvc_stage
from capsnet.io.errors import CapsnetError

DEBUG_ENV = "CAPSNET_DEBUG"


@dataclass(frozen=True)
class Command:
    """One ``capsnet`` command: its name, its click command as ``"module:attribute"``
    (imported on use), the line ``capsnet --help`` lists (tests/test_walls.py holds it to the
    command's short help), and for a DVC stage command the params sections it reads and
    the dvc.yaml stages that run it (the data stages are the dataset registry's)."""

    name: str
    target: str
    help: str
    sections: tuple[str, ...] = ()
    stages: tuple[str, ...] = ()
    torch_free_help: bool = True  # ``capsnet NAME --help`` imports no torch


#: Every command, declared once: the group, its help, tests/test_walls.py,
#: pipeline/dvc_deps.py (which reads this literal without importing) and the docs test
#: read it. A new stage adds one entry here (docs/pipeline.md, "Adding a stage").
DECLARED: tuple[Command, ...] = (
    Command("bench", "benchmarks.throughput:throughput_command",
            "Throughput of a capsule model against its naive reference and the conv ceiling.",
            torch_free_help=False),
    Command("data", "capsnet.cli.data_commands:data_group",
            "Download, prepare and look at datasets (the DVC data stages).",
            sections=("data",), torch_free_help=False),
    Command("eval", "capsnet.cli.eval_commands:eval_command",
            "Evaluate CHECKPOINT(s) side by side on the chosen test sets."),
    Command("evaluate-stage", "capsnet.cli.eval_commands:evaluate_stage_command",
            "The DVC evaluate stage: every checkpoint in evaluate.models_dir -> "
            "evaluate.out_dir.", sections=("evaluate",), stages=("evaluate",)),
    Command("models", "capsnet.cli.train_commands:models_command",
            "List the registered models with their parameter counts."),
    Command("profile", "pipeline.profile:profile_command",
            "Check a params profile (profiles/NAME.yaml) against the params file; --apply "
            "writes it."),
    Command("publish", "pipeline.publish:publish_command",
            "report.html, results.md and W&B eval runs; with --readme the README's table.",
            sections=("publish",), stages=("publish",)),
    Command("sweep", "pipeline.sweep_cli:sweep_command",
            "Run the Ray Tune sweep of a params section (resuming an interrupted one).",
            sections=("sweep", "smallnorb_sweep"), stages=("sweep", "sweep_smallnorb")),
    Command("train", "capsnet.cli.train_commands:train_command",
            "Train a model; write OUT/model.pt and OUT/metrics.json (test accuracy included)."),
    Command("train-final", "pipeline.train_final_cli:train_final_command",
            "Train the best sweep config and the baselines; write <out_dir>/<model>.pt.",
            sections=("train", "smallnorb_train"), stages=("train", "train_smallnorb")),
    Command("viewpoints", "pipeline.viewpoints_cli:viewpoints_command",
            "Train capsules and the CNN on familiar smallNORB viewpoints; compare them on "
            "novel viewpoints at matched familiar error -> viewpoints.out_dir.",
            sections=("viewpoints",), stages=("viewpoints",)),
)  # fmt: skip

#: Command name -> ``"module:attribute"`` and -> its help line, from ``DECLARED``.
COMMANDS: dict[str, str] = {c.name: c.target for c in DECLARED}
SHORT_HELP: dict[str, str] = {c.name: c.help for c in DECLARED}

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
    root = Path(__file__).resolve().parents[2]
    return root if (root / "benchmarks" / "__init__.py").is_file() else None


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
    module_name, attribute = COMMANDS[name].split(":")
    try:
        module = _import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = _missing(name, exc)
        if missing is None:
            raise
        raise missing from None
    return getattr(module, attribute)


class LazyGroup(click.Group):
    """A click group over ``COMMANDS``. Every error a user, the file system or the machine
    causes ends as one line on stderr (capsnet.cli.boundary); a bug keeps its traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, SHORT_HELP[name]) for name in self.list_commands(ctx)])

    def shell_complete(self, ctx: click.Context, incomplete: str):
        from click.shell_completion import CompletionItem

        names = [n for n in self.list_commands(ctx) if n.startswith(incomplete)]
        items = [CompletionItem(name, help=SHORT_HELP[name]) for name in names]
        return items + click.Command.shell_complete(self, ctx, incomplete)

    def main(self, args=None, prog_name=None, **extra):
        words = sys.argv[1:] if args is None else [str(a) for a in args]
        if args is None and dvc_stage():
            die_with_dvc()
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
    command = next((i for i, w in enumerate(words) if w in COMMANDS), len(words))
    return "--debug" in words[:command]


def _fail(line: str, code: int, words: list[str]) -> NoReturn:
    """Print ``line`` (after the traceback under --debug) and exit with ``code``."""
    if debug_requested(words) and sys.exc_info()[1] is not None:
        traceback.print_exc()
    click.echo(without_temporaries(" ".join(line.splitlines())), err=True)
    sys.exit(code)


def _invoked(words: list[str]) -> str:
    """The command name in ``words``."""
    return next((w for w in words if w in COMMANDS), "")


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
