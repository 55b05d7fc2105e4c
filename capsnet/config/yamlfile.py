"""Reading a params file: UTF-8 only, valid YAML, no key given twice in one mapping, and a
bounded size once aliases are expanded.

YAML aliases let a few hundred bytes stand for billions of values ("billion laughs"), and
brackets nest without limit; both are measured on the composed node graph, each node once,
before anything is constructed or validated, so a hostile file fails in linear time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capsnet.io.errors import ConfigError

#: Most values (scalars, lists, mappings) a params file may stand for, aliases expanded.
MAX_VALUES = 100_000
#: Deepest nesting of lists and mappings a params file may have.
MAX_DEPTH = 32


def _measure(root, name: str) -> None:
    """ConfigError when ``root`` nests deeper than MAX_DEPTH or, aliases expanded, stands
    for more than MAX_VALUES values. Each node is visited once (iteratively)."""
    import yaml

    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth), aliases expanded
    stack: list[tuple[Any, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node, yaml)
        if not done:
            if id(node) in on_path:
                raise ConfigError(f"{name}: an alias refers to a mapping or list holding it")
            on_path.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            if len(on_path) > MAX_DEPTH + 1:
                raise ConfigError(f"{name}: nested deeper than {MAX_DEPTH} levels")
            continue
        on_path.discard(id(node))
        values = 1 + sum(sizes[id(c)][0] for c in children)
        depth = 1 + max((sizes[id(c)][1] for c in children), default=0)
        if values > MAX_VALUES:
            raise ConfigError(
                f"{name}: its aliases expand to more than {MAX_VALUES} values; "
                "write the settings out instead"
            )
        if depth > MAX_DEPTH + 1:
            raise ConfigError(f"{name}: nested deeper than {MAX_DEPTH} levels")
        sizes[id(node)] = (values, depth)


def _children(node, yaml) -> list:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _duplicate(root, name: str) -> None:
    """The first key given twice in any mapping under ``root``: ConfigError with its line.
    A mapping reached twice through aliases is checked once."""
    import yaml

    seen_nodes: set[int] = set()
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        node, prefix = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], int] = {}  # (tag, key) -> line
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "<complex key>"
                dotted = f"{prefix}.{key}" if prefix else key
                line = key_node.start_mark.line + 1
                if (key_node.tag, key) in seen:
                    first = seen[key_node.tag, key]
                    raise ConfigError(
                        f"{name}: {dotted}: duplicate key on line {line} (first on line {first})"
                    )
                seen[key_node.tag, key] = line
                stack.append((value_node, dotted))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{prefix}[{i}]") for i, item in enumerate(node.value))


def read_yaml(path: Path) -> Any:
    """The data of the YAML file ``path``; a one-line ConfigError for anything unreadable."""
    import yaml

    from capsnet.io.files import check_input

    check_input(path, ConfigError)
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
        _measure(node, path.name)
        _duplicate(node, path.name)
        return loader.construct_document(node)
    except RecursionError:  # the composer recurses once per nesting level
        raise ConfigError(f"{path.name}: nested deeper than {MAX_DEPTH} levels") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path.name}:{where} not valid YAML") from None
    finally:
        loader.dispose()
