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
import io
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
    """Lay the profile file ``path`` over ``params_path`` and write the result, keeping its
    comments and layout (ruamel.yaml round trip; the file is replaced atomically). The
    text is written only when it reads back as ``validated``, the Params of the merge."""
    import yaml as pyyaml
    from ruamel.yaml import YAML

    from capsnet.io.files import atomic_write_text

    refuse_unwritable(params_path)
    _base, profile = _read(params_path, path)
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 100
    yaml.representer.add_representer(
        type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    document = yaml.load(params_path.read_text(encoding="utf-8"))
    if document is None:
        document = {}
    lay_over(document, profile, _flow)
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    text = buffer.getvalue()
    if _validate(pyyaml.safe_load(text) or {}, params_path, path) != validated:
        raise ConfigError(
            f"{params_path}: the text --apply would write does not read back as the validated "
            f"merge with {path.name}; nothing written"
        )
    atomic_write_text(params_path, text)


def _flow(value: Any) -> Any:
    """``value`` with its lists and mappings written inline (``{grid: [1, 2]}``), as
    params.yaml writes them."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(value, list):
        seq = CommentedSeq(_flow(v) for v in value)
        seq.fa.set_flow_style()
        return seq
    if isinstance(value, dict):
        mapping = CommentedMap((k, _flow(v)) for k, v in value.items())
        mapping.fa.set_flow_style()
        return mapping
    return value


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
