"""`dvc repro` of every stage of dvc.yaml in a temporary copy of the repository, on the real
params.yaml shrunk to a tiny run; afterwards every declared output exists and `dvc status`
has nothing to do. smallNORB runs on the stand-in (source auto with no official files in the
mirror: smallnorb-synth, rendered small), every smallNORB stage with it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import paramshelpers
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

#: What a stage needs from the repository: the code its deps name and the plot templates.
COPIED_DIRS = ("capsnet", "pipeline", "benchmarks")
COPIED_FILES = ("dvc.yaml", "pyproject.toml", "README.md", ".dvcignore")

#: params.yaml keys set for the tiny run (each key must exist in the real file).
SHRINK = {
    "data.affnist.synth.limit": 200,
    "sweep.space.routing_iterations": 1,
    "sweep.space.augment": {"grid": ["none", "shift"]},
    "sweep.epochs": 1,
    "sweep.batch_size": 64,
    "sweep.train_size": 256,
    "sweep.val_size": 128,
    "sweep.wandb.mode": "disabled",
    "train.epochs": 1,
    "train.batch_size": 64,
    "train.train_size": 256,
    "train.val_size": 128,
    "train.extra_train_size": 128,
    "train.seeds": 2,
    "train.equal_time": False,  # its arm: tests/pipeline/test_train_final.py
    "evaluate.limit": 50,
    "evaluate.compile": False,
    "evaluate.angles": [0, 35],
    "evaluate.robustness.epsilons": [0.1],
    "evaluate.robustness.bim_steps": 2,
    "evaluate.robustness.limit": 16,
    "evaluate.equivariance.angles": [-30, 0, 30],
    "evaluate.equivariance.limit": 16,
    "publish.mode": "offline",
    "data.smallnorb.synth.side": 16,  # rendered small, prepared at data.smallnorb.size
    "data.smallnorb.size": 24,  # 48 / 32: its `dvc repro` 254 CPU-s, 24 / 20: 197
    "data.smallnorb.crop": 20,  # em-capsnet-small: 3x3 then 1x1 convolutional capsules
    "data.smallnorb.synth.lightings": 1,  # 4,050 images per split: every view, one lighting
    "smallnorb_sweep.epochs": 1,
    "smallnorb_sweep.train_size": 64,
    "smallnorb_sweep.val_size": 64,
    "smallnorb_sweep.wandb.mode": "disabled",
    "smallnorb_sweep.compile": False,
    "smallnorb_train.epochs": 1,
    "smallnorb_train.train_size": 64,
    "smallnorb_train.val_size": 64,
    "smallnorb_train.test_size": 64,
    "smallnorb_train.seeds": 1,  # two seeds: train.seeds (the same code)
    "smallnorb_train.compile": False,
    "viewpoints.epochs": 1,
    "viewpoints.train_limit": 64,
    "viewpoints.test_limit": 64,
    "viewpoints.tolerance": 0.02,  # at least one of the 64 images
    "viewpoints.compile": False,
}


def shrink(text: str) -> str:
    """The real params.yaml with the SHRINK settings; smallNORB on, from the stand-in."""
    import yaml

    norb = yaml.safe_load(text)["data"]["smallnorb"]
    assert norb["enabled"] is True and norb["source"] == "auto"
    return paramshelpers.shrink(text, SHRINK)


def declared_outputs(dvc_yaml: Path) -> dict[str, list[str]]:
    """Every stage's outs, metrics and plots paths."""
    import yaml

    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]
    outputs = {}
    for name, stage in stages.items():
        entries = [e for kind in ("outs", "metrics", "plots") for e in stage.get(kind) or []]
        outputs[name] = [next(iter(e)) if isinstance(e, dict) else e for e in entries]
    return outputs


def run(args, cwd, env):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


def tools() -> str:
    """The dvc command beside this Python; skips without dvc, Ray or the capsnet command."""
    pytest.importorskip("dvc")
    pytest.importorskip("ray")
    bin_dir = Path(sys.executable).parent
    dvc = shutil.which("dvc", path=str(bin_dir))
    if dvc is None or shutil.which("capsnet", path=str(bin_dir)) is None:
        pytest.skip("dvc or the capsnet command is not installed")
    return dvc


def shrunk_copy(work: Path, repo_root: Path, mnist_mirror: Path, files=()) -> tuple[str, dict]:
    """The code, dvc.yaml and shrunk params.yaml of the repository (and ``files``) copied
    to ``work``; (the dvc command, the environment the stages run in)."""
    dvc = tools()
    for name in COPIED_DIRS:
        if (repo_root / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(repo_root / name, work / name, ignore=ignore)
    for name in (*COPIED_FILES, *files):
        shutil.copy(repo_root / name, work / name)
    (work / "params.yaml").write_text(shrink((repo_root / "params.yaml").read_text()))
    return dvc, stage_env(work, mnist_mirror)


def stage_env(work: Path, mnist_mirror: Path) -> dict:
    """The environment the stages of the copy at ``work`` run in (git's author included);
    every params read is traced to ``work``/../params-read.tsv."""
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "CAPSNET_MIRROR": str(mnist_mirror),
        "DVC_NO_ANALYTICS": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "WANDB_MODE": "offline",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "CAPSNET_PARAMS_TRACE": str(work.parent / "params-read.tsv"),
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
    }  # fmt: skip
    for key in ("CAPSNET_DATA", "RAY_ADDRESS", "WANDB_API_KEY", "DVC_ROOT", "DVC_EXP_NAME"):
        env.pop(key, None)
    return env


def test_dvc_repro_of_every_stage_then_nothing_to_do(shrunk_project):
    work, dvc, env, log = shrunk_project  # `dvc repro` in a copy (tests/conftest.py)
    outputs = declared_outputs(work / "dvc.yaml")
    for stage, paths in outputs.items():
        assert f"Running stage '{stage}'" in log, stage
        for path in paths:
            assert (work / path).exists(), f"stage {stage}: no {path}"

    best = json.loads((work / "sweep" / "best.json").read_text())
    assert 0 <= best["metrics"]["val_accuracy"] <= 1
    model = best["config"]["model"]
    trained = {p.stem for p in (work / "models").glob("*.pt")}
    assert {model, f"{model}@multimnist", f"{model}@expanded-mnist"} <= trained
    metrics = json.loads((work / "eval" / "metrics.json").read_text())
    assert trained <= set(metrics) and "viewpoints" in metrics
    assert (work / "data/raw/smallnorb/SOURCE.txt").read_text().strip() == "smallnorb-synth"
    for ran in ("data/prepared/smallnorb", "sweep-smallnorb", "models-smallnorb"):
        assert not (work / ran / "DISABLED.txt").exists(), ran
    norb_best = json.loads((work / "sweep-smallnorb" / "best.json").read_text())
    assert norb_best["config"]["routing_iterations"] in (2, 3)
    assert any("em-capsnet" in m for m in metrics), sorted(metrics)
    norb_entries = [
        e["smallnorb"]
        for e in metrics.values()
        if isinstance(e, dict) and "accuracy" in e.get("smallnorb", {})
    ]
    assert norb_entries and all(e.get("source") == "smallnorb-synth" for e in norb_entries)
    assert (work / "eval" / "report.html").stat().st_size > 0

    status = run([dvc, "status"], work, env)
    assert "Data and pipelines are up to date." in status, status

    # every params key a stage read is one of its params (capsnet.config.trace)
    import yaml

    from pipeline.dvc import deps as dvc_deps

    read = (work.parent / "params-read.tsv").read_text()
    assert {line.split("\t")[0] for line in read.splitlines()} >= {"sweep", "train", "evaluate"}
    stages = dvc_deps.load_stages(work / "dvc.yaml")
    params = yaml.safe_load((work / "params.yaml").read_text())
    unlisted = dvc_deps.unlisted_reads(read, stages, params)
    assert unlisted == [], "\n".join(unlisted)

    # a code edit reruns exactly the stages whose commands import the file
    assert changed_stages(work, "pipeline/publish/report.py", dvc, env) == {"publish"}
    assert {"sweep", "train", "evaluate"} <= changed_stages(work, "capsnet/nn/losses.py", dvc, env)


def changed_stages(work: Path, edited: str, dvc: str, env) -> set[str]:
    """The stages `dvc status` lists after a comment is appended to ``edited`` (restored)."""
    path = work / edited
    original = path.read_text()
    path.write_text(original + "\n# an edit\n")
    try:
        return set(json.loads(run([dvc, "status", "--json"], work, env)))
    finally:
        path.write_text(original)
