"""What a DVC user does after `dvc repro`, on the real dvc.yaml and params.yaml shrunk to a
tiny run (test_dvc_repro's settings) in a temporary git repository: queue an experiment and
run the queue (it runs in a temporary copy of the workspace, so its W&B runs must land in
the main one), compare it with `dvc exp show --only-changed` and `dvc metrics diff` in a
normal terminal, and push the models to a local DVC remote and pull them into a fresh clone.
The sweep is not trained again where nothing it reads changed: the queued experiment skips
it, and `dvc repro` restores its deleted outputs from Tune's state."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from test_dvc_repro import run

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

#: The experiment of docs/guides/pipeline.md: one seed per model instead of two.
EXPERIMENT = "one-seed"


def documented(root: Path, *prefix: str) -> list[str]:
    """The command of docs/guides/pipeline.md that starts with ``prefix`` (its words)."""
    from test_docs_commands import commands

    found = [
        w
        for w in commands(root / "docs" / "guides" / "pipeline.md")
        if w[: len(prefix)] == [*prefix]
    ]
    assert found, f"docs/guides/pipeline.md has no `{' '.join(prefix)}` command"
    return found[0]


def _tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def project(shrunk_project):
    """The shrunk pipeline after `dvc repro`, committed (tests/conftest.py): its folder, the
    dvc command and the environment."""
    work, dvc, env, _log = shrunk_project
    return work, dvc, env


def test_a_queued_experiment_keeps_its_runs_and_compares_in_a_terminal(project, repo_root):
    """The docs' commands, as written: queue, run the queue, read its status, compare."""
    work, dvc, env = project
    name = EXPERIMENT
    tune_state = _tree_digest(work / "runs" / "ray")
    assert any(p.endswith("result.json") for p in tune_state)  # the sweep's trials
    queue = documented(repo_root, "dvc", "exp", "run", "--queue")
    assert name in queue
    run([dvc, *queue[1:]], work, env)
    log = run([dvc, *documented(repo_root, "dvc", "exp", "run", "--run-all")[1:]], work, env)
    assert "Ran experiment(s)" in log
    status = run([dvc, *documented(repo_root, "dvc", "queue", "status")[1:]], work, env)
    assert any(name in line and "Success" in line for line in status.splitlines()), status

    # train.seeds is no input of the sweep: the experiment did not train it again, and
    # Tune's state in the main workspace is as the baseline left it
    logs = run([dvc, "queue", "logs", name], work, env)
    assert "Running stage 'train'" in logs, logs[-3000:]
    assert "Running stage 'sweep'" not in logs and "Running stage 'sweep_smallnorb'" not in logs
    assert _tree_digest(work / "runs" / "ray") == tune_state

    # the experiment's W&B runs are in the main workspace, named after it
    from pipeline import tracking

    runs = [tracking.read_run_info(d) for d in tracking.offline_runs(work / "runs").values()]
    mine = [r for r in runs if r["config"].get("dvc_experiment") == name]
    assert mine and all(r["group"].endswith(f"/{name}/" + r["job_type"]) for r in mine)
    assert {r["job_type"] for r in mine} >= {"eval", "comparison"}  # sweep W&B is off here
    assert not {r["run_id"] for r in mine} & {
        r["run_id"] for r in runs if r["config"].get("dvc_experiment") is None
    }

    show = documented(repo_root, "dvc", "exp", "show")
    shown = run([dvc, *show[1:], "--no-pager"], work, {**env, "COLUMNS": "120"})
    (work / "exp-show.txt").write_text(shown)
    assert name in shown and "rot35" in shown and "train.seeds" in shown, shown
    assert max(len(line) for line in shown.splitlines()) <= 120, shown
    assert "…" not in shown, shown

    diff = documented(repo_root, "dvc", "metrics", "diff")
    changed = json.loads(run([dvc, *diff[1:], "--json"], work, env))["eval/summary.json"]
    assert all(isinstance(v["new"], (int, float, type(None))) for v in changed.values())
    # every model whose baseline mean held both seeds holds one in the experiment (a seed
    # left out as a failed run, at chance while the other learned, is no change of it)
    baseline = json.loads((work / "eval" / "summary.json").read_text())
    both = [m for m, row in baseline.items() if isinstance(row, dict) and row.get("n_seeds") == 2]
    assert both and all(
        changed[f"{m}.n_seeds"] == {"old": 2, "new": 1, "diff": -1} for m in both
    ), (both, changed)

    plots = documented(repo_root, "dvc", "plots", "diff")
    run([dvc, *plots[1:]], work, env)
    page = work / plots[plots.index("-o") + 1] / "index.html"
    assert "VEGA_FILES" in page.read_text()


def test_deleted_sweep_outputs_come_back_from_the_tune_state(project):
    """An unchanged sweep is restored, not retrained: its outputs are `persist` (no
    run-cache entry), so the stage runs and restores the finished Tune experiment."""
    work, dvc, env = project
    outputs = {p: (work / p).read_bytes() for p in ("sweep/results.csv", "sweep/best.json")}
    results = {k: v for k, v in _tree_digest(work / "runs" / "ray").items() if "result" in k}
    for folder in ("sweep", "sweep-smallnorb"):
        shutil.rmtree(work / folder)
    run([dvc, "repro", "sweep", "sweep_smallnorb"], work, env)
    assert {p: (work / p).read_bytes() for p in outputs} == outputs
    assert (work / "sweep-smallnorb" / "plots" / "ablation.csv").is_file()
    after = _tree_digest(work / "runs" / "ray")
    assert {k: after.get(k) for k in results} == results  # no trial trained again
    assert "Data and pipelines are up to date." in run([dvc, "status"], work, env)


def test_models_pushed_to_a_local_remote_are_pulled_into_a_fresh_clone(project, tmp_path):
    work, dvc, env = project
    remote = tmp_path / "remote"
    run([dvc, "remote", "add", "--local", "-d", "shared", str(remote)], work, env)
    run([dvc, "push", "train"], work, env)
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(work), str(clone)], tmp_path, env)
    assert not (clone / "models").exists()
    run([dvc, "remote", "add", "--local", "-d", "shared", str(remote)], clone, env)
    run([dvc, "pull", "train"], clone, env)
    assert _tree_digest(clone / "models") == _tree_digest(work / "models")
    status = run([dvc, "status", "train"], clone, env)
    assert "changed outs" not in status
