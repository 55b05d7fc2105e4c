"""The ``capsnet`` commands, each declared in its own module and found without importing it.

A command module holds, at its top level, ``COMMAND = Command(...)`` (or ``COMMANDS =
(Command(...), ...)`` for several) with literal arguments. ``discover`` finds those
statements in the top-level modules of ``PACKAGES`` by their text and reads each one's
literal arguments with ``ast``: nothing is executed, so ``capsnet --help`` and shell
completion import neither torch nor the pipeline's libraries, and a new command is its
module alone. Only the declaring statement is parsed: parsing every module of the command
packages whole would cost about as much as the rest of ``capsnet --help``. Importing
them instead would load torch and Ray; a central list would be one more file per command.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from capsnet.io.errors import CapsnetError

#: The packages whose top-level modules, and each folder's cli.py, may declare commands
#: (dotted, from the checkout root).
PACKAGES = ("benchmarks", "capsnet.cli", "pipeline")

#: A top-level ``COMMAND = ...`` / ``COMMANDS: ... = ...`` statement.
_DECLARATION = re.compile(r"^(COMMANDS?)\s*(?::[^=\n]*)?=", re.MULTILINE)


@dataclass(frozen=True)
class Command:
    """One ``capsnet`` command: its name, the attribute of its module that is its click
    command (imported on use), the line ``capsnet --help`` lists (tests/test_walls.py holds
    it to the command's short help), and for a DVC stage command the params sections it
    reads and the dvc.yaml stages that run it (the data stages are the dataset registry's).
    ``module`` is filled in by ``discover``."""

    name: str
    attribute: str
    help: str
    sections: tuple[str, ...] = ()
    stages: tuple[str, ...] = ()
    torch_free_help: bool = True  # ``capsnet NAME --help`` imports no torch
    module: str = ""

    @property
    def target(self) -> str:
        """``"module:attribute"``."""
        return f"{self.module}:{self.attribute}"


class DeclarationError(CapsnetError):
    """A command declaration that cannot be read or contradicts another."""


def _statement(text: str, start: int, path: Path) -> ast.stmt:
    """The statement beginning at offset ``start`` of ``text``: the shortest run of its lines
    that parses (a prefix of an unfinished statement never does)."""
    lines = text[start:].splitlines()
    for end in range(1, len(lines) + 1):
        try:
            return ast.parse("\n".join(lines[:end])).body[0]
        except SyntaxError:
            continue
    raise DeclarationError(f"{path}: its command declaration does not parse")


def _literal_command(node: ast.expr, path: Path, module: str) -> Command:
    """A ``Command(...)`` call with literal arguments, as the Command it builds."""
    if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Command"):
        raise DeclarationError(f"{path}: a command declaration must be Command(...)")
    names = [f.name for f in dataclasses.fields(Command) if f.name != "module"]
    try:
        values = dict(zip(names, (ast.literal_eval(a) for a in node.args)))
        values.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
        if len(node.args) > len(names) or "module" in values:
            raise TypeError("unexpected arguments")
        command = Command(**values, module=module)
    except (ValueError, TypeError, SyntaxError) as exc:
        raise DeclarationError(
            f"{path}: Command(...) takes literal name, attribute, help, sections, stages, "
            f"torch_free_help ({exc})"
        ) from None
    for field in dataclasses.fields(Command):
        value = getattr(command, field.name)
        if field.name in ("sections", "stages"):
            fits = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
        else:
            fits = isinstance(value, bool if field.name == "torch_free_help" else str)
        if not fits:
            raise DeclarationError(
                f"{path}: command {command.name!r}: {field.name} must be {field.type}"
            )
    return command


def _defines(text: str, attribute: str) -> bool:
    """Whether a module's ``text`` binds ``attribute`` at its top level."""
    name = re.escape(attribute)
    binding = rf"^(?:(?:async\s+)?def|class)\s+{name}\b|^{name}\s*[:=]"
    return re.search(binding, text, re.MULTILINE) is not None


def module_commands(path: Path, module: str) -> list[Command]:
    """The commands the module at ``path`` (named ``module``) declares."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _DECLARATION.finditer(text):
        value = _statement(text, match.start(), path).value
        many = match.group(1) == "COMMANDS"
        if many and not isinstance(value, (ast.Tuple, ast.List)):
            raise DeclarationError(f"{path}: COMMANDS must be a tuple of Command(...)")
        for node in value.elts if many else [value]:
            command = _literal_command(node, path, module)
            if not _defines(text, command.attribute):
                raise DeclarationError(
                    f"{path}: command {command.name!r} names {command.attribute}, which the "
                    "module does not define"
                )
            found.append(command)
    return found


def discover(
    root: Path, packages: Iterable[str] = PACKAGES, sections: Iterable[str] | None = None
) -> tuple[Command, ...]:
    """Every command declared in the top-level modules of ``packages`` under ``root`` and in
    the ``cli.py`` of each of their folders (pipeline/<concern>/cli.py), by name; with
    ``sections``, each command's params sections must be among them. A package
    missing under ``root`` (benchmarks/ outside a source checkout) declares nothing."""
    by_name: dict[str, Command] = {}
    where: dict[str, Path] = {}
    known = None if sections is None else set(sections)
    for package in packages:
        folder = root / package.replace(".", "/")
        for path in sorted(folder.glob("*.py")) + sorted(folder.glob("*/cli.py")):
            dotted = ".".join(path.relative_to(folder).with_suffix("").parts)
            module = package if dotted == "__init__" else f"{package}.{dotted}"
            for command in module_commands(path, module):
                if command.name in by_name:
                    raise DeclarationError(
                        f"{path}: command {command.name!r} is already declared by "
                        f"{where[command.name]}"
                    )
                unknown = sorted(set(command.sections) - known) if known is not None else []
                if unknown:
                    raise DeclarationError(
                        f"{path}: command {command.name!r} reads params section "
                        f"{', '.join(unknown)}, which capsnet/config/ does not declare"
                    )
                by_name[command.name] = command
                where[command.name] = path
    return tuple(by_name[name] for name in sorted(by_name))
