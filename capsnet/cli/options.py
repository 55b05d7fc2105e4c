"""click options that several ``capsnet`` commands share, and where their defaults come from.

Every default is read from a params dataclass (capsnet.config) or from
capsnet.config.training.TrainConfig; the data root and the mirror are resolved here, once, and the
library receives plain values. Only click and the torch-free config are imported, so
``--help`` stays fast.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections.abc import Iterable
from pathlib import Path

import click

from capsnet.config.data import DATA_ROOT
from capsnet.io.errors import ConfigError

DATA_ENV = "CAPSNET_DATA"
MIRROR_ENV = "CAPSNET_MIRROR"
#: Set by DVC (3.x) for every stage command it runs: the stage's address.
STAGE_ENV = "DVC_STAGE"
#: The only command that may fetch from a mirror inside a DVC stage: it verifies every
#: file by its MD5, so the mirror cannot change what it writes.
FETCHING_COMMANDS = ("download",)


def dvc_stage() -> str | None:
    """The DVC stage this process runs in (DVC sets $DVC_STAGE), or None."""
    return os.environ.get(STAGE_ENV) or None


#: Largest count (epochs, batch size, image limits) an option accepts: torch indexes with
#: 64-bit integers, so a bounded count never overflows in it.
MAX_COUNT = 2**31 - 1
#: Seeds: numpy's range, which the augmentation draws use.
SEED = click.IntRange(0, 2**32 - 1)


def count(low: int = 1, high: int = MAX_COUNT) -> click.IntRange:
    """A count option's type: ``low <= n <= high``."""
    return click.IntRange(low, high)


def field_default(cls, name: str):
    """The default of dataclass ``cls``'s field ``name`` (default_factory called)."""
    for item in dataclasses.fields(cls):
        if item.name == name:
            if item.default_factory is not dataclasses.MISSING:
                return item.default_factory()
            return item.default
    raise AttributeError(f"{cls.__name__} has no field {name!r}")


def train_default(name: str) -> dict:
    """``default`` and ``show_default`` of an option that defaults to TrainConfig's field
    ``name`` (capsnet.config.training: no torch, so --help stays fast)."""
    from capsnet.config.training import TrainConfig

    return {"default": field_default(TrainConfig, name), "show_default": True}


def format_floats(values, sep: str = ",") -> str:
    """``(0.0, 15.0)`` -> ``"0,15"``, the form list options are written in."""
    return sep.join(f"{v:g}" for v in values)


class FiniteFloat(click.ParamType):
    """A float that refuses nan and inf; optionally ``low <= x`` (``low < x`` when
    ``low_open``) and ``x <= high``."""

    name = "float"

    def __init__(self, low: float | None = None, high: float | None = None, low_open=False):
        self.low, self.high, self.low_open = low, high, low_open

    def convert(self, value, param, ctx) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        low, high = self.low, self.high
        if low is not None and (number < low or (self.low_open and number == low)):
            self.fail(f"{number:g} is not {'>' if self.low_open else '>='} {low:g}", param, ctx)
        if high is not None and number > high:
            self.fail(f"{number:g} is not <= {high:g}", param, ctx)
        return number


class FloatList(click.ParamType):
    """Comma-separated numbers (``0,15,30``), each checked by a FiniteFloat -> a tuple."""

    name = "floats"

    def __init__(self, element: FiniteFloat | None = None):
        self.element = element or FiniteFloat()

    def convert(self, value, param, ctx) -> tuple[float, ...]:
        items = value if isinstance(value, (tuple, list)) else str(value).split(",")
        items = [item for item in items if str(item).strip()]
        if not items:
            self.fail("no numbers given", param, ctx)
        return tuple(self.element.convert(item, param, ctx) for item in items)


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


class _FirstNameOption(click.Option):
    """An option whose later names still work but only the first shows in ``--help``."""

    def get_help_record(self, ctx):
        shown = copy.copy(self)
        shown.opts = self.opts[:1]
        return click.Option.get_help_record(shown, ctx)


def data_root_option(*old_names: str, help: str = "Data directory."):
    """``--data-root`` (also ``$CAPSNET_DATA``; default ``data``); ``old_names`` (e.g.
    ``--root``) are accepted and not shown."""
    return click.option(
        "--data-root",
        *old_names,
        "data_root",
        cls=_FirstNameOption,
        type=click.Path(file_okay=False, path_type=Path),
        envvar=DATA_ENV,
        show_envvar=True,
        default=DATA_ROOT,
        show_default=True,
        callback=_data_root_check,
        help=help,
    )


def _from_environment(ctx: click.Context, param: click.Parameter) -> bool:
    return ctx.get_parameter_source(param.name) == click.core.ParameterSource.ENVIRONMENT


def _data_root_check(ctx: click.Context, param: click.Parameter, value):
    """A data root that is a file or lies under one can be neither read nor made; inside a
    DVC stage it comes from the stage's command, never from $CAPSNET_DATA."""
    stage = dvc_stage()
    if stage and _from_environment(ctx, param):
        if os.path.abspath(value) != os.path.abspath(param.default):
            raise click.UsageError(
                f"${DATA_ENV}={value} is set inside DVC stage {stage}: a stage reads only the "
                f"data dvc.yaml tracks; unset {DATA_ENV} (or pass --data-root in the stage's cmd)"
            )
    if value is not None:
        existing = Path(os.path.abspath(value))
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise click.BadParameter(
                f"{value}: {existing} is a file, not a directory", param_hint="'--data-root'"
            )
    return value


def _fetches_nothing(ctx: click.Context | None) -> bool:
    """Whether the running command, inside a DVC stage, must read only tracked data."""
    return bool(dvc_stage()) and (ctx is None or ctx.command.name not in FETCHING_COMMANDS)


mirror_option = click.option(
    "--mirror",
    envvar=MIRROR_ENV,
    show_envvar=True,
    default=None,
    callback=lambda ctx, param, value: None if _fetches_nothing(ctx) else value,
    help="Dataset mirror: a directory or URL prefix tried before the official hosts "
    "(else data.mirror where a params file is read).",
)


def resolve_mirror(mirror: str | None, params=None) -> str | None:
    """The mirror a command uses: ``--mirror`` / $CAPSNET_MIRROR, else ``data.mirror`` of
    ``params`` (a config.Params), else None (the official hosts only). Inside a DVC stage
    only ``data download`` uses one; every other stage reads the data its deps track and
    fetches nothing."""
    if _fetches_nothing(click.get_current_context(silent=True)):
        return None
    if mirror:
        return mirror
    return (params.data.mirror if params is not None else "") or None


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


#: How a command writes an output path: "file" (a file renamed into place), "dir" (a
#: directory swapped in whole from a sibling) or "root" (a directory written inside).
OUTPUT_KINDS = ("file", "dir", "root")


def output_problem(path: str | os.PathLike, kind: str = "root") -> str | None:
    """Why ``path`` cannot be written as a ``kind`` output (OUTPUT_KINDS), or None.

    Checked before any work: names too long, the path's type, a file among its parents,
    and write permission (or a read-only file system) where the new entries are created."""
    path = Path(os.path.abspath(path))
    limit = _name_max(Path(path.anchor))
    if any(len(os.fsencode(part)) > limit for part in path.parts):
        return f"a name in it is longer than {limit} bytes; use a shorter path"
    try:
        return _placement_problem(path, kind)
    except OSError as exc:
        return f"cannot be checked ({exc.strerror or exc})"


#: File systems that hold kernel objects, not files: nothing is ever written there.
PSEUDO_FILE_SYSTEMS = frozenset(
    "proc sysfs devtmpfs devpts cgroup cgroup2 debugfs tracefs securityfs configfs bpf "
    "pstore efivarfs mqueue fusectl binfmt_misc autofs hugetlbfs".split()
)


def file_system_type(path: str | os.PathLike) -> str | None:
    """The type of the file system holding the existing ``path`` (Linux mountinfo: the
    longest mount point above it), or None where that cannot be read."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in lines:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = parts[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, rest.split()[0]
    return kind


def _placement_problem(path: Path, kind: str) -> str | None:
    from capsnet.io.files import special_kind

    if path.exists():
        if kind != "file" and not path.is_dir():
            return "exists and is not a directory"
        if kind == "file" and path.is_dir():
            return "is a directory; give the path of a file"
        special = special_kind(path)
        if special is not None:
            return f"is {special}, not a regular file; write the output elsewhere"
    existing = path if kind == "root" and path.is_dir() else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory; choose a path that is not under a file"
    fs_type = file_system_type(existing)
    if fs_type in PSEUDO_FILE_SYSTEMS:
        return f"{existing} is on the kernel's {fs_type} file system, which holds no files"
    if not os.access(existing, os.W_OK | os.X_OK):
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            return f"{existing} is on a read-only file system; write elsewhere"
        return f"{existing} is not writable; choose a path you may write"
    return None


def check_output(
    path: str | os.PathLike, name: str, kind: str = "root", own: Iterable[str] | None = None
) -> None:
    """Refuse an output ``path`` before any work: a usage error naming the option ``name``
    (``--out``), or a ConfigError naming the params key (``params.yaml: train.out_dir``).
    ``own``: ``path`` is a directory replaced whole, holding only these patterns
    (``capsnet.io.outputset.check_owned``)."""
    problem = output_problem(path, kind)
    if problem is None and own is not None:
        from capsnet.io.errors import CapsnetError
        from capsnet.io.outputset import check_owned

        try:
            check_owned(path, own)
        except CapsnetError as exc:
            problem = str(exc).removeprefix(f"{path} ")
    if problem is None:
        return
    if name.startswith("--"):
        raise click.BadParameter(f"{path}: {problem}", param_hint=f"'{name}'")
    raise ConfigError(f"{name}: {path}: {problem}")


def output_option_check(kind: str = "root"):
    """A click callback that runs ``check_output`` on an option's value (None passes)."""

    def callback(ctx: click.Context, param: click.Parameter, value):
        if value is not None:
            check_output(value, param.opts[0], kind)
        return value

    return callback


def usage_check(check):
    """A click callback that runs ``check(value)`` on a parameter's value (None passes); the
    ConfigError it raises becomes a usage error naming the parameter (exit 2)."""

    def callback(ctx: click.Context, param: click.Parameter, value):
        if value is not None:
            try:
                check(value)
            except ConfigError as exc:
                raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
        return value

    return callback
