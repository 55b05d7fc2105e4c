"""Stage outputs survive what is refused: a `dvc exp run -S` with a bad value leaves the
last good files of every stage in place (each output is `persist` or cached), a target
that cannot be replaced changes none of them, a directory holding foreign files is never
replaced, and a models/ORIGIN.json whose text would break the README block publishes
nothing."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from faulthelpers import invoke, invoke_bounded, judge, snapshot
from test_readme import METRICS

#: The git-tracked files of the stages below, as a last good run left them.
LAST_GOOD = {
    "eval/metrics.json": "{}\n",
    "eval/summary.json": "{}\n",
    "eval/rotation.csv": "angle,model,accuracy,std,group,kind\n",
    "eval/figures/rotation.png": "last good figure",
    "eval/report.html": "<p>last good</p>\n",
    "eval/results.md": "last good table\n",
    "eval/published.json": "{}\n",
    "sweep/best.json": "{}\n",
    "sweep/results.csv": "trial_id,final_val_accuracy\n",
    "sweep/plots/by_routing.csv": "routing_iterations,val_accuracy\n",
    "sweep/plots/by_augment.csv": "augment,val_accuracy\n",
    "models-viewpoints.csv": "kind,seed,model,epoch,familiar_error,novel_error\n",
}
#: The stages whose refused runs are tried.
STAGES = ("evaluate", "publish", "sweep", "viewpoints")


def _git(work: Path, *args: str) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    subprocess.run(["git", *args], cwd=work, check=True, capture_output=True, env=env)


@pytest.fixture
def stage_repo(tmp_path, repo_root) -> tuple[Path, str]:
    """A git + DVC repository with the real params.yaml and the real STAGES (their deps
    left out: the commands are refused before reading any), their outputs as a last good
    run left them, newer than the commit; (folder, dvc command)."""
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    if dvc is None or shutil.which("git") is None:
        pytest.skip("dvc or git is not installed")
    work = tmp_path / "repo"
    work.mkdir()
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    kept = {n: {k: v for k, v in stages[n].items() if k != "deps"} for n in STAGES}
    (work / "dvc.yaml").write_text(yaml.safe_dump({"stages": kept}, sort_keys=False))
    shutil.copy(repo_root / "params.yaml", work / "params.yaml")
    for path in LAST_GOOD:
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text("committed\n")
    _git(work, "init", "-q", "-b", "main")
    subprocess.run([dvc, "init", "-q"], cwd=work, check=True, capture_output=True)
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "baseline")
    for path, text in LAST_GOOD.items():
        (work / path).write_text(text)
    return work, dvc


@pytest.mark.parametrize(
    "setting, stage",
    [
        ("evaluate.limit=-5", "evaluate"),
        ("publish.mode=bogus", "publish"),
        ("sweep.epochs=0", "sweep"),
        ("viewpoints.checks_per_epoch.cnn=9223372036854775807", "viewpoints"),
    ],
)
def test_a_refused_dvc_exp_run_keeps_the_last_good_outputs(tally, stage_repo, setting, stage):
    """DVC deletes a stage's outputs before its command runs unless they are `persist`;
    the command replaces them only when it succeeds."""
    work, dvc = stage_repo
    watched = [work / p for p in ("eval", "sweep", "models-viewpoints.csv")]
    before = snapshot(*watched)
    done = subprocess.run(
        [dvc, "exp", "run", "-s", stage, "-S", setting],
        cwd=work,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "DVC_STAGE"},
    )
    after = snapshot(*watched)
    tally.inputs += 1
    tally.partial_outputs += before != after
    assert done.returncode != 0, done.stdout + done.stderr
    assert setting.split("=")[0] in done.stderr + done.stdout, done.stderr
    assert "Traceback" not in done.stderr
    assert after == before


def test_every_output_a_refused_run_could_delete_is_persist_or_cached(repo_root):
    """DVC deletes a stage's outputs before its command runs: each must be `persist` (the
    command replaces it only on success) or cached (`dvc checkout` restores it)."""
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    exposed = [
        f"{name}: {path}"
        for name, stage in stages.items()
        for kind in ("outs", "metrics", "plots")
        for entry in stage.get(kind, [])
        for path, options in (entry.items() if isinstance(entry, dict) else [(entry, {})])
        if (options or {}).get("cache", True) is False and not (options or {}).get("persist")
    ]
    assert exposed == []


def _publish_dir(tmp_path: Path, monkeypatch) -> Path:
    """A working directory the publish stage can run in: eval/metrics.json, params.yaml."""
    monkeypatch.chdir(tmp_path)
    Path("eval/figures").mkdir(parents=True)
    Path("eval/metrics.json").write_text(json.dumps(METRICS))
    Path("params.yaml").write_text("publish:\n  mode: disabled\n  dir: runs\n")
    return tmp_path


BAD_ORIGINS = {
    "newline-in-machine": ({"git_commit": "0123abcd", "machine": "CPU\nmore"}, "machine"),
    "marker-in-machine": (
        {"git_commit": "0123abcd", "machine": "<!-- results:end -->"},
        "machine",
    ),
    "line-separator": ({"machine": "CPU\u2028# heading"}, "machine"),
    "commit-not-hex": ({"git_commit": "main\n<!-- results:begin -->"}, "git_commit"),
    "commit-a-number": ({"git_commit": 1234567}, "git_commit"),
    "a-directory": (None, "not a file"),
}


@pytest.mark.parametrize("case", sorted(BAD_ORIGINS))
def test_a_bad_origin_record_publishes_nothing(tmp_path, monkeypatch, tally, case):
    from pipeline import provenance

    record, named = BAD_ORIGINS[case]
    _publish_dir(tmp_path, monkeypatch)
    origin = Path("models") / provenance.ORIGIN_FILE
    if record is None:
        origin.mkdir(parents=True)
    else:
        origin.parent.mkdir()
        origin.write_text(json.dumps(record))
    before = snapshot(tmp_path / "eval")
    done = invoke("publish", "--params", "params.yaml")
    judge(tally, done, before=before, after=snapshot(tmp_path / "eval"), code=1,
          names=(str(origin), named))  # fmt: skip


@pytest.mark.parametrize("stage", ["evaluate-stage", "publish"])
def test_an_output_that_cannot_be_replaced_changes_none(
    tmp_path, monkeypatch, tally, prepared_root, lenet_checkpoint, stage
):
    """A directory where a file output goes: refused before any output is replaced."""
    _publish_dir(tmp_path, monkeypatch)
    Path("models").mkdir()
    shutil.copy(lenet_checkpoint, "models/lenet5.pt")
    Path("eval/figures/old.png").write_text("old figure")
    Path("eval/report.html").write_text("old report")
    blocked = Path("eval/rotation.csv" if stage == "evaluate-stage" else "eval/results.md")
    blocked.mkdir()
    Path("params.yaml").write_text(
        "publish:\n  mode: disabled\n  dir: runs\nevaluate:\n  datasets: [mnist]\n  limit: 8\n"
        "  viewpoints_dir: ''\n  robustness: {enabled: false}\n  equivariance: {enabled: false}\n"
    )
    before = snapshot(tmp_path / "eval")
    data = ["--data-root", prepared_root] if stage == "evaluate-stage" else []
    done = invoke(stage, "--params", "params.yaml", *data)
    judge(tally, done, before=before, after=snapshot(tmp_path / "eval"), code=1,
          names=(str(blocked), "is a directory"))  # fmt: skip


def _viewpoints(model: str = "em-capsnet-small", kind: str = "azimuth", skipped: str = "off"):
    scored = {"model": model, "epoch": 3, "familiar_error": 0.04, "novel_error": 0.15}
    cnn = {"model": "smallnorb-cnn", "epoch": 3, "familiar_error": 0.04, "novel_error": 0.2}
    entry = {"models": {"capsules": scored, "cnn": cnn}, "target_familiar_error": 0.04,
             "gap": 0.0, "matched": True}  # fmt: skip
    return {"kinds": {kind: entry, "elevation": {"skipped": skipped}}}


#: name -> (metrics.json with one hostile string, the field the error names)
HOSTILE_METRICS = {
    "viewpoint-model-ends-the-block": (
        {**METRICS, "viewpoints": _viewpoints(model="x <!-- results:end -->")}, "model"),
    "viewpoint-model-with-a-newline": (
        {**METRICS, "viewpoints": _viewpoints(model="em\n# heading")}, "model"),
    "kind-with-a-cell": ({**METRICS, "viewpoints": _viewpoints(kind="az | imuth")}, "kind"),
    "skip-reason-with-a-tag": (
        {**METRICS, "viewpoints": _viewpoints(skipped="<script>x</script>")}, "skipped"),
    "entry-name-with-a-cell": (
        {**{k: v for k, v in METRICS.items() if k != "lenet5"}, "le|net": METRICS["lenet5"]},
        "a key"),
    "line-separator-in-a-label": (
        {**METRICS, "viewpoints": {"skipped": "off\u2028<!-- results:begin -->"}}, "skipped"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE_METRICS))
def test_metrics_text_that_would_break_the_readme_publishes_nothing(
    tmp_path, monkeypatch, tally, case
):
    """Every string of metrics.json reaching the README block or the report is checked at
    one boundary: one line naming the file and the field, no output written."""
    metrics, field = HOSTILE_METRICS[case]
    _publish_dir(tmp_path, monkeypatch)
    Path("eval/metrics.json").write_text(json.dumps(metrics))
    before = snapshot(tmp_path / "eval")
    done = invoke("publish", "--params", "params.yaml")
    judge(tally, done, before=before, after=snapshot(tmp_path / "eval"), code=1,
          names=("eval/metrics.json", field))  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE_METRICS))
def test_the_readme_and_report_renderers_refuse_hostile_text(case):
    from capsnet.io.errors import CapsnetError
    from pipeline.publish import readme, report

    metrics, field = HOSTILE_METRICS[case]
    for render in (readme.results_table, lambda m: report.render_html(m, None, {})):
        with pytest.raises(CapsnetError, match=field):
            render(metrics)


def _params(path: Path, sections: dict) -> Path:
    path.write_text(yaml.safe_dump(sections))
    return path


#: An evaluate section that runs in seconds (lenet5 on eight MNIST images).
EVALUATE_SMALL = {
    "out_dir": "out",
    "datasets": ["mnist"],
    "limit": 8,
    "viewpoints_dir": "",
    "extra_models_dirs": [],
    "robustness": {"enabled": False},
    "equivariance": {"enabled": False},
}
#: command -> (its params, the output directory it replaces whole, the key naming it).
DIRECTORY_OUTPUTS = {
    "viewpoints": (
        {"data": {"smallnorb": {"enabled": False}}, "viewpoints": {"out_dir": "out"}},
        "out",
        "viewpoints.out_dir",
    ),
    "train-final": (
        {"data": {"mnist": {"enabled": False}}, "train": {"out_dir": "out"}},
        "out",
        "train.out_dir",
    ),
    "evaluate-stage": (
        {"evaluate": EVALUATE_SMALL},
        "out/figures",
        "evaluate.out_dir",
    ),
}


@pytest.mark.parametrize("command", sorted(DIRECTORY_OUTPUTS))
def test_a_stage_never_replaces_a_directory_holding_foreign_files(
    tmp_path, monkeypatch, request, tally, command
):
    """Every stage's output directory follows one rule: a directory holding files the
    stage does not write is refused (naming the key and a file), never wiped."""
    if command == "train-final":
        pytest.importorskip("ray")
    sections, folder, key = DIRECTORY_OUTPUTS[command]
    monkeypatch.chdir(tmp_path)
    params = _params(tmp_path / "params.yaml", sections)
    data_root = tmp_path / "data"
    if command == "evaluate-stage":  # a stage that would run: a checkpoint and its data
        data_root = request.getfixturevalue("prepared_root")
        Path("models").mkdir()
        shutil.copy(request.getfixturevalue("lenet_checkpoint"), "models/lenet5.pt")
    Path(folder).mkdir(parents=True)
    Path(folder, "notes.txt").write_text("someone else's")
    before = snapshot(tmp_path / "out")
    done = invoke(command, "--params", params, "--data-root", data_root)
    judge(tally, done, before=before, after=snapshot(tmp_path / "out"), code=1,
          names=(key, "notes.txt"))  # fmt: skip


def _fake_viewpoints(monkeypatch) -> None:
    """The viewpoints stage with smallNORB on and no training: each kind yields no entry."""
    import capsnet.data.stages
    import pipeline.viewpoints.stage

    monkeypatch.setattr(capsnet.data.stages, "why_off", lambda *args: None)
    monkeypatch.setattr(pipeline.viewpoints.stage, "run_kind", lambda *args: {})


def test_a_read_only_viewpoints_csv_is_refused_not_replaced(tmp_path, monkeypatch, tally):
    _fake_viewpoints(monkeypatch)
    monkeypatch.chdir(tmp_path)
    params = _params(tmp_path / "params.yaml", {"viewpoints": {"out_dir": "vp"}})
    table = tmp_path / "vp.csv"
    table.write_text("the last good table\n")
    table.chmod(0o444)
    before = snapshot(tmp_path)
    done = invoke("viewpoints", "--params", params)
    judge(tally, done, before=before, after=snapshot(tmp_path), code=1,
          names=("vp.csv", "read-only"))  # fmt: skip


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])
def test_a_full_disk_in_the_viewpoints_stage_names_the_output(tmp_path, monkeypatch, tally, code):
    """A write error that names no file blames the output being written, not --data-root."""
    _fake_viewpoints(monkeypatch)
    monkeypatch.chdir(tmp_path)
    params = _params(tmp_path / "params.yaml", {"viewpoints": {"out_dir": "vp-out"}})

    def failing(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", failing)
    done = invoke("viewpoints", "--params", params, "--data-root", tmp_path / "data")
    monkeypatch.undo()
    judge(tally, done, fault=True, code=1, names=("vp-out/viewpoints.json",))
    assert "--data-root" not in done.lines[0]
    assert not (tmp_path / "vp-out").exists() and not (tmp_path / "vp-out.csv").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_figure_that_is_no_file_is_refused_not_read(tmp_path, monkeypatch, tally, kind):
    """A FIFO (or a link to a device) named like a figure: the one input check refuses it
    before publish reads it (a FIFO would wait for a writer, a device may never end)."""
    _publish_dir(tmp_path, monkeypatch)
    figure = Path("eval/figures/rotation.png")
    if kind == "fifo":
        os.mkfifo(figure)
    else:
        figure.symlink_to("/dev/null")  # read, it would pass for an empty figure
    before = sorted(os.listdir("eval"))  # a snapshot would read the figure itself
    done = invoke_bounded("publish", "--params", "params.yaml", timeout=120)
    judge(tally, done, code=1, names=(str(figure), "not a regular file"))
    assert sorted(os.listdir("eval")) == before
