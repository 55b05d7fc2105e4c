"""Each DVC stage's code deps are the import closure of the command it runs.

A stage's ``cmd`` is ``python -m capsnet COMMAND ...``: a console script of this project
run as a package (pyproject.toml's ``[project.scripts]``), so the stage imports the code of
the repository DVC runs it in. Each command's module declares it (``COMMAND =
Command(...)``, found by ``capsnet.cli.declared.discover``). The closure starts from the
package's ``__main__``, the script's module and the command's module and follows, in every
module reached, every import statement at every level (inside functions and ``if
TYPE_CHECKING:`` blocks too), relative imports, and string constants that spell a project
module's dotted name (the model registry imports its families by name), a
``"module:attribute"`` reference (the dataset registry's loaders and hooks) or every module
of a package, ``"package.*"`` (capsnet.config imports each of its modules to find the
sections). Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py``, so they are
in the closure too.
In a command group's module only what the stage's subcommand runs counts: the module's
top-level statements, the function registered as that subcommand and the module's
functions it names (``capsnet data download`` does not depend on what ``capsnet data
show`` imports inside its function).

Code deps are the deps inside a project package (a top-level directory holding
``__init__.py``); every other dep (data, checkpoints, sweep results) is left as it is. Code
deps are listed file by file, never as a directory: a new module nobody imports, or an edit
to one, leaves every stage as it was.

    python -m pipeline.dvc.deps            # check: one line per missing or extra file
    python -m pipeline.dvc.deps --write    # rewrite the code deps of every stage
    CAPSNET_PARAMS_TRACE=reads.tsv dvc repro -f
    python -m pipeline.dvc.deps --reads reads.tsv   # every key a stage read is a param of it

Params deps: each stage lists the params keys its command reads. With
$CAPSNET_PARAMS_TRACE set, every read is recorded per stage (capsnet.config.trace), and
``unlisted_reads`` names each key a stage read but does not list (tests/test_dvc_repro.py).
"""

from __future__ import annotations

import ast
import io
import re
import shlex
from collections.abc import Iterable, Iterator
from pathlib import Path

import click

from capsnet.io.errors import ConfigError

#: A string constant naming a module: dotted identifiers, at least one dot.
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
#: A string constant naming every module of a package: ``"capsnet.config.*"``.
EVERY_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\.\*")
SKIPPED_DIRS = ("__pycache__",)


def project_packages(root: Path) -> set[str]:
    """Top-level directories of ``root`` that are Python packages."""
    return {p.parent.name for p in root.glob("*/__init__.py")}


def module_file(root: Path, name: str) -> Path | None:
    """The file that defines module ``name`` under ``root``, or None (not project code)."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_subcommand(decorator: ast.expr, name: str) -> bool:
    """Whether ``decorator`` is ``<group>.command("name")`` (click's registration)."""
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)):
        return False
    if decorator.func.attr != "command":
        return False
    given = [a for a in decorator.args[:1]] + [
        k.value for k in decorator.keywords if k.arg == "name"
    ]
    return [a.value for a in given if isinstance(a, ast.Constant)] == [name]


def reached_nodes(tree: ast.Module, subcommand: str | None) -> list[ast.AST]:
    """The parts of a module a run of ``subcommand`` executes: every top-level statement
    but function bodies, the subcommand's function and the module functions named from
    what is reached. The whole module when ``subcommand`` is None or registers nowhere."""
    functions = {
        node.name: node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    start = [
        f
        for f in functions.values()
        if subcommand is not None and any(_is_subcommand(d, subcommand) for d in f.decorator_list)
    ]
    if not start:
        return [tree]
    top = [node for node in tree.body if node not in functions.values()]
    reached: dict[str, ast.AST] = {}
    todo = list(start) + [
        functions[n.id]
        for stmt in top
        for n in ast.walk(stmt)
        if isinstance(n, ast.Name) and n.id in functions
    ]
    while todo:
        function = todo.pop()
        if function.name in reached:
            continue
        reached[function.name] = function
        todo += [
            functions[n.id]
            for n in ast.walk(function)
            if isinstance(n, ast.Name) and n.id in functions
        ]
    return top + list(reached.values())


def imported_names(
    source: str, module: str, is_package: bool, path: Path, subcommand: str | None = None
) -> Iterator[str]:
    """Every module name that ``source`` (module ``module``) may import, at any level (in a
    group module, only in what ``subcommand`` runs: ``reached_nodes``)."""
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise ConfigError(f"{path}: cannot parse: {exc.msg} (line {exc.lineno})") from None
    package = module if is_package else module.rpartition(".")[0]
    table = {id(value) for value in _commands_values(tree)}
    for root in reached_nodes(tree, subcommand):
        for node in ast.walk(root):
            if isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    if node.level > len(parts):
                        raise ConfigError(f"{path}: relative import beyond the top-level package")
                    anchor = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                yield base
                yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                name, colon, attribute = node.value.partition(":")
                reference = colon and attribute.isidentifier() and id(node) not in table
                if MODULE_NAME.fullmatch(name) and (not colon or reference):
                    yield name
                elif EVERY_MODULE.fullmatch(node.value):
                    yield node.value


def _commands_values(tree: ast.Module) -> list[ast.AST]:
    """The command targets of a CLI module's top-level ``COMMANDS`` table: commands run one
    at a time, never imports of the module (the stage's own command is followed
    separately)."""
    values: list[ast.AST] = []
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        names = {
            t.id
            for t in getattr(node, "targets", [getattr(node, "target", None)])
            if isinstance(t, ast.Name)
        }
        if "COMMANDS" in names and isinstance(node.value, ast.Dict):
            values.extend(node.value.values)
    return values


def import_closure(
    root: Path,
    modules: Iterable[str],
    subcommands: dict[str, str] | None = None,
    memo: dict | None = None,
) -> set[str]:
    """Paths (relative to ``root``, POSIX) of the project files importing ``modules`` runs;
    ``subcommands`` maps a group module to the subcommand the stage runs. ``memo`` keeps
    the files and imports found for the next closure over the same tree (``stage_closures``)."""
    root = root.resolve()
    subcommands = subcommands or {}
    memo = {} if memo is None else memo
    files: dict[str, Path | None] = memo.setdefault("files", {})
    imports: dict[tuple[Path, str | None], list[str]] = memo.setdefault("imports", {})
    seen: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name.endswith(".*"):
            package = root.joinpath(*name[:-2].split("."))
            todo += [
                f"{name[:-2]}.{p.stem}"
                for p in sorted(package.glob("*.py"))
                if p.stem != "__init__"
            ]
            continue
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in seen:
                continue
            if prefix not in files:
                files[prefix] = module_file(root, prefix)
            path = files[prefix]
            if path is None:
                if root.joinpath(*parts[:i]).is_dir():
                    continue  # a folder without __init__.py: a namespace package
                break
            seen[prefix] = path
            key = (path, subcommands.get(prefix))
            if key not in imports:
                is_package = path.name == "__init__.py"
                text = path.read_text()
                imports[key] = list(imported_names(text, prefix, is_package, path, key[1]))
            todo.extend(imports[key])
    return {path.relative_to(root).as_posix() for path in seen.values()}


def command_target(root: Path, script_module: str, command: str) -> str:
    """``"module:attr"`` of ``command`` as ``script_module`` declares it (``_static_commands``)."""
    path = module_file(root, script_module)
    if path is None:
        raise ConfigError(f"console script module {script_module} is not in {root}")
    commands = _static_commands(root, path)
    if command not in commands:
        raise ConfigError(f"{path}: COMMANDS has no command {command!r}")
    return commands[command]


def _static_commands(root: Path, path: Path) -> dict[str, str]:
    """The commands of a CLI module, read without running anything: its literal
    ``COMMANDS`` dict, else the commands declared in their own modules under ``root``
    (``capsnet.cli.declared``)."""
    from capsnet.cli.declared import DeclarationError, discover

    for node in ast.parse(path.read_text(), filename=str(path)).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if not isinstance(target, ast.Name) or node.value is None or target.id != "COMMANDS":
            continue
        try:
            commands = ast.literal_eval(node.value)
        except ValueError:
            continue
        if isinstance(commands, dict):
            return {str(k): str(v) for k, v in commands.items()}
    try:
        declared = {c.name: c.target for c in discover(root)}
    except DeclarationError as exc:
        raise ConfigError(str(exc)) from None
    if not declared:
        raise ConfigError(f"{path}: no literal COMMANDS dict and no command declarations")
    return declared


#: The interpreters a stage may name: ``python``, ``python3``, ``python3.11``.
PYTHON = re.compile(r"python(3(\.\d+)?)?")


def project_scripts(root: Path) -> dict[str, str]:
    """The console scripts pyproject.toml declares whose name is a package of ``root``
    runnable with ``python -m`` (it has ``__main__.py``): name -> ``module:attr``."""
    import tomllib

    try:
        project = tomllib.loads((root / "pyproject.toml").read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(
            f"{root / 'pyproject.toml'}: cannot read its [project.scripts] ({exc})"
        ) from None
    scripts = project.get("scripts", {})
    return {k: v for k, v in scripts.items() if (root / k / "__main__.py").is_file()}


def command_modules(
    root: Path, package: str, cli_module: str, words: list[str]
) -> tuple[list[str], dict[str, str]]:
    """The modules ``python -m PACKAGE WORDS...`` imports first (``PACKAGE.__main__``, the
    CLI module and the command's module) and, for a command group, {group module: the
    subcommand run}."""
    target = command_target(root, cli_module, words[0]).partition(":")[0]
    subcommands = {target: words[1]} if len(words) > 1 and not words[1].startswith("-") else {}
    return [f"{package}.__main__", cli_module, target], subcommands


def command_closure(root: Path, package: str, cli_module: str, words: list[str]) -> set[str]:
    """The project files ``python -m PACKAGE WORDS...`` imports (``import_closure``)."""
    return import_closure(root, *command_modules(root, package, cli_module, words))


def stage_modules(root: Path, stage: str, cmd: str, scripts: dict[str, str]):
    """``command_modules`` of a stage's ``cmd``, which must be ``python -m PACKAGE
    COMMAND ...`` for a project console script PACKAGE: the interpreter puts the directory
    DVC runs the stage in first on ``sys.path``, so a queued or ``--temp`` experiment runs
    its own copy of the code, however the package was installed."""
    argv = shlex.split(" ".join(cmd) if isinstance(cmd, list) else str(cmd))
    if len(argv) < 4 or not PYTHON.fullmatch(argv[0]) or argv[1] != "-m" or argv[2] not in scripts:
        raise ConfigError(
            f"dvc.yaml stage {stage}: cmd must run a project command as `python -m "
            f"{'|'.join(sorted(scripts)) or 'PACKAGE'} COMMAND ...` (the code of the "
            f"repository the stage runs in): {cmd!r}"
        )
    cli_module = scripts[argv[2]].partition(":")[0]
    return command_modules(root, argv[2], cli_module, argv[3:])


def files_under(root: Path, rel: str) -> set[str]:
    """``rel`` itself if a file, else every file below it (as DVC hashes a directory)."""
    path = root / rel
    if path.is_file():
        return {rel}
    if not path.is_dir():
        return {rel}  # a missing path still shows up as extra
    return {
        p.relative_to(root).as_posix()
        for p in path.rglob("*")
        if p.is_file()
        and p.suffix != ".pyc"
        and not any(part in SKIPPED_DIRS for part in p.relative_to(root).parts)
    }


def is_code(dep: str, packages: set[str]) -> bool:
    return Path(dep).parts[0] in packages


def dep_path(entry) -> str:
    """The path of one deps entry (a string, or a one-key mapping in dvc.yaml syntax)."""
    return next(iter(entry)) if isinstance(entry, dict) else str(entry)


def stage_closures(root: Path, stages: dict) -> dict[str, set[str]]:
    """Import closure of every stage's command."""
    scripts = project_scripts(root)
    closures: dict[str, set[str]] = {}
    memo: dict = {}
    for name, stage in stages.items():
        if "cmd" not in stage:
            raise ConfigError(f"dvc.yaml stage {name}: no cmd")
        modules, subcommands = stage_modules(root, name, stage["cmd"], scripts)
        closures[name] = import_closure(root, modules, subcommands, memo)
    return closures


def differences(root: Path, stages: dict) -> list[str]:
    """One line per file a stage's deps miss or list beyond its command's import closure."""
    packages = project_packages(root)
    problems = []
    for name, closure in stage_closures(root, stages).items():
        listed: set[str] = set()
        for entry in stages[name].get("deps") or []:
            path = dep_path(entry)
            if is_code(path, packages):
                listed |= files_under(root, path)
                if (root / path).is_dir():
                    problems.append(f"stage {name}: deps list directory {path} (list its files)")
        problems += [f"stage {name}: deps miss {f} (imported)" for f in sorted(closure - listed)]
        extra = sorted(listed - closure)
        problems += [f"stage {name}: deps list {f} (not imported)" for f in extra]
    return problems


#: Keys a stage may read without listing them: they cannot change what it writes (a mirror
#: only serves files verified by their MD5).
NOT_PARAMS = ("data.mirror",)


def _in_params(params: dict, key: str) -> bool:
    node = params
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def unlisted_reads(trace_text: str, stages: dict, params: dict) -> list[str]:
    """One line per params key a stage read (a $CAPSNET_PARAMS_TRACE file's
    ``<stage>\t<key>`` lines, capsnet.config.trace) that its dvc.yaml ``params`` neither
    list nor hold inside a listed section. A key ``params`` (the params file's data) does
    not set reads its dataclass default, which lives in code, a code dep of the stage."""
    read: dict[str, set[str]] = {}
    for line in trace_text.splitlines():
        stage, _, key = line.partition("\t")
        if key:
            read.setdefault(stage, set()).add(key)
    problems = []
    for stage in sorted(set(read) & set(stages)):
        listed = [e for e in stages[stage].get("params") or [] if isinstance(e, str)]
        for key in sorted(read[stage]):
            covered = any(key == e or key.startswith(e + ".") for e in listed)
            if not covered and key not in NOT_PARAMS and _in_params(params, key):
                problems.append(f"stage {stage}: reads params key {key}, which its params omit")
    return problems


def _yaml():
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096
    yaml.preserve_quotes = True
    return yaml


def rewrite(root: Path, text: str) -> str:
    """dvc.yaml ``text`` with every stage's code deps replaced by its import closure; other
    deps, their comments and the rest of the file stay as they are."""
    from ruamel.yaml.comments import CommentedSeq

    yaml = _yaml()
    document = yaml.load(text)
    packages = project_packages(root)
    for name, closure in stage_closures(root, document["stages"]).items():
        stage = document["stages"][name]
        old = stage.get("deps") or CommentedSeq()
        kept = [i for i, entry in enumerate(old) if not is_code(dep_path(entry), packages)]
        new = CommentedSeq([old[i] for i in kept] + sorted(closure))
        for j, i in enumerate(kept):
            if i in old.ca.items:
                new.ca.items[j] = old.ca.items[i]
        last = len(old) - 1
        if old and last not in kept and last in old.ca.items:  # comment lines after the list
            new.ca.items[len(new) - 1] = old.ca.items[last]
        if "deps" in stage:
            stage["deps"] = new
        else:
            stage.insert(list(stage).index("cmd") + 1, "deps", new)
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    return buffer.getvalue()


def load_stages(dvc_yaml: Path) -> dict:
    try:
        document = _yaml().load(dvc_yaml.read_text())
    except OSError as exc:
        raise ConfigError(f"{dvc_yaml}: {exc.strerror}") from None
    if not isinstance(document, dict) or not isinstance(document.get("stages"), dict):
        raise ConfigError(f"{dvc_yaml}: no stages mapping")
    return document["stages"]


#: ``--dvc-yaml FILE``: the pipeline file of the commands that read it.
DVC_YAML_OPTION = click.option(
    "--dvc-yaml",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=Path("dvc.yaml"),
    show_default=True,
    help="The pipeline file; its directory is the project root.",
)


@click.command()
@DVC_YAML_OPTION
@click.option("--write", is_flag=True, help="Rewrite the code deps instead of checking them.")
@click.option(
    "--reads",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="A $CAPSNET_PARAMS_TRACE file of a traced `dvc repro`: check instead that every "
    "params key each stage read is listed in its params.",
)
def main(dvc_yaml: Path, write: bool, reads: Path | None) -> None:
    """Check (or rewrite) that each stage's code deps are its command's import closure."""
    root = dvc_yaml.resolve().parent
    if reads is not None:
        from capsnet.config.yamlfile import read_yaml

        params = read_yaml(root / "params.yaml") or {}
        problems = unlisted_reads(reads.read_text(), load_stages(dvc_yaml), params)
        for line in problems:
            click.echo(line)
        if problems:
            raise click.exceptions.Exit(1)
        click.echo(f"{dvc_yaml}: every params key a stage read is in its params")
        return
    try:
        if write:
            from capsnet.io.files import atomic_write_text

            text = dvc_yaml.read_text()
            new = rewrite(root, text)
            if new != text:
                atomic_write_text(dvc_yaml, new)
            click.echo(f"{dvc_yaml}: {'rewritten' if new != text else 'already exact'}")
            return
        problems = differences(root, load_stages(dvc_yaml))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    for line in problems:
        click.echo(line)
    if problems:
        raise click.exceptions.Exit(1)
    click.echo(f"{dvc_yaml}: every stage's code deps are its import closure")


if __name__ == "__main__":
    main()
