"""The dataset registry: one declaration per dataset, read by every stage, loader and config;
and capsnet.data free of import cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import capsnet.data
from capsnet.config import DATASETS as SWEEP_DATASETS
from capsnet.config import EVAL_DATASETS, EXTRA_DATASETS, DataParams, dataset_specs
from capsnet.data.registry import resolve

DATA_DIR = Path(capsnet.data.__file__).parent


def _data_imports(path: Path) -> set[str]:
    """The capsnet.data modules ``path`` imports, at any level (function bodies too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "capsnet.data":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("capsnet.data."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {
                a.name.split(".")[2] for a in node.names if a.name.startswith("capsnet.data.")
            }
    return found & {p.stem for p in DATA_DIR.glob("*.py")}


def test_capsnet_data_has_no_import_cycle():
    graph = {p.stem: _data_imports(p) - {p.stem} for p in DATA_DIR.glob("*.py")}
    graph["__init__"] = set()  # imports on first attribute use only (module __getattr__)
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        if state.get(module) == "done":
            return
        if state.get(module) == "open":
            cycle = [*path[path.index(module) :], module]
            pytest.fail(f"import cycle in capsnet/data: {' -> '.join(cycle)}")
        state[module] = "open"
        for child in sorted(graph.get(module, ())):
            visit(child, [*path, module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])


def test_each_data_module_imports_alone_and_the_registry_without_torch():
    """One interpreter checks that the registry and config import without torch, imports
    every module once to load the third-party libraries they use, unloads capsnet, and
    forks one child per capsnet.data module: each child imports its module with no capsnet
    module loaded before it (the libraries are shared: importing them is not under test)."""
    modules = sorted(p.stem for p in DATA_DIR.glob("*.py") if p.stem != "__init__")
    script = (
        "import os, sys, traceback\n"
        "import capsnet.config.dataset_specs, capsnet.config, capsnet.data.registry\n"
        "assert 'torch' not in sys.modules, 'the dataset specs and config import torch'\n"
        f"for name in {modules!r}:\n"
        "    __import__(f'capsnet.data.{name}')\n"
        "for name in [m for m in sys.modules if m == 'capsnet' or m.startswith('capsnet.')]:\n"
        "    del sys.modules[name]\n"
        "failed = []\n"
        f"for name in {modules!r}:\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        try:\n"
        "            assert not [m for m in sys.modules if m.startswith('capsnet')]\n"
        "            __import__(f'capsnet.data.{name}')\n"
        "        except BaseException:\n"
        "            traceback.print_exc()\n"
        "            os._exit(1)\n"
        "        os._exit(0)\n"
        "    if os.waitpid(pid, 0)[1] != 0:\n"
        "        failed.append(name)\n"
        "sys.exit(f'these capsnet.data modules fail to import alone: {failed}' if failed else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_every_declaration_resolves_and_names_its_params_section():
    sections = {f.name for f in DataParams.__dataclass_fields__.values()}
    for name, spec in dataset_specs.REGISTRY.items():
        assert spec.name == name and spec.section in sections, name
        hooks = (spec.split, spec.test_set, spec.evaluation_set, spec.data_record)
        for reference in (spec.loader, spec.download, spec.stand_in, spec.prepare, spec.prepared,
                          *hooks):  # fmt: skip
            if reference is not None:
                assert resolve(reference) is not None, reference
        if spec.download:
            assert spec.prepare, f"{name}: downloaded but never prepared"


def test_config_choices_are_the_registry():
    assert EVAL_DATASETS == dataset_specs.EVAL_DATASETS
    assert SWEEP_DATASETS == dataset_specs.SWEEP_DATASETS == ("mnist", "smallnorb")
    assert set(EXTRA_DATASETS) == {"multimnist", "expanded-mnist"}
    assert len(set(EVAL_DATASETS)) == len(EVAL_DATASETS)
    from capsnet.cli import data_commands as cli
    from capsnet.cli import train_commands as train_cli

    train_choices = next(p for p in train_cli.train_command.params if p.name == "dataset").type
    assert tuple(train_choices.choices) == dataset_specs.TRAIN_DATASETS
    prepare = next(p for p in cli.prepare_command.params if p.name == "dataset").type
    assert tuple(prepare.choices) == dataset_specs.PREPARES


def test_unknown_names_fail_in_one_line():
    from capsnet.data import load
    from capsnet.io.errors import DataError

    with pytest.raises(DataError, match="unknown dataset 'norb'; choose one of: mnist, "):
        load("norb")
    with pytest.raises(DataError, match="smallnorb: unknown option"):
        load("smallnorb", "test", "nowhere", merge="max")


def test_shapes_declared_match_the_evaluation_sizes():
    from capsnet.evaluation.datasets import image_shape

    assert image_shape("rotated-mnist") == (28, 10)
    assert image_shape("affnist-synth") == (40, 10)
    assert image_shape("smallnorb-azimuth-novel") is None  # from the data: crop and channels


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))


def test_a_split_a_dataset_does_not_declare_is_refused_in_one_line():
    from capsnet.data.datasets import load
    from capsnet.io.errors import DataError

    with pytest.raises(DataError, match="affnist-synth has no split 'train'; choose one of: test"):
        load("affnist-synth", "train", "no-such-root")
