"""Named params profiles: a partial params file under ``profiles/`` laid over params.yaml.

A profile names only the keys it changes, in params.yaml's layout. Mappings merge key by
key; any other value, and a sweep dimension (``{grid: [...]}`` and the other draws),
replaces the value it lands on whole. The merged file is validated by ``capsnet.config``
like params.yaml itself, so a misspelled key fails naming the profile. ``capsnet profile
NAME`` lists the changes; ``--apply`` writes them into the params file with its comments
kept, ready for ``dvc exp run``: exactly the merge that was validated, checked again on
the text about to be written.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import click

from capsnet.cli.declared import Command
from capsnet.cli.options import params_option, usage_check
from capsnet.config.schema import DISTRIBUTIONS
from capsnet.io.errors import CapsnetError, ConfigError
from capsnet.io.files import check_input

#: Where named profiles live: profiles/ of the repository being worked in (the working
#: directory, where params.yaml and dvc.yaml are).
PROFILES_DIR = Path("profiles")
#: A profile name: one file name in PROFILES_DIR, without its .yaml.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def profile_path(name: str | os.PathLike) -> Path:
    """The file of profile ``name``: a path to a YAML file, or ``profiles/<name>.yaml`` for a
    plain name, which never leads outside profiles/ (no ``/``, ``..`` or link out)."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        check_input(path, ConfigError)
        return path
    directory = PROFILES_DIR.resolve()
    found = directory / f"{name}.yaml"
    if not NAME.fullmatch(str(name)) or ".." in str(name):
        raise ConfigError(
            f"profile {str(name)!r}: not a profile name (letters, digits, '.', '_', '-'; "
            f"the profiles are {directory}/NAME.yaml); give a path ending in .yaml for a "
            "file elsewhere"
        )
    if not found.exists():
        known = sorted(p.stem for p in directory.glob("*.yaml"))
        raise ConfigError(f"profile {name!r} unknown; choose one of {', '.join(known) or '(none)'}")
    if not found.resolve().is_relative_to(directory):
        raise ConfigError(f"{found}: links to {found.resolve()}, outside {directory}; not read")
    check_input(found, ConfigError)
    return found


def _replaces_whole(value: Any) -> bool:
    """A profile value that replaces what it lands on: anything but a mapping of settings
    (a sweep dimension {grid: [...]} is one value)."""
    if not isinstance(value, dict):
        return True
    return len(value) == 1 and next(iter(value)) in DISTRIBUTIONS


def _merges(current: Any, value: Any) -> bool:
    """Whether ``value`` merges key by key into ``current`` rather than replacing it."""
    return isinstance(current, dict) and not _replaces_whole(value) and not _replaces_whole(current)


def changes(profile: dict, base: Any = None, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of every setting ``profile`` sets over ``base`` (an empty mapping
    laid over a mapping sets nothing)."""
    out: dict[str, Any] = {}
    for key, value in profile.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        current = base.get(key) if isinstance(base, dict) else None
        if _merges(current, value) or (value and not _replaces_whole(value)):
            out.update(changes(value, current, dotted))
        else:
            out[dotted] = value
    return out


def lay_over(target: dict, profile: dict, convert=copy.deepcopy) -> dict:
    """Lay ``profile`` over the mapping ``target`` in place (each value placed as
    ``convert(value)``); returns ``target``. ``merge`` and ``apply`` both use it."""
    for key, value in profile.items():
        if _merges(target.get(key), value):
            lay_over(target[key], value, convert)
        else:
            target[key] = convert(value)
    return target


def merge(base: dict, profile: dict) -> dict:
    """``base`` with ``profile`` laid over it (a new dict; neither input changes)."""
    return lay_over(copy.deepcopy(base) if base else {}, profile)


def _read(params_path: Path, path: Path) -> tuple[dict, dict]:
    """(params, profile) as mappings."""
    from capsnet.config.yamlfile import read_yaml

    profile = read_yaml(path) or {}
    if not isinstance(profile, dict):
        raise ConfigError(f"{path.name}: expected a mapping of params sections")
    base = read_yaml(params_path) or {}
    if not isinstance(base, dict):
        raise ConfigError(f"{params_path.name}: expected a mapping of params sections")
    return base, profile


def _validate(merged: dict, params_path: Path, path: Path):
    from capsnet.config import Params, from_dict

    return from_dict(Params, merged, source=f"{params_path.name} + {path.name}")


def load(params_path: Path, name: str | os.PathLike):
    """(profile file, {dotted key: value}, validated ``capsnet.config.Params`` of the merge)."""
    path = profile_path(name)
    base, profile = _read(params_path, path)
    params = _validate(merge(base, profile), params_path, path)
    return path, changes(profile, base), params


def refuse_unwritable(params_path: Path) -> None:
    """ConfigError before anything is written when ``--apply`` would replace what it must
    not: a read-only params file (``capsnet.io.outputset``) or a symbolic link, which the
    atomic rename would turn into a plain file and leave its target as it was."""
    from capsnet.io.files import refuse_read_only

    if params_path.is_symlink():
        raise ConfigError(
            f"{params_path}: a symbolic link to {params_path.resolve()}; --apply would replace "
            "the link by a file: give that file as --params"
        )
    try:
        refuse_read_only(params_path)
    except CapsnetError as exc:
        raise ConfigError(str(exc)) from None


def apply(params_path: Path, path: Path, validated) -> None:
    """Lay the profile file ``path`` over ``params_path`` and write the result
    (``edit_text``: only the lines of the settings the profile sets change, each without the
    comment that described its old value; the file is replaced atomically). The text is
    written only when it reads back as ``validated``, the Params of the merge."""
    import yaml as pyyaml

    from capsnet.io.files import atomic_write_text

    refuse_unwritable(params_path)
    _base, profile = _read(params_path, path)
    text = edit_text(params_path.read_text(encoding="utf-8"), profile, path.name)
    if _validate(pyyaml.safe_load(text) or {}, params_path, path) != validated:
        raise ConfigError(
            f"{params_path}: the text --apply would write does not read back as the validated "
            f"merge with {path.name}; nothing written"
        )
    atomic_write_text(params_path, text)


def edit_text(text: str, profile: dict, source: str) -> str:
    """``text`` (a params file) with ``profile`` laid over it line by line: the line of each
    setting the profile sets is rewritten (its value inline, as params.yaml writes values,
    and ``# from <source>`` where its comment was: a comment about the old value would now
    contradict it, so it goes, its continuation lines too), a new setting is added after its
    section's last line, and every other line is left byte for byte."""
    from ruamel.yaml import YAML

    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    document = YAML().load(text)
    edits: list[tuple[int, int, list[str]]] = []  # (first line, end line, replacement)
    if document is None:
        edits.append((len(lines), len(lines), _new_lines(profile, 0, source)))
    else:
        _edits(document, profile, lines, source, edits)
    order = sorted(range(len(edits)), key=lambda i: (edits[i][0], i), reverse=True)
    for first, last, new in (edits[i] for i in order):  # from the end: earlier lines stay put
        lines[first:last] = new
    return "".join(lines)


def _edits(node, profile: dict, lines: list[str], source: str, edits: list) -> None:
    """The edits laying ``profile`` over the block mapping ``node`` (ruamel, with lines)."""
    keys = list(node)
    for key, value in profile.items():
        if key not in node:
            column = node.lc.key(keys[0])[1] if keys else 0
            last = _span_end(lines, *node.lc.key(keys[-1])) if keys else len(lines)
            while last > 0 and not lines[last - 1].strip():
                last -= 1  # after the section's last line, before the blank lines after it
            edits.append((last, last, _new_lines({key: value}, column, source)))
            continue
        current = node[key]
        if _merges(current, value) and not _is_flow(current):
            _edits(current, value, lines, source, edits)
            continue
        if _merges(current, value):  # a flow mapping: rewritten whole, merged
            value = lay_over(_plain(current), value)
        if _inline(_plain(current)) == _inline(value):
            continue  # the value it has: the line and its comment stay
        line, column = node.lc.key(key)
        end = _span_end(lines, line, column)
        edits.append((line, end, [_line(key, value, column, source, lines[line])]))


def _is_flow(node) -> bool:
    fa = getattr(node, "fa", None)
    return bool(fa is not None and fa.flow_style())


def _plain(node) -> Any:
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    for kind in (bool, int, float, str):  # ruamel's scalar subclasses (ScalarFloat, ...)
        if isinstance(node, kind):
            return kind(node)
    return node


def _span_end(lines: list[str], line: int, column: int) -> int:
    """The line after the setting whose key is at (``line``, ``column``): its block value
    and its comment's continuation lines (lines indented deeper) included."""
    end = line + 1
    while end < len(lines):
        stripped = lines[end].lstrip(" ")
        indent = len(lines[end]) - len(stripped)
        item = indent == column and stripped.startswith("- ")  # a block list at its key's column
        if not stripped.strip() or (indent <= column and not item):
            break
        end += 1
    return end


def _inline(value: Any) -> str:
    """``value`` as a params.yaml value on one line: ``null``, ``0.25``, ``{grid: [1, 2]}``."""
    import yaml as pyyaml

    text = pyyaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
    return text.strip().removesuffix("...").strip()


def _line(key: str, value: Any, column: int, source: str, old: str) -> str:
    """The rewritten line of setting ``key``: its comment, if it had one, replaced by
    ``# from <source>`` at the same column (or one space after the value)."""
    setting = " " * column + f"{key}: {_inline(value)}"
    at = _comment_column(old)
    if at is None:
        return setting + "\n"
    return setting.ljust(at - 1) + f" # from {source}\n"


def _comment_column(line: str) -> int | None:
    """Where the comment of a ``key: value  # comment`` line starts (None: it has none)."""
    import yaml as pyyaml

    position = line.find(" #")
    while position != -1:
        try:
            pyyaml.safe_load(line[:position])
            return position + 1
        except pyyaml.YAMLError:  # the '#' is inside a quoted value
            position = line.find(" #", position + 1)
    return None


def _new_lines(settings: dict, column: int, source: str) -> list[str]:
    """Lines adding ``settings`` at ``column``: a section of settings as a block, any other
    value inline, each with ``# from <source>``."""
    out = []
    for key, value in settings.items():
        if isinstance(value, dict) and value and not _replaces_whole(value):
            out += [" " * column + f"{key}:\n", *_new_lines(value, column + 2, source)]
        else:
            out.append(" " * column + f"{key}: {_inline(value)}  # from {source}\n")
    return out


_ABSENT = object()


def _shown(value: Any) -> str:
    import json

    return json.dumps(value)


COMMAND = Command(
    "profile",
    "profile_command",
    "Check a params profile (profiles/NAME.yaml) against the params file; --apply writes it.",
)


@click.command("profile")
@click.argument("name", callback=usage_check(profile_path))
@params_option("the file the profile is laid over")
@click.option(
    "--apply", "write", is_flag=True, help="Write the profile's settings into the params file."
)
def profile_command(name, params_path, write):
    """Check a params profile (profiles/NAME.yaml) against the params file; --apply writes it."""
    from capsnet.config.yamlfile import read_yaml

    path, settings, params = load(params_path, name)
    if write:
        refuse_unwritable(params_path)
    current = read_yaml(params_path) or {}
    for dotted, value in settings.items():
        node: Any = current
        for part in dotted.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        mark = "" if node == value else "  (new)" if node is _ABSENT else f"  (was {_shown(node)})"
        click.echo(f"{dotted}: {_shown(value)}{mark}")
    if write:
        apply(params_path, path, params)
        click.echo(f"wrote {len(settings)} setting(s) of {path.name} into {params_path}")
    else:
        click.echo(f"{path.name}: valid over {params_path}; --apply writes it")
