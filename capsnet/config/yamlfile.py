"""Reading a params file: UTF-8 only, valid YAML, no key given twice in one mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capsnet.errors import ConfigError


def _duplicate(node, name: str, prefix: str = ""):
    """The first key given twice in any mapping under ``node``: ConfigError with its line."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}  # (tag, key) -> line
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            dotted = f"{prefix}.{key}" if prefix else key
            line = key_node.start_mark.line + 1
            if (key_node.tag, key) in seen:
                first = seen[key_node.tag, key]
                raise ConfigError(
                    f"{name}: {dotted}: duplicate key on line {line} (first on line {first})"
                )
            seen[key_node.tag, key] = line
            _duplicate(value_node, name, dotted)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _duplicate(item, name, f"{prefix}[{i}]")


def read_yaml(path: Path) -> Any:
    """The data of the YAML file ``path``; a one-line ConfigError for anything unreadable."""
    import yaml

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path.name}: line {line}: not UTF-8 text (byte {exc.start})") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _duplicate(node, path.name)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path.name}:{where} not valid YAML") from None
    finally:
        loader.dispose()
