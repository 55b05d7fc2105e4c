"""The evaluate and publish outputs survive what is refused: a `dvc exp run -S` with a bad
value leaves the last good files in place, a target that cannot be replaced changes none of
them, and a models/ORIGIN.json whose text would break the README block publishes nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from faulthelpers import invoke, judge, snapshot
from test_readme import METRICS

#: The files of the evaluate and publish stages, as a last good run left them.
LAST_GOOD = {
    "eval/metrics.json": "{}\n",
    "eval/summary.json": "{}\n",
    "eval/rotation.csv": "angle,model,accuracy,std,group,kind\n",
    "eval/figures/rotation.png": "last good figure",
    "eval/report.html": "<p>last good</p>\n",
    "eval/results.md": "last good table\n",
    "eval/published.json": "{}\n",
}


def _git(work: Path, *args: str) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    subprocess.run(["git", *args], cwd=work, check=True, capture_output=True, env=env)


@pytest.fixture
def stage_repo(tmp_path, repo_root) -> tuple[Path, str]:
    """A git + DVC repository with the real params.yaml and the real evaluate and publish
    stages (their deps left out: the commands are refused before reading any), its
    outputs as a last good run left them, newer than the commit; (folder, dvc command)."""
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    if dvc is None or shutil.which("git") is None:
        pytest.skip("dvc or git is not installed")
    work = tmp_path / "repo"
    work.mkdir()
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    kept = {n: {k: v for k, v in stages[n].items() if k != "deps"} for n in ("evaluate", "publish")}
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
    [("evaluate.limit=-5", "evaluate"), ("publish.mode=bogus", "publish")],
)
def test_a_refused_dvc_exp_run_keeps_the_last_good_outputs(tally, stage_repo, setting, stage):
    """DVC deletes a stage's outputs before its command runs unless they are `persist`;
    the command replaces them only when it succeeds."""
    work, dvc = stage_repo
    before = snapshot(work / "eval")
    done = subprocess.run(
        [dvc, "exp", "run", "-s", stage, "-S", setting],
        cwd=work,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "DVC_STAGE"},
    )
    after = snapshot(work / "eval")
    tally.inputs += 1
    tally.partial_outputs += before != after
    assert done.returncode != 0, done.stdout + done.stderr
    assert setting.split("=")[0] in done.stderr + done.stdout, done.stderr
    assert "Traceback" not in done.stderr
    assert after == before


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
    from pipeline import readme, report

    metrics, field = HOSTILE_METRICS[case]
    for render in (readme.results_table, lambda m: report.render_html(m, None, {})):
        with pytest.raises(CapsnetError, match=field):
            render(metrics)
