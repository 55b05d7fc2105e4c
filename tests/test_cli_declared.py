"""capsnet.cli.declared: each command declared in its own module, read without importing it;
a broken declaration is one line naming the module."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from capsnet import cli
from capsnet.cli.declared import Command, DeclarationError, discover

GOOD = """
from capsnet.cli.declared import Command

COMMAND = Command(
    "toy",
    "toy_command",
    "A toy.",
    sections=("train",),
    stages=("toy",),
)


def toy_command():
    pass
"""


def package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_a_declaration_is_read_without_running_its_module(tmp_path):
    two = """
    import nonexistent_module_that_would_fail

    COMMANDS: tuple = (
        Command("b", "b_command", "B."),
        Command(name="a", attribute="a_group", help="A.", torch_free_help=False),
    )

    @nonexistent_module_that_would_fail.decorate
    def b_command():
        pass

    a_group = None
    """
    root = package(tmp_path, {"one.py": GOOD, "two.py": two, "plain.py": "x = 1\n"})
    commands = discover(root, ("pkg",), sections=["train"])
    assert [c.name for c in commands] == ["a", "b", "toy"]
    assert commands[2] == Command(
        "toy", "toy_command", "A toy.", ("train",), ("toy",), True, module="pkg.one"
    )
    assert commands[0].target == "pkg.two:a_group" and not commands[0].torch_free_help


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"one.py": GOOD, "two.py": GOOD.replace('"toy_command"', '"other"') + "other = 1\n"},
            r"pkg/two\.py: command 'toy' is already declared by .*pkg/one\.py$",
        ),
        (
            {"one.py": GOOD.replace("def toy_command", "def toy_commands")},
            r"pkg/one\.py: command 'toy' names toy_command, which the module does not define$",
        ),
        (
            {"one.py": GOOD.replace('("train",)', '("trian",)')},
            r"pkg/one\.py: command 'toy' reads params section trian, which capsnet/config/ does",
        ),
        (
            {"one.py": GOOD.replace('"A toy."', '"A " + HELP')},
            r"pkg/one\.py: Command\(\.\.\.\) takes literal name, attribute, help",
        ),
        (
            {"one.py": GOOD.replace('stages=("toy",)', 'stages="toy"')},
            r"pkg/one\.py: command 'toy': stages must be tuple\[str, \.\.\.\]$",
        ),
        (
            {"one.py": GOOD.replace('stages=("toy",)', 'torch_free_help="no"')},
            r"pkg/one\.py: command 'toy': torch_free_help must be bool$",
        ),
        (
            {"one.py": "COMMAND = make_command()\n"},
            r"pkg/one\.py: a command declaration must be Command\(\.\.\.\)$",
        ),
    ],
)
def test_a_broken_declaration_names_its_module(tmp_path, files, message):
    root = package(tmp_path, files)
    with pytest.raises(DeclarationError, match=message):
        discover(root, ("pkg",), sections=["train"])


def test_capsnet_with_a_broken_declaration_is_one_line_and_exit_1(tmp_path, monkeypatch):
    root = package(tmp_path, {"one.py": GOOD, "two.py": GOOD})
    monkeypatch.setattr(cli, "declared", lambda: discover(root, ("pkg",)))
    done = CliRunner().invoke(cli.main, ["--help"])
    assert done.exit_code == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "pkg/two.py" in lines[0]


def test_the_group_reads_every_command_its_packages_declare(repo_root):
    """The modules of pipeline/, capsnet/cli/ and benchmarks/ declare the commands."""
    modules = {c.module for c in cli.DECLARED}
    assert {"pipeline.sweep.cli", "capsnet.cli.eval_commands", "benchmarks.throughput"} <= modules
    assert cli.DECLARED == discover(repo_root)
