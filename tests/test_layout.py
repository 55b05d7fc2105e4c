"""Size limits that keep the code easy to read: no module in capsnet/ or pipeline/ over 450
lines, no function over 60 lines (docstring included, decorators not)."""

from __future__ import annotations

import ast
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
    assert {"capsnet/run.py", "capsnet/cli.py", "pipeline/sweep.py"} <= names


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_module_and_function_sizes(path):
    lines = path.read_text().count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)}: {lines} lines"
    assert long_functions(path) == []


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
