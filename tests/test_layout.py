"""The shape of the code: capsnet/'s layers (no import from a lower layer up to a higher
one, no cycle between subpackages, a top level of at most 8 parts) and the size guides (a
module in capsnet/ or pipeline/ over 450 lines, a function over 60 lines, docstring included,
decorators not, is reported as a warning naming the seam to look for)."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def sources() -> list[Path]:
    return sorted(p for pkg in ("capsnet", "pipeline") for p in (ROOT / pkg).rglob("*.py"))


def long_functions(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {length} lines")
    return found


def test_the_limits_see_every_module():
    names = {p.relative_to(ROOT).as_posix() for p in sources()}
    assert {
        "capsnet/training/run.py",
        "capsnet/cli/__init__.py",
        "pipeline/sweep/stage.py",
    } <= names


class SizeGuidance(UserWarning):
    """A module or function past its size guide: a reason to look for a seam, not a cut."""


def oversized(path: Path, root: Path = ROOT) -> list[str]:
    """What in ``path`` is past the size guides, each with the seam to look for."""
    found = []
    lines = path.read_text().count("\n")
    if lines > MAX_MODULE_LINES:
        found.append(
            f"{path.relative_to(root)}: {lines} lines (guide {MAX_MODULE_LINES}): look for a "
            "concern of its own (a dataset, a stage, a file format, a figure) to give a module"
        )
    found += [
        f"{where} (guide {MAX_FUNCTION_LINES}): look for a step with a name of its own"
        for where in long_functions(path, root)
    ]
    return found


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_module_and_function_sizes_are_guidance(path):
    """Sizes past the guides are reported as warnings (pytest's summary lists them): a
    module is split along a seam, never only to pass a limit."""
    for finding in oversized(path):
        warnings.warn(finding, SizeGuidance, stacklevel=1)


def test_an_oversized_module_is_reported_with_its_seam(tmp_path):
    path = tmp_path / "big.py"
    path.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (finding,) = oversized(path, tmp_path)
    assert finding.startswith(f"big.py: {MAX_MODULE_LINES + 1} lines")
    assert "look for a concern of its own" in finding
    with pytest.warns(SizeGuidance, match="big.py"):
        for finding in oversized(path, tmp_path):
            warnings.warn(finding, SizeGuidance, stacklevel=1)


def test_a_long_function_is_reported(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "long.py"
    path.write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    expected = f"long.py:5 long: {MAX_FUNCTION_LINES + 1} lines"
    assert long_functions(path, tmp_path) == [expected]


def test_the_project_metadata_builds_without_setuptools_deprecations(monkeypatch):
    """`.ci/setup` installs the project: its pyproject.toml draws no deprecation box."""
    import warnings

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)  # the metadata names README.md relative to the project
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_configuration(Distribution(), "pyproject.toml")


#: capsnet's layers from the lowest up (docs/guides/layout.md): a module imports from its
#: own layer or lower ones only. A module belongs to the longest entry its name starts with.
#: The dataset declarations (torch-free, their hooks "module:attribute" strings) live in
#: config, which validates names against them; the dataset code that reads config sits above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("capsnet.io",),  # errors, atomic files, output sets, torch files
    ("capsnet.nn",),  # routing, capsule layers, losses
    ("capsnet.models",),  # the model registry, one module per family, checkpoints
    ("capsnet.config",),  # params.yaml, the only validator
    ("capsnet.data",),  # sources, formats, one module per dataset, augmentation
    ("capsnet.training",),  # RunSpec -> train_run, fit, scoring, device and precision
    ("capsnet.evaluation",),  # checkpoints x datasets -> results, figures
    ("capsnet.cli", "capsnet.__main__"),  # the capsnet group and its commands
    ("pipeline",),  # the DVC stages, Ray Tune, W&B: above the whole library
)
#: capsnet/'s top level holds at most this many parts; __init__.py and __main__.py are the
#: package's own machinery, not parts, and do not count.
MAX_TOP_LEVEL = 8


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages=("capsnet", "pipeline")) -> dict[str, set[str]]:
    """Each module under ``root``'s ``packages`` -> the modules of those packages it imports
    (at any depth: functions, try blocks); ``from a import b`` names module a.b where b is one."""
    paths = sorted(p for pkg in packages for p in (root / pkg).rglob("*.py"))
    modules = {module_name(p, root): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in modules else base)
        graph[name] = {m for m in found if m.split(".")[0] in packages}
    return graph


def layer_of(module: str) -> int | None:
    """The index in LAYERS of ``module``; None for the package root (it imports nothing)."""
    if module == "capsnet":
        return None
    best = max(
        (
            (len(p), i)
            for i, layer in enumerate(LAYERS)
            for p in layer
            if module == p or module.startswith(p + ".")
        ),
        default=None,
    )
    return best[1] if best else -1


def layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    """``a imports b (layer x below y)`` for each import up the layers, and each module
    that no layer holds."""
    found = []
    for module, imports in sorted(graph.items()):
        here = layer_of(module)
        if here == -1:
            found.append(f"{module}: in no layer (add its package to LAYERS)")
            continue
        for target in sorted(imports):
            there = layer_of(target)
            if module == "capsnet" and target.startswith("capsnet."):
                found.append(f"capsnet/__init__.py imports {target}: the root imports nothing")
            elif here is not None and there is not None and there > here:
                found.append(
                    f"{module} imports {target}: layer {LAYERS[here][0]} is below "
                    f"{LAYERS[there][0]}"
                )
    return found


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles between the packages of LAYERS (each module counted in its layer's package)."""
    owner = {}
    for module in graph:
        index = layer_of(module)
        if index is not None and index >= 0:
            owner[module] = max(
                (p for p in LAYERS[index] if module == p or module.startswith(p + ".")), key=len
            )
    edges: dict[str, set[str]] = {}
    for module, imports in graph.items():
        for target in imports:
            if module in owner and target in owner and owner[module] != owner[target]:
                edges.setdefault(owner[module], set()).add(owner[target])
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return cycles


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles between modules: each strongly connected component of ``graph``
    with more than one module (or a module importing itself), sorted; Tarjan's algorithm,
    iterative. Every import counts: under TYPE_CHECKING, in a function, in a try block."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root] & graph.keys())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target] & graph.keys()))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return sorted(found)


def test_no_module_is_in_an_import_cycle():
    """One direction between any two modules of capsnet/, pipeline/ and benchmarks/ (the
    metrics.json dataclasses, then the headline rules that read them; a sweep's errors,
    then the stage and its restore that raise them), counting imports a TYPE_CHECKING
    block or a function hides from the interpreter."""
    packages = ("capsnet", "pipeline", "benchmarks")
    assert module_cycles(import_graph(ROOT, packages=packages)) == []


def test_a_planted_module_cycle_is_found(tmp_path):
    files = {
        "capsnet/__init__.py": "",
        "capsnet/evaluation/__init__.py": "",
        "capsnet/evaluation/results.py": "from capsnet.evaluation import headline\n",
        "capsnet/evaluation/headline.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from capsnet.evaluation.results import Entry\n"
        ),
        "capsnet/evaluation/a.py": "def f():\n    from . import b\n",
        "capsnet/evaluation/b.py": "import capsnet.evaluation.c\n",
        "capsnet/evaluation/c.py": "from capsnet.evaluation.a import f\n",
        "capsnet/evaluation/d.py": "from capsnet.evaluation import a, results\n",
        "capsnet/evaluation/e.py": "from capsnet.evaluation import e\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert module_cycles(import_graph(tmp_path, packages=("capsnet",))) == [
        ["capsnet.evaluation.a", "capsnet.evaluation.b", "capsnet.evaluation.c"],
        ["capsnet.evaluation.e"],
        ["capsnet.evaluation.headline", "capsnet.evaluation.results"],
    ]


def top_level_parts(package: Path) -> list[str]:
    return sorted(
        p.name
        for p in package.iterdir()
        if p.name not in ("__init__.py", "__main__.py", "__pycache__")
        and not p.name.startswith(".")
    )


def test_capsnet_imports_only_down_its_layers_and_has_no_package_cycle():
    graph = import_graph(ROOT)
    assert layer_breaches(graph) == []
    assert package_cycles(graph) == []


def test_capsnet_top_level_shows_its_parts():
    parts = top_level_parts(ROOT / "capsnet")
    assert len(parts) <= MAX_TOP_LEVEL, parts
    assert [p for p in parts if not (ROOT / "capsnet" / p / "__init__.py").is_file()] == []


def test_an_upward_import_a_cycle_and_an_unlayered_package_are_reported(tmp_path):
    files = {
        "capsnet/__init__.py": "",
        "capsnet/io/__init__.py": "from capsnet.training import fit\n",
        "capsnet/training/__init__.py": "",
        "capsnet/training/fit.py": "def f():\n    from capsnet.io import errors\n",
        "capsnet/io/errors.py": "",
        "capsnet/extra/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, packages=("capsnet",))
    assert layer_breaches(graph) == [
        "capsnet.extra: in no layer (add its package to LAYERS)",
        "capsnet.io imports capsnet.training.fit: layer capsnet.io is below capsnet.training",
    ]
    assert package_cycles(graph) == [["capsnet.io", "capsnet.training", "capsnet.io"]]
    (tmp_path / "capsnet" / "loose.py").write_text("")
    assert top_level_parts(tmp_path / "capsnet") == ["extra", "io", "loose.py", "training"]


@pytest.mark.parametrize(
    "statement, new",
    [
        ("import capsnet.routing", "capsnet.nn.routing"),
        ("from capsnet.routing import em_routing", "capsnet.nn.routing"),
        ("from capsnet import checkpoint", "capsnet.models.checkpoint"),
        ("from capsnet.checkpoint import save", "capsnet.models.checkpoint"),
        ("import capsnet.evaluation.metrics", "capsnet.evaluation.results"),
        ("from capsnet.evaluation import metrics", "capsnet.evaluation.results"),
    ],
)
def test_an_old_import_path_fails_naming_the_new_one(statement, new):
    """A moved module is no silent alias: its old path fails with a note where it went."""
    with pytest.raises(ImportError, match=rf"has moved: import {re.escape(new)} instead"):
        exec(statement, {})
