"""The walls of ARCHITECTURE.md: capsnet/ never imports the pipeline's libraries, and the
`capsnet` group lists its commands without importing them (or torch)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from capsnet import cli, config

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("pipeline", "ray", "wandb", "dvc")


def imported_modules(tree: ast.AST):
    """(line, module) for every import statement at any depth (functions, try blocks...)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def wall_breaches(package: Path) -> list[str]:
    """``file:line: import <module>`` for each import of a FORBIDDEN package."""
    breaches = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in imported_modules(tree):
            if module.split(".")[0] in FORBIDDEN:
                breaches.append(f"{path.relative_to(package.parent)}:{line}: import {module}")
    return breaches


def test_nothing_under_capsnet_imports_the_pipeline_or_its_libraries():
    assert wall_breaches(ROOT / "capsnet") == []


def test_the_wall_check_sees_imports_at_every_level(tmp_path):
    package = tmp_path / "capsnet"
    (package / "sub").mkdir(parents=True)
    (package / "ok.py").write_text("import os\nfrom capsnet import pipeline_like\n")
    (package / "sub" / "lazy.py").write_text(
        "def f():\n    try:\n        import ray.tune as tune\n    except ImportError:\n"
        "        pass\n\n\nclass C:\n    def g(self):\n        from wandb import init\n"
    )
    (package / "top.py").write_text("import dvc.api, json\nfrom pipeline.sweep.sections import x\n")
    assert wall_breaches(package) == [
        "capsnet/sub/lazy.py:3: import ray.tune",
        "capsnet/sub/lazy.py:10: import wandb",
        "capsnet/top.py:1: import dvc.api",
        "capsnet/top.py:2: import pipeline.sweep.sections",
    ]


HEAVY = ("torch", "pipeline", "ray", "wandb", "dvc", "benchmarks")
TARGETS = sorted({target.split(":")[0] for target in cli.COMMANDS.values()})


def _loaded_after(code: str, env_extra: dict | None = None) -> dict:
    """Run ``code`` in a fresh interpreter; its output and the HEAVY packages and command
    modules it loaded."""
    probe = (
        "\nimport json, sys\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} "
        f"or m in {TARGETS!r})))"
    )
    env = {**os.environ, **(env_extra or {})}
    done = subprocess.run(
        [sys.executable, "-c", code + probe], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    *output, loaded = done.stdout.strip().splitlines()
    return {"output": "\n".join(output), "loaded": json.loads(loaded)}


def test_importing_the_cli_loads_no_command_and_no_torch():
    assert _loaded_after("import capsnet.cli")["loaded"] == []


def _run_group(args: list[str]) -> str:
    return (
        "from capsnet.cli import main\n"
        "try:\n"
        f"    main.main({args!r}, prog_name='capsnet')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
    )


def test_help_lists_every_command_without_importing_any():
    result = _loaded_after(_run_group(["--help"]))
    assert result["loaded"] == []
    listed = result["output"].split("Commands:")[1].split()
    for name in cli.COMMANDS:
        assert name in listed


@pytest.mark.parametrize("name", [c.name for c in cli.DECLARED if c.torch_free_help])
def test_a_command_s_help_imports_no_torch_and_no_pipeline_library(name):
    """Defaults come from torch-free dataclasses (capsnet.config), so --help stays fast."""
    loaded = _loaded_after(_run_group([name, "--help"]))["loaded"]
    assert [m for m in loaded if m.split(".")[0] in ("torch", "ray", "wandb", "dvc")] == []


def test_shell_completion_of_command_names_imports_nothing():
    env = {"_CAPSNET_COMPLETE": "bash_complete", "COMP_WORDS": "capsnet ev", "COMP_CWORD": "1"}
    result = _loaded_after(_run_group([]), env)
    assert result["loaded"] == []
    assert result["output"].splitlines() == ["plain,eval", "plain,evaluate-stage"]


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_target_imports_and_is_a_click_command(name):
    command = cli.load_command(name)
    assert isinstance(command, click.Command)
    assert command.name == name
    assert cli.SHORT_HELP[name] == command.get_short_help_str(limit=1_000)


def test_the_help_table_and_the_commands_name_the_same_commands():
    assert set(cli.SHORT_HELP) == set(cli.COMMANDS)
    assert all(target.count(":") == 1 for target in cli.COMMANDS.values())


def dvc_stage_commands(root: Path = ROOT) -> dict[str, str]:
    """dvc.yaml's stage name -> its command (the word after ``-m capsnet``)."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    return {
        name: stage["cmd"].split("-m capsnet", 1)[1].split()[0] for name, stage in stages.items()
    }


def test_every_dvc_stage_is_declared_by_the_command_it_runs():
    """Each pipeline stage is declared once, by the command dvc.yaml runs for it (its
    ``Command(...)``, with the params sections it reads); the data stages are the dataset
    registry's."""
    declared = {stage: c.name for c in cli.DECLARED for stage in c.stages}
    ran = {s: command for s, command in dvc_stage_commands().items() if command != "data"}
    assert declared == ran
    sections = {f.name for f in dataclasses.fields(config.Params)}
    for command in cli.DECLARED:
        assert set(command.sections) <= sections, command.name


# --- dataset names: only capsnet/data/ and capsnet/config/ compare or table them -----------


def _dataset_literals(node: ast.AST) -> list[str]:
    """The string constants of ``node`` (a constant or a literal tuple, list or set)."""
    elements = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _names_a_dataset(text: str, names, exact: bool = False) -> bool:
    """Whether ``text`` is a dataset or evaluation set name, a prefix of one ("smallnorb-")
    or one with a column suffix ("rotated-mnist@"); ``exact``: the name itself, a column
    suffix allowed (a table's "mn" or "x" names nothing)."""
    text = text.split("@")[0]
    if exact:
        return text in names
    return len(text) >= 3 and any(name.startswith(text) for name in names)


#: Where datasets are declared and what they do lives: the only places that may name them.
DATASET_HOMES = (("capsnet", "data"), ("capsnet", "config"))


def _table_operands(node: ast.AST) -> list[ast.AST]:
    """The literals a table names: a dict display's keys, the elements of a tuple, list or
    set display (a nested one is a display of its own)."""
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if k is not None]
    return list(node.elts) if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []


def _named_operands(node: ast.AST) -> list[ast.AST]:
    """The values a dataset would be named by at ``node`` other than in a comparison or a
    table: a call's arguments (``load("mnist")``, ``d.get("mnist")``, ``dataset="mnist"``),
    a subscript's key (``d["mnist"]``) and a parameter's default (``def f(d="mnist")``).
    A model name that contains a dataset's ("smallnorb-cnn") is no dataset name: these
    match whole names only."""
    if isinstance(node, ast.Call):
        return [*node.args, *(k.value for k in node.keywords)]
    if isinstance(node, ast.Subscript):
        return [node.slice]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
    return []


def dataset_comparisons(root: Path, packages=("capsnet", "pipeline"), names=None) -> list[str]:
    """``file:line: literal`` for each comparison (==, !=, in, not in, startswith, endswith)
    of a value with a dataset name literal, each table (dict keys, tuple, list or set
    elements) naming one, and each dataset name passed as a call argument, used as a
    subscript key or as a parameter default (``_named_operands``), outside capsnet/data/
    and capsnet/config/: what code needs of a dataset comes from its spec (a flag or a
    relation: ``rotation_sweep``, ``viewpoint_dataset``, ``published``)."""
    from capsnet.config import dataset_specs

    names = names or (*dataset_specs.DATASETS, *dataset_specs.EVAL_DATASETS)
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if path.relative_to(root).parts[:2] in DATASET_HOMES:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                found += [
                    f"{path.relative_to(root)}:{node.lineno}: {text!r}"
                    for text in (t for o in _named_operands(node) for t in _dataset_literals(o))
                    if _names_a_dataset(text, names, exact=True)
                ]
                if isinstance(node, ast.Compare):
                    operands = [node.left, *node.comparators]
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    operands = node.args if node.func.attr in ("startswith", "endswith") else []
                else:
                    tabled = [
                        o.value
                        for o in _table_operands(node)
                        if isinstance(o, ast.Constant) and isinstance(o.value, str)
                    ]
                    found += [
                        f"{path.relative_to(root)}:{node.lineno}: {text!r}"
                        for text in tabled
                        if _names_a_dataset(text, names, exact=True)
                    ]
                    continue
                for text in (t for o in operands for t in _dataset_literals(o)):
                    if _names_a_dataset(text, names):
                        found.append(f"{path.relative_to(root)}:{node.lineno}: {text!r}")
    return list(dict.fromkeys(found))  # a tuple compared with is no table of its own


def test_no_code_outside_capsnet_data_and_config_compares_or_tables_a_dataset_name():
    """What a dataset does and how it is shown is declared in capsnet/config/dataset_specs.py;
    tests/ and benchmarks/ may name datasets to choose them."""
    assert dataset_comparisons(ROOT) == []


def test_the_dataset_name_check_sees_every_table(tmp_path):
    (tmp_path / "capsnet" / "config").mkdir(parents=True)
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "capsnet" / "config" / "specs.py").write_text("T = {'mnist': 'MNIST'}\n")
    (tmp_path / "pipeline" / "t.py").write_text(
        "A = {'mnist': 'MNIST', 'n': 1}\nB = ('confusion', 'multimnist')\n"
        "C = [('rotated-mnist@35', 35.0)]\nD = {'x': 'smallnorb'}\nE = ('mn', 'rot35')\n"
    )
    assert dataset_comparisons(tmp_path) == [
        "pipeline/t.py:1: 'mnist'",
        "pipeline/t.py:2: 'multimnist'",
        "pipeline/t.py:3: 'rotated-mnist@35'",
    ]


def test_the_dataset_name_check_sees_every_form_of_comparison(tmp_path):
    (tmp_path / "capsnet" / "data").mkdir(parents=True)
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "capsnet" / "data" / "own.py").write_text("ok = name == 'smallnorb'\n")
    (tmp_path / "capsnet" / "m.py").write_text(
        "a = name == 'mnist'\nb = 'multimnist' != name\nc = name in ('affnist', 'x')\n"
        "d = name.startswith('smallnorb-')\ne = column.startswith('rotated-mnist@')\n"
        "f = name == 'smallnorb-cnn'\ng = key in {'n', 'robustness'}\n"
    )
    (tmp_path / "pipeline" / "p.py").write_text("def f(d):\n    return d not in ['smallnorb']\n")
    assert dataset_comparisons(tmp_path) == [
        "capsnet/m.py:1: 'mnist'",
        "capsnet/m.py:2: 'multimnist'",
        "capsnet/m.py:3: 'affnist'",
        "capsnet/m.py:4: 'smallnorb-'",
        "capsnet/m.py:5: 'rotated-mnist@'",
        "pipeline/p.py:2: 'smallnorb'",
    ]


def test_the_dataset_name_check_sees_arguments_keys_and_defaults(tmp_path):
    (tmp_path / "capsnet" / "config").mkdir(parents=True)
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "capsnet" / "config" / "own.py").write_text("spec = get('smallnorb')\n")
    (tmp_path / "pipeline" / "p.py").write_text(
        "a = chance('smallnorb')\nb = data.get('mnist')[0]\nc = run(dataset='smallnorb')\n"
        "d = scores['rotated-mnist@35']\ne = entry.block('rotated-mnist')\n"
        "def f(name='affnist', *, other='multimnist'):\n    return name\n"
        "g = models.registered('smallnorb-cnn')\nh = get('mn', key=name)\n"
        "i = Number('expanded-mnist', 'capsnet', 0.99)\n"
    )
    assert sorted(dataset_comparisons(tmp_path), key=lambda f: int(f.split(":")[1])) == [
        "pipeline/p.py:1: 'smallnorb'",
        "pipeline/p.py:2: 'mnist'",
        "pipeline/p.py:3: 'smallnorb'",
        "pipeline/p.py:4: 'rotated-mnist@35'",
        "pipeline/p.py:5: 'rotated-mnist'",
        "pipeline/p.py:6: 'affnist'",
        "pipeline/p.py:6: 'multimnist'",
        "pipeline/p.py:10: 'expanded-mnist'",
    ]


def attribute_reads(root: Path, packages=("capsnet", "pipeline")) -> set[str]:
    """The attribute names read (``x.name`` loaded, or ``getattr(x, "name")``) anywhere in
    the library and pipeline code."""
    reads = set()
    for package in packages:
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    reads.add(node.attr)
    return reads


def test_every_dataset_registry_field_is_read():
    """A declared behaviour that nothing reads is a promise nothing keeps."""
    from dataclasses import fields

    from capsnet.config.dataset_specs import DatasetSpec

    reads = attribute_reads(ROOT)
    unread = [f.name for f in fields(DatasetSpec) if f.name not in reads]
    assert unread == []


# --- model families: only capsnet/models/ knows them -----------------------------------------


def _part_of_a_model_name(text: str, names, whole: bool = True) -> bool:
    """Whether ``text`` is part of a registered model name (``whole``: or all of one)."""
    return len(text) >= 2 and (whole or text not in names) and any(text in n for n in names)


def model_name_checks(
    root: Path, packages=("capsnet", "pipeline", "benchmarks"), names=None
) -> list[str]:
    """``file:line: literal`` for each check of a value's start, end or part against a
    literal that is part of a registered model name (``x.startswith("em")``,
    ``x.endswith("-cnn")``, ``"capsnet" in x``), outside capsnet/models/: what a model is
    comes from its registration (``family``, ``capsules``), never from its name."""
    from capsnet import models

    names = names or models.names()
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if path.relative_to(root).parts[:2] == ("capsnet", "models"):
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    affix = ("startswith", "endswith", "removeprefix", "removesuffix")
                    operands, whole = (node.args if node.func.attr in affix else []), True
                elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
                    # a part of a name in a value; a whole name is a key looked up (name in d)
                    container = node.comparators[0]
                    literal = isinstance(container, (ast.Constant, ast.Tuple, ast.List, ast.Set))
                    operands, whole = ([] if literal else [node.left]), False
                else:
                    continue
                for text in (t for o in operands for t in _dataset_literals(o)):
                    if _part_of_a_model_name(text, names, whole):
                        found.append((path.relative_to(root), node.lineno, node.col_offset, text))
    return [f"{path}:{line}: {text!r}" for path, line, _, text in sorted(found)]


def test_no_code_outside_capsnet_models_checks_a_model_name_prefix():
    """pipeline/paper.py matches the published numbers on the registered family."""
    assert model_name_checks(ROOT) == []


def test_the_model_name_check_sees_prefix_suffix_and_part_checks(tmp_path):
    (tmp_path / "capsnet" / "models").mkdir(parents=True)
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "capsnet" / "models" / "own.py").write_text("ok = name.startswith('em')\n")
    (tmp_path / "pipeline" / "p.py").write_text(
        "a = base.startswith('em') or 'em-' in base\nb = m.endswith(('-cnn', '.png'))\n"
        "c = 'small' not in name\nd = name in ('capsnet', 'lenet5')\ne = name == 'capsnet'\n"
        "f = path.endswith('.png') or '://' in url or 'capsnet' in built\n"
    )
    assert model_name_checks(tmp_path, ("capsnet", "pipeline")) == [
        "pipeline/p.py:1: 'em'",
        "pipeline/p.py:1: 'em-'",
        "pipeline/p.py:2: '-cnn'",
        "pipeline/p.py:3: 'small'",
    ]
