"""`capsnet publish` as one unit: every input and target is checked and every text rendered
before anything is written; report.html, eval/results.md, the README block and
published.json then land together, or none of them does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from test_readme import METRICS

from capsnet.cli import main
from pipeline.publish import readme
from pipeline.publish import stage as publish

README = f"# t\n\nintro\n{readme.BEGIN}\nold table\n{readme.END}\ntail\n"
OUTPUTS = ("eval/report.html", "eval/results.md", "eval/published.json")


@pytest.fixture
def stage_dir(tmp_path, monkeypatch) -> Path:
    """A working directory with eval/metrics.json, a README and params.yaml (W&B off)."""
    monkeypatch.chdir(tmp_path)
    Path("eval").mkdir()
    Path("eval/metrics.json").write_text(json.dumps(METRICS))
    Path("README.md").write_text(README)
    Path("params.yaml").write_text("publish:\n  mode: disabled\n  dir: runs\n")
    return tmp_path


def _publish(*extra: str):
    """`capsnet publish` through the capsnet group (its one-line errors on stderr)."""
    args = ["publish", "--params", "params.yaml", *extra]
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _error(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_publish_writes_report_table_readme_and_manifest(stage_dir):
    result = _publish("--readme", "README.md")
    assert result.exit_code == 0, result.output
    assert "README.md: results table updated" in result.output
    for path in OUTPUTS:
        assert Path(path).stat().st_size > 0, path
    table = Path("eval/results.md").read_text()
    assert table.startswith(readme.results_table(METRICS))
    assert "![accuracy versus rotation](figures/rotation.png)" in table
    text = Path("README.md").read_text()
    assert text.startswith("# t\n\nintro\n") and text.endswith(f"{readme.END}\ntail\n")
    block = readme.current_block(text)
    assert readme.results_table(METRICS) in block
    assert "![accuracy versus rotation](eval/figures/rotation.png)" in block
    assert (
        readme.ORIGIN_PREFIX in block and "On another CPU kind the trained numbers differ" in block
    )
    manifest = json.loads(Path("eval/published.json").read_text())
    assert manifest["table"] == "eval/results.md" and manifest["runs"] == []
    html = Path("eval/report.html").read_text()
    assert "Generated from eval/metrics.json" in html

    before = _snapshot(stage_dir)
    again = _publish("--readme", "README.md")
    assert "README.md: results table unchanged" in again.output
    assert _snapshot(stage_dir) == before  # no timestamp: an unchanged input, equal bytes
    assert not [p for p in stage_dir.rglob(".*.tmp")]


def test_the_origin_line_names_the_training_run_not_the_publisher(stage_dir):
    """The machine and commit come from the ORIGIN.json final training wrote beside its
    checkpoints, so publishing again from a later commit changes nothing."""
    from pipeline import provenance

    assert _publish().exit_code == 0
    unknown = "Trained on an unknown machine, from an unknown commit."
    assert unknown in Path("eval/results.md").read_text()  # no record: nothing claimed

    Path("models").mkdir()
    recorded = {"git_commit": "0123456789abcdef0123", "machine": "Some CPU, 64 cores"}
    (Path("models") / provenance.ORIGIN_FILE).write_text(json.dumps(recorded))
    assert _publish().exit_code == 0
    line = "Trained on Some CPU, 64 cores, from commit `0123456789ab`."
    assert line in Path("eval/results.md").read_text()


def _refused(stage_dir: Path, expected: str, *extra: str) -> None:
    before = _snapshot(stage_dir)
    assert _error(_publish(*extra)) == f"Error: {expected}"
    assert _snapshot(stage_dir) == before
    assert not any(Path(p).exists() for p in OUTPUTS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[1, 2]", "models/ORIGIN.json: a JSON object expected"),
        ('{"git_commit": ', "models/ORIGIN.json: not valid JSON"),
    ],
)
def test_a_broken_origin_record_is_refused_in_one_line(stage_dir, text, expected):
    from pipeline import provenance

    Path("models").mkdir()
    (Path("models") / provenance.ORIGIN_FILE).write_text(text)
    before = _snapshot(stage_dir)
    assert _error(_publish()).startswith(f"Error: {expected}")
    assert _snapshot(stage_dir) == before
    assert not any(Path(p).exists() for p in OUTPUTS)


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ({}, "eval/metrics.json: no evaluated checkpoint; run the evaluate stage first"),
        ({"viewpoints": {"skipped": "off"}}, "eval/metrics.json: no evaluated checkpoint;"),
        (
            {"m": {"model": "m", "checkpoint": "m.pt", "mnist": {"accuracy": "high"}}},
            "eval/metrics.json: m/mnist/accuracy: a number expected, got 'high'",
        ),
        ({"m": {"checkpoint": "m.pt"}}, "eval/metrics.json: m: no model name"),
    ],
)
def test_bad_metrics_are_refused_before_anything_is_written(stage_dir, metrics, expected):
    Path("eval/metrics.json").write_text(json.dumps(metrics))
    before = _snapshot(stage_dir)
    assert _error(_publish("--readme", "README.md")).startswith(f"Error: {expected}")
    assert _snapshot(stage_dir) == before


@pytest.mark.parametrize(
    "text", ["no markers\n", f"{readme.END}\n{readme.BEGIN}\n", f"{readme.BEGIN}\n" * 2]
)
def test_bad_readme_markers_are_refused_before_anything_is_written(stage_dir, text):
    Path("README.md").write_text(text)
    _refused(
        stage_dir,
        "README.md: needs one <!-- results:begin --> line and, after it, one "
        "<!-- results:end --> line",
        "--readme",
        "README.md",
    )


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_a_read_only_readme_is_refused_not_replaced(stage_dir):
    Path("README.md").chmod(0o444)
    _refused(stage_dir, "README.md: read-only; not replaced", "--readme", "README.md")
    assert oct(Path("README.md").stat().st_mode & 0o777) == "0o444"


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_a_read_only_report_is_refused_before_anything_is_written(stage_dir):
    Path("eval/report.html").write_text("old")
    Path("eval/report.html").chmod(0o444)
    before = _snapshot(stage_dir)
    line = _error(_publish("--readme", "README.md"))
    assert line == "Error: eval/report.html (publish html): read-only; not replaced"
    assert _snapshot(stage_dir) == before


def test_a_failed_wandb_step_writes_no_file(stage_dir, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("W&B service went away")

    monkeypatch.setattr(publish, "publish_runs", broken)
    before = _snapshot(stage_dir)
    assert "W&B service went away" in _error(_publish("--readme", "README.md"))
    assert _snapshot(stage_dir) == before
    assert not [p for p in stage_dir.rglob(".*.tmp")]


def test_the_wandb_report_queries_only_the_runs_this_publish_made(tmp_path):
    """Its run sets filter on the ids of the eval and comparison runs just logged and on
    each sweep's own group (from its best.json), never the whole project."""
    from wandb_workspaces import expr

    from pipeline.publish import stage as publishing

    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "best.json").write_text('{"sweep": "capsnet-sweep"}')
    csvs = [str(tmp_path / "sweep" / "results.csv"), str(tmp_path / "gone" / "results.csv")]
    groups = publishing.sweep_groups(csvs)
    assert groups == {csvs[0]: "capsnet-sweep/sweep"}  # a sweep without best.json: none
    runs = [{"name": "lenet5", "run_id": "abc123"}, {"name": "comparison", "run_id": "def456"}]
    filters = publishing.report_filters(runs, groups)
    assert filters["eval runs"] == "ID in ['abc123', 'def456']"
    assert filters[f"sweep {csvs[0]}"] == "Group = 'capsnet-sweep/sweep' and JobType = 'sweep'"
    parsed = expr.expr_to_filters(filters["eval runs"])
    parsed = parsed.filters[0] if parsed.filters else parsed
    assert (parsed.op, parsed.key.name, parsed.value) == ("IN", "name", ["abc123", "def456"])
    assert all(f.strip() for f in filters.values())  # no empty query: never every run


def test_the_wandb_report_has_smallnorb_and_viewpoint_sections(monkeypatch):
    """The report's blocks, built against a stand-in of the wandb-workspaces API (online
    only): smallNORB confusion matrices, the novel viewpoints, each sweep, scoped runs."""
    import sys
    import types

    from capsnet.evaluation.metrics import parse_results
    from pipeline.publish import stage as publishing

    class Block:
        def __init__(self, kind, *args, **kwargs):
            self.kind, self.args, self.kwargs = kind, args, kwargs

    class Report(Block):
        url = "https://wandb.ai/report"

        def save(self):
            Report.saved = self

    fake = types.ModuleType("wandb_workspaces.reports.v2")
    for name in ("H1", "H2", "P", "MarkdownBlock", "PanelGrid", "Runset", "LinePlot",
                 "MediaBrowser", "BarPlot"):  # fmt: skip
        setattr(fake, name, lambda *a, _name=name, **k: Block(_name, *a, **k))
    fake.Report = lambda **k: Report("Report", **k)
    import wandb_workspaces

    reports = types.ModuleType("wandb_workspaces.reports")
    reports.v2 = fake
    monkeypatch.setitem(sys.modules, "wandb_workspaces.reports", reports)
    monkeypatch.setitem(sys.modules, "wandb_workspaces.reports.v2", fake)
    monkeypatch.setattr(wandb_workspaces, "reports", reports, raising=False)
    norb = {
        "model": "em-capsnet-small",
        "checkpoint": "models-smallnorb/em-capsnet-small.pt",
        "smallnorb": {"accuracy": 0.6, "n": 100},
    }
    results = parse_results({"em-capsnet-small": norb, "viewpoints": {"skipped": "off"}})
    publishing.create_wandb_report(
        results, project="p", group="g", entity="e", runs=[{"run_id": "r1"}],
        sweeps={"sweep-smallnorb/results.csv": []},
        sweep_groups={"sweep-smallnorb/results.csv": "norb/sweep"},
    )  # fmt: skip
    blocks = Report.saved.blocks
    titles = [b.args[0] for b in blocks if b.kind == "H2"]
    assert "Confusion matrices on smallnorb" in titles and "Novel viewpoints" in titles
    assert "Sweep sweep-smallnorb/results.csv" in titles
    grids = [b for b in blocks if b.kind == "PanelGrid"]
    runsets = [r for g in grids for r in g.kwargs["runsets"]]
    assert {r.kwargs["filters"] for r in runsets} == {
        "ID in ['r1']",
        "Group = 'norb/sweep' and JobType = 'sweep'",
    }
    media = [p for g in grids for p in g.kwargs["panels"] if p.kind == "MediaBrowser"]
    assert ["figures/confusion-em-capsnet-small-smallnorb"] in [
        m.kwargs["media_keys"] for m in media
    ]


def test_each_eval_run_logs_only_its_own_checkpoints_figures(tmp_path, monkeypatch):
    """Names that end alike (capsnet-small, em-capsnet-small) or differ by a seed get their
    own figures only; the figures across models go to the comparison run alone."""
    from capsnet.evaluation import plots
    from capsnet.evaluation.figures import figure_stem
    from capsnet.evaluation.metrics import parse_results
    from pipeline import tracking

    monkeypatch.setenv("WANDB_MODE", "offline")
    fig_dir = tmp_path / "figures"
    own = {
        "capsnet-small": [figure_stem("confusion", "capsnet-small"),
                          figure_stem("perturbation", "capsnet-small")],
        "capsnet-small@seed1": [figure_stem("confusion", "capsnet-small@seed1")],
        "em-capsnet-small": [figure_stem("confusion", "em-capsnet-small", "smallnorb")],
        "smallnorb-cnn": [figure_stem("confusion", "smallnorb-cnn", "smallnorb")],
    }  # fmt: skip
    stems = [s for names in own.values() for s in names] + ["rotation", "equivariance"]
    for stem in stems:
        plots.image_grid([torch.rand(1, 1, 4, 4)], fig_dir / f"{stem}.png")
    entries = {
        name: {"model": name.split("@")[0], "checkpoint": f"models/{name}.pt",
               "mnist": {"accuracy": 0.9, "n": 10}}
        for name in own
    }  # fmt: skip
    runs = publish.publish_runs(
        parse_results(entries), fig_dir, project="p", group="g", mode="offline",
        wandb_dir=tmp_path / "runs",
    )  # fmt: skip
    found = tracking.offline_runs(tmp_path / "runs")
    logged = {}
    for run in runs:
        keys = {k.split("/")[1] for row in tracking.read_history(found[run["run_id"]]) for k in row
                if k.startswith("figures/")}  # fmt: skip
        logged[run["name"]] = keys
    assert logged == {
        **{n: set(s) for n, s in own.items()},
        "comparison": {"rotation", "equivariance"},
    }


def test_each_eval_run_is_grouped_with_the_sweep_that_trained_its_checkpoint(tmp_path):
    """An MNIST checkpoint's eval run beside the MNIST sweep's runs, a smallNORB one beside
    the smallNORB sweep's; publish.experiment, when set, groups them all."""
    from capsnet import config
    from capsnet.evaluation.metrics import parse_results
    from pipeline import tracking

    entries = {
        name: {"model": name, "checkpoint": f"{folder}/{name}.pt", "mnist": {"accuracy": 0.9}}
        for name, folder in (("lenet5", "models"), ("em-capsnet-small", "models-smallnorb"))
    }
    results = parse_results(entries)
    sections = {"sweep": {"name": "mnist-sweep"}, "smallnorb_sweep": {"name": "norb-sweep"}}
    params = config.from_dict(config.Params, sections)
    assert publish.checkpoint_experiments(results, params) == {
        "lenet5": "mnist-sweep",
        "em-capsnet-small": "norb-sweep",
    }
    fixed = config.from_dict(config.Params, {**sections, "publish": {"experiment": "e"}})
    assert set(publish.checkpoint_experiments(results, fixed).values()) == {"e"}
    runs = publish.publish_runs(
        results, tmp_path / "figures", project="p", group="mnist-sweep", mode="offline",
        wandb_dir=tmp_path / "runs", experiments=publish.checkpoint_experiments(results, params),
    )  # fmt: skip
    found = tracking.offline_runs(tmp_path / "runs")
    groups = {r["name"]: tracking.read_run_info(found[r["run_id"]])["group"] for r in runs}
    assert groups == {"lenet5": "mnist-sweep/eval", "em-capsnet-small": "norb-sweep/eval"}
