"""A DVC stage's results come from the code and params DVC records for it.

Every stage runs ``python -m capsnet``, so a queued or ``--temp`` experiment runs its own
copy of the code, never the workspace's or the installed one; the sweep names its Tune
experiment by all the code its stage depends on (its DVC code deps); a stage whose
params.yaml changed while it ran fails instead of letting DVC record values its outputs
were not made from; a $CAPSNET_PARAMS_TRACE that cannot take the reads is refused in one
line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from faulthelpers import Outcome, judge, run_bounded, snapshot

#: ``capsnet ARGS`` whose params file is rewritten right after the command loads it, as a
#: user editing params.yaml while the stage runs.
EDIT_AFTER_LOAD = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from capsnet import config

    real, edited = config.load, sys.argv[1]

    def load(path="params.yaml"):
        params = real(path)
        Path(path).write_text(edited)
        return params

    config.load = load
    sys.argv = ["capsnet", *sys.argv[2:]]
    from capsnet.cli import main

    main()
    """
)

DISABLED = "data:\n  smallnorb:\n    enabled: false\n"


def _edited_stage(tmp_path: Path, new_params: str) -> Outcome:
    (tmp_path / "params.yaml").write_text(DISABLED)
    args = ["data", "download", "smallnorb", "--params", "params.yaml", "--data-root", "data"]
    env = {**os.environ, "DVC_STAGE": "download_smallnorb"}
    env.pop("CAPSNET_PARAMS_TRACE", None)
    done = subprocess.run(
        [sys.executable, "-c", EDIT_AFTER_LOAD, new_params, *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    return Outcome(done.returncode, done.stderr, "Traceback" in done.stderr)


def test_params_edited_while_a_stage_runs_fail_it(tmp_path, tally):
    """The stage wrote smallNORB's DISABLED marker; params.yaml now switches it on, which
    DVC would record beside that output. The stage fails, naming the file and the key."""
    outcome = _edited_stage(tmp_path, DISABLED.replace("false", "true"))
    judge(tally, outcome, fault=True, code=1, names=("params.yaml", "data.smallnorb.enabled"))
    assert "changed from False to True while the stage ran" in outcome.lines[0]


def test_a_params_trace_naming_a_directory_is_refused_in_one_line(tmp_path, tally):
    (tmp_path / "params.yaml").write_text(DISABLED)
    before = snapshot(tmp_path)
    env = {"CAPSNET_PARAMS_TRACE": str(tmp_path), "DVC_STAGE": "download_smallnorb"}
    args = ["data", "download", "smallnorb", "--data-root", "data"]
    done = run_bounded(args, timeout=120, env=env, cwd=tmp_path)
    judge(tally, done, before=before, after=snapshot(tmp_path), code=1)
    assert "$CAPSNET_PARAMS_TRACE names a directory" in done.lines[0]


def test_the_sweep_key_covers_every_code_dep_of_its_stage(tmp_path, tally, repo_root):
    """Editing pipeline/sweep/stage.py (space, scheduler) names a new Tune experiment, so a rerun
    never restores the old one; code no sweep stage imports changes nothing."""
    from pipeline.dvc import deps as dvc_deps
    from pipeline.sweep import stage as sweep

    stages = dvc_deps.load_stages(repo_root / "dvc.yaml")
    packages = dvc_deps.project_packages(repo_root)
    for name in ("sweep", "sweep_smallnorb"):
        deps = {dvc_deps.dep_path(e) for e in stages[name]["deps"]}
        assert sweep.code_files(repo_root) == sorted(
            d for d in deps if dvc_deps.is_code(d, packages)
        )

    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("capsnet", "pipeline"):
        shutil.copytree(repo_root / package, tmp_path / package, ignore=ignore)
    before = sweep.code_digest(tmp_path)
    with open(tmp_path / "pipeline" / "report.py", "a") as fh:
        fh.write("\n# no sweep stage imports this\n")
    assert sweep.code_digest(tmp_path) == before
    with open(tmp_path / "pipeline" / "sweep.py", "a") as fh:
        fh.write("\n# an edited search space\n")
    tally.inputs += 1
    assert sweep.code_digest(tmp_path) != before


def _git_dvc(work: Path, *args: str) -> str:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
    }  # fmt: skip
    for key in ("DVC_STAGE", "DVC_ROOT", "DVC_EXP_NAME", "CAPSNET_PARAMS_TRACE"):
        env.pop(key, None)
    done = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_queued_and_temp_experiments_run_their_own_code(tmp_path, tally, repo_root):
    """A one-stage pipeline whose command prints capsnet's help (its text is in
    capsnet/cli/__init__.py) the way dvc.yaml runs capsnet: queued at v1, run after the workspace
    moved on to v2, it prints v1; `--temp` prints the workspace's v2. The installed
    capsnet (or $PYTHONPATH's) has neither."""
    import yaml

    pytest.importorskip("dvc")
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent))
    if dvc is None or shutil.which("git") is None:
        pytest.skip("dvc or git is not installed")
    publish = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]["publish"]["cmd"]
    runs_capsnet = publish[: publish.index("capsnet") + len("capsnet")]
    work = tmp_path / "repo"
    shutil.copytree(
        repo_root / "capsnet", work / "capsnet", ignore=shutil.ignore_patterns("__pycache__")
    )
    stage = {"cmd": f"{runs_capsnet} --help > which.txt", "deps": ["capsnet/cli/__init__.py"]}
    stage["outs"] = [{"which.txt": {"cache": False}}]
    (work / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"which": stage}}))
    cli = work / "capsnet" / "cli" / "__init__.py"
    text = cli.read_text()
    assert "Capsule networks:" in text
    cli.write_text(text.replace("Capsule networks:", "Capsule networks (v1):"))
    _git_dvc(work, "git", "init", "-q", "-b", "main")
    _git_dvc(work, dvc, "init", "-q")
    _git_dvc(work, "git", "add", "-A")
    _git_dvc(work, "git", "commit", "-q", "-m", "v1")

    _git_dvc(work, dvc, "exp", "run", "--queue", "-n", "queued")
    cli.write_text(text.replace("Capsule networks:", "Capsule networks (v2):"))
    _git_dvc(work, dvc, "exp", "run", "--run-all")
    _git_dvc(work, dvc, "exp", "run", "--temp", "-n", "temp")

    refs = _git_dvc(work, "git", "for-each-ref", "--format=%(refname)", "refs/exps").split()
    printed = {}
    for name in ("queued", "temp"):
        (ref,) = [r for r in refs if r.endswith(f"/{name}")]
        printed[name] = _git_dvc(work, "git", "show", f"{ref}:which.txt")
    tally.inputs += 2
    assert "Capsule networks (v1):" in printed["queued"], printed["queued"]
    assert "Capsule networks (v2):" in printed["temp"], printed["temp"]
