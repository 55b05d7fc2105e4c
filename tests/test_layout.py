"""Size limits that keep the code easy to read: no module in capsnet/ or pipeline/ over 450
lines, no function over 60 lines (docstring included, decorators not)."""

from __future__ import annotations

import ast
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
    assert {"capsnet/training/run.py", "capsnet/cli/__init__.py", "pipeline/sweep.py"} <= names


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
