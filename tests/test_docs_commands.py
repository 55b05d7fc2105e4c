"""Every command in README.md and docs/**/*.md, checked without running it: each `capsnet`
command parses with its click command (names, options, choices and types as a user would
type them), each `dvc` command parses with DVC's own parser and names stages and params
that exist, each `python -m` names an importable module. Commands with placeholders
(`<bucket>`) are skipped; tests/test_dvc_experiments.py runs the experiment commands."""

from __future__ import annotations

import importlib.util
import itertools
import re
import shlex
import shutil
from pathlib import Path

import click
import pytest
import yaml

from capsnet.cli import COMMANDS, load_command

FENCE = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


#: Shell words that lead a command inside a loop or a test, dropped before the program.
SHELL_KEYWORDS = {"do", "done", "then", "else", "fi", "for", "while", "if"}


def _split(line: str) -> list[list[str]]:
    """The simple commands of one shell line (split at ;, &&, ||, |)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.commenters = "#"
    lexer.whitespace_split = True
    parts, part = [], []
    for word in [*lexer, ";"]:
        if word and set(word) <= set(";&|"):
            if part:
                parts.append(part)
            part = []
        else:
            part.append(word)
    return parts


def _instantiate(words: list[str]) -> list[str]:
    """A loop's command with its variables given a value (``$seed`` -> 0; ``--$d`` ->
    the first value the loop names for ``d``)."""
    return [re.sub(r"\$\{?(\w+)\}?", lambda m: VALUES.get(m.group(1), "0"), w) for w in words]


VALUES: dict[str, str] = {}


def commands(path: Path) -> list[list[str]]:
    """The commands of ``path``'s bash blocks: continuations joined, comments dropped, one
    entry per simple command; loop variables take the loop's first value."""
    found = []
    for block in FENCE.findall(path.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            for words in _split(line):
                while words and (words[0] in SHELL_KEYWORDS - {"for"} or "=" in words[0]):
                    words = words[1:]  # `do`, `then`, an environment assignment
                if words[:1] == ["for"] and len(words) > 3 and words[2] == "in":
                    VALUES[words[1]] = words[3]
                    continue
                if words:
                    found.append(_instantiate(words))
    return found


def all_commands(root: Path) -> list[tuple[str, list[str]]]:
    return [
        (f"{path.relative_to(root)}: {' '.join(words)}", words)
        for path in documents(root)
        for words in commands(path)
    ]


ROOT = Path(__file__).resolve().parents[1]
CASES = all_commands(ROOT)


def _params_keys(root: Path) -> set[str]:
    def walk(node, prefix=""):
        for key, value in node.items():
            yield prefix + key
            if isinstance(value, dict):
                yield from walk(value, prefix + key + ".")

    return set(walk(yaml.safe_load((root / "params.yaml").read_text())))


def check_capsnet(words: list[str], tmp_path: Path) -> None:
    assert len(words) > 1 and words[1] in COMMANDS, f"no capsnet command {words[1:2]}"
    command = load_command(words[1])
    try:
        command.make_context(words[1], words[2:], resilient_parsing=False)
    except click.BadParameter as exc:
        if "'--out'" in str(exc.param_hint) or "'--figures'" in str(exc.param_hint):
            return  # an output path of the reader's machine, checked when run
        raise
    except click.exceptions.Exit:
        return  # --help and --version


def check_script(path: str, args: list[str]) -> None:
    """A documented ``python SCRIPT ARGS``: the script exists and, when it is a click
    command, parses ARGS."""
    script = ROOT / path
    assert script.is_file(), f"no script {path}"
    spec = importlib.util.spec_from_file_location(f"_documented_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    commands = [v for v in vars(module).values() if isinstance(v, click.Command)]
    for command in commands[:1]:
        try:
            command.make_context(script.name, list(args), resilient_parsing=False)
        except click.BadParameter as exc:
            assert "does not exist" in str(exc), exc  # a folder of the reader's machine
        except click.exceptions.Exit:
            return


def check_dvc(words: list[str], root: Path) -> None:
    from dvc.cli import parse_args

    args = parse_args(words[1:])
    stages = set(yaml.safe_load((root / "dvc.yaml").read_text())["stages"])
    keys = _params_keys(root)
    for target in getattr(args, "targets", None) or []:
        if not target.startswith("-") and "/" not in target and "." not in target:
            assert target in stages, f"dvc.yaml has no stage {target!r}"
    for setting in getattr(args, "set_param", None) or []:
        key = setting.split("=", 1)[0]
        assert key in keys, f"params.yaml has no {key!r}"


@pytest.mark.parametrize(("where", "words"), CASES, ids=[c[0][:90] for c in CASES])
def test_documented_command_is_valid(where, words, tmp_path, monkeypatch):
    if any("<" in w for w in words):
        pytest.skip("a placeholder for the reader's own value")
    monkeypatch.chdir(tmp_path)
    program = words[0]
    if program == "capsnet":
        shutil.copytree(ROOT / "profiles", tmp_path / "profiles")  # run from the repository
        check_capsnet(words, tmp_path)
    elif program == "dvc":
        check_dvc(words, ROOT)
    elif program in ("python", "python3") and words[1:2] == ["-m"]:
        module = words[2]
        assert importlib.util.find_spec(module) is not None, f"no module {module}"
    elif program in ("python", "python3") and words[1].endswith(".py"):
        check_script(words[1], words[2:])
    else:
        assert program in {"bash", "git", "export", "cd", ".", "pip", "ray", "kubectl",
                           "docker", "wandb", "tensorboard", "ls", "du", "mkdir", "cat",
                           "ruff", "npm", "nvidia-smi", "sbatch", "time", "env"}, words  # fmt: skip


def test_the_docs_name_at_least_the_main_commands():
    programs = {words[0] for _, words in CASES}
    assert {"capsnet", "dvc"} <= programs
    assert any(words[:3] == ["dvc", "exp", "show"] for _, words in CASES)


def _stage_outputs(root: Path) -> set[str]:
    """Every path a dvc.yaml stage writes (outs, metrics, plots)."""
    found = set()
    for stage in yaml.safe_load((root / "dvc.yaml").read_text())["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind, []):
                found.add(next(iter(entry)) if isinstance(entry, dict) else entry)
    return found


def test_documented_commands_write_only_where_git_ignores_or_a_stage_writes():
    """A reader who runs a documented command leaves no untracked file in the checkout."""
    import subprocess

    outputs = _stage_outputs(ROOT)
    written = []
    for where, words in CASES:
        if words[0] != "capsnet" or any("<" in w for w in words):
            continue
        for option, value in itertools.pairwise(words):
            if option in ("--out", "--figures", "--metrics") and not value.startswith("/"):
                written.append((where, value))
    assert written
    for where, value in written:
        path = Path(value)
        if any(path in (Path(out), *Path(out).parents) or Path(out) in path.parents
               for out in outputs):  # fmt: skip
            continue  # a stage's output, inside one or the folder that holds them
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, check=False
        )
        assert ignored.returncode == 0, f"{where}: {value} is neither ignored nor a stage output"


#: Programs the docs tell the reader to run that neither this project nor DVC provides.
VIEWERS = ("tensorboard",)


def test_every_viewer_the_docs_name_comes_with_the_install(repo_root):
    """`tensorboard --logdir runs/ray` (docs/guides/sweeps-and-clusters.md) works after
    `.ci/setup`: the program is declared in an extra of pyproject.toml and installed."""
    import sys

    import tomllib

    text = "\n".join(p.read_text() for p in documents(repo_root))
    extras = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    declared = {re.split(r"[<>=\[ ;]", r)[0] for rs in extras.values() for r in rs}
    for program in VIEWERS:
        if f"`{program} " not in text:
            continue
        assert program in declared, f"the docs name {program}; no extra installs it"
        assert shutil.which(program, path=str(Path(sys.executable).parent)), program
