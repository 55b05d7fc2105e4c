"""Named params profiles: a partial params file under ``profiles/`` laid over params.yaml.

A profile names only the keys it changes, in params.yaml's layout. Mappings merge key by
key; any other value, and a sweep dimension (``{grid: [...]}`` and the other draws),
replaces the value it lands on whole. The merged file is validated by ``capsnet.config``
like params.yaml itself, so a misspelled key fails naming the profile. ``capsnet profile
NAME`` lists the changes; ``--apply`` writes them into the params file with its comments
kept, ready for ``dvc exp run``.
"""

from __future__ import annotations

import copy
import io
import os
from pathlib import Path
from typing import Any

import click

from capsnet.cli_options import params_option, usage_check
from capsnet.config.schema import DISTRIBUTIONS
from capsnet.errors import ConfigError

#: Where named profiles live: the checkout's profiles/ folder.
PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"


def profile_path(name: str | os.PathLike) -> Path:
    """The file of profile ``name``: a path to a YAML file, or ``profiles/<name>.yaml``."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"profile {name}: no such file")
        return path
    found = PROFILES_DIR / f"{name}.yaml"
    if not found.is_file():
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
        raise ConfigError(f"profile {name!r} unknown; choose one of {', '.join(known) or '(none)'}")
    return found


def _replaces_whole(value: Any) -> bool:
    """A profile value that replaces what it lands on: anything but a mapping of settings
    (a sweep dimension {grid: [...]} is one value)."""
    if not isinstance(value, dict):
        return True
    return len(value) == 1 and next(iter(value)) in DISTRIBUTIONS


def changes(profile: dict, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of every setting ``profile`` sets."""
    out: dict[str, Any] = {}
    for key, value in profile.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if _replaces_whole(value) or not value:
            out[dotted] = value
        else:
            out.update(changes(value, dotted))
    return out


def merge(base: dict, profile: dict) -> dict:
    """``base`` with ``profile`` laid over it (a new dict; neither input changes)."""
    merged = copy.deepcopy(base) if base else {}
    for key, value in profile.items():
        current = merged.get(key)
        if (
            isinstance(current, dict)
            and not _replaces_whole(value)
            and not _replaces_whole(current)
        ):
            merged[key] = merge(current, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load(params_path: Path, name: str | os.PathLike):
    """(profile file, {dotted key: value}, validated ``capsnet.config.Params`` of the merge)."""
    from capsnet.config import Params, from_dict
    from capsnet.config.yamlfile import read_yaml

    path = profile_path(name)
    profile = read_yaml(path) or {}
    if not isinstance(profile, dict):
        raise ConfigError(f"{path.name}: expected a mapping of params sections")
    base = read_yaml(params_path) or {}
    merged = merge(base, profile)
    params = from_dict(Params, merged, source=f"{params_path.name} + {path.name}")
    return path, changes(profile), params


def apply(params_path: Path, profile: dict[str, Any]) -> None:
    """Write ``profile``'s settings ({dotted key: value}) into ``params_path``, keeping its
    comments and layout (ruamel.yaml round trip; the file is replaced atomically)."""
    from ruamel.yaml import YAML

    from capsnet.io import atomic_write_text

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 100
    yaml.representer.add_representer(
        type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    document = yaml.load(params_path.read_text(encoding="utf-8"))
    for dotted, value in profile.items():
        *parents, leaf = dotted.split(".")
        node = document
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = _flow(value)
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    atomic_write_text(params_path, buffer.getvalue())


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


@click.command("profile")
@click.argument("name", callback=usage_check(profile_path))
@params_option("the file the profile is laid over")
@click.option(
    "--apply", "write", is_flag=True, help="Write the profile's settings into the params file."
)
def profile_command(name, params_path, write):
    """Check a params profile (profiles/NAME.yaml) against the params file; --apply writes it."""
    from capsnet.config.yamlfile import read_yaml

    path, settings, _params = load(params_path, name)
    current = read_yaml(params_path) or {}
    for dotted, value in settings.items():
        node: Any = current
        for part in dotted.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        mark = "" if node == value else "  (new)" if node is _ABSENT else f"  (was {_shown(node)})"
        click.echo(f"{dotted}: {_shown(value)}{mark}")
    if write:
        apply(params_path, settings)
        click.echo(f"wrote {len(settings)} setting(s) of {path.name} into {params_path}")
    else:
        click.echo(f"{path.name}: valid over {params_path}; --apply writes it")
