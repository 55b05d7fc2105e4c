"""Which datasets a DVC stage can reach, so that a dataset's own modules are code deps of
the stages that can load it and of no other.

The dataset registry declares each dataset as one literal ``DatasetSpec("name", "section",
...)`` call whose behaviour hooks are ``"module:attribute"`` strings imported on use. The
import closure (``pipeline.dvc.deps``) follows a hook string only for the datasets its
stage reaches:

- a dataset named in the stage's command line (``capsnet data download smallnorb``);
- a dataset, or one of its evaluation sets, named by a value of a params key the stage
  lists, defaults included (``sweep.dataset``, ``train.extra_datasets``,
  ``evaluate.datasets``): what its params can name;
- every dataset of a ``data.<section>`` whose settings the stage lists (a key other than
  ``enabled``): a stage reads a dataset's settings to load it.

Every other import is followed as before. tests/test_dvc_repro.py checks the rule against
what each stage of a real ``dvc repro`` imported (``capsnet.config.trace``).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The call that declares a dataset (capsnet's dataset registry).
SPEC_CALL = "DatasetSpec"


@dataclass(frozen=True)
class Declared:
    """A dataset as its declaration states it: name, params section, its evaluation sets."""

    name: str
    section: str | None
    sets: frozenset[str]


def _call_name(node: ast.AST) -> str | None:
    func = getattr(node, "func", None)
    return getattr(func, "id", None) or getattr(func, "attr", None)


def spec_calls(tree: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    """(dataset name, call) of each ``DatasetSpec("name", ...)`` in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) == SPEC_CALL and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield first.value, node


def hook_owners(tree: ast.AST) -> dict[int, str]:
    """id(string constant) -> the dataset whose declaration holds it."""
    return {
        id(node): name
        for name, call in spec_calls(tree)
        for node in ast.walk(call)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def _literal(node: ast.AST | None) -> Any:
    try:
        return None if node is None else ast.literal_eval(node)
    except ValueError:
        return None


def declarations(root: Path, packages: Iterable[str]) -> dict[str, Declared]:
    """Every dataset declared in the project's ``packages`` under ``root``, by name."""
    found: dict[str, Declared] = {}
    for package in sorted(packages):
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if f"{SPEC_CALL}(" not in text:
                continue
            for name, call in spec_calls(ast.parse(text, filename=str(path))):
                keywords = {k.arg: k.value for k in call.keywords}
                section = _literal(call.args[1] if len(call.args) > 1 else keywords.get("section"))
                sets = _literal(keywords.get("evaluation")) or ()
                found[name] = Declared(name, section, frozenset({name, *sets}))
    return found


def strings(value: Any) -> Iterator[str]:
    """Every string inside ``value``: dataclass fields, mappings (keys too), sequences."""
    if isinstance(value, str):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from strings(getattr(value, field.name))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings(key)
            yield from strings(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from strings(item)


def named(values: Iterable[Any], declared: dict[str, Declared]) -> set[str]:
    """The datasets that ``values`` name, by their own name or one of their evaluation sets."""
    owner = {s: d.name for d in declared.values() for s in d.sets}
    return {owner[s] for value in values for s in strings(value) if s in owner}


def value_at(params: Any, key: str) -> Any:
    """The value of a dotted params ``key`` in validated ``params`` (None when absent)."""
    for part in key.split("."):
        if isinstance(params, dict):
            params = params.get(part)
        else:
            params = getattr(params, part, None)
    return params


def stage_datasets(
    words: list[str], keys: list[str], params: Any, declared: dict[str, Declared]
) -> frozenset[str]:
    """The datasets a stage running ``capsnet WORDS...`` with params ``keys`` can reach."""
    found = named([words, *(value_at(params, key) for key in keys)], declared)
    for key in keys:
        parts = key.split(".")
        if parts[0] == "data" and len(parts) > 1 and parts[2:3] != ["enabled"]:
            found |= {d.name for d in declared.values() if d.section == parts[1]}
    return frozenset(found)
