"""report.html (self-contained, rendered by headless Chromium) and the W&B publishing
(offline); the README table is tested in test_readme.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from capsnet.evaluation import plots as figures
from capsnet.evaluation.metrics import load_results, parse_results
from capsnet.io.errors import CapsnetError
from pipeline.publish import report

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

RESULTS = {
    "capsnet-small": {
        "model": "capsnet-small",
        "checkpoint": "models/capsnet-small.pt",
        "mnist": {"accuracy": 0.97, "n": 1000},
        "rotated-mnist": {"n": 1000, "accuracy": {"0": 0.97, "35": 0.81, "90": 0.2}},
        "affnist": {"skipped": "images are 40x40, the model takes 28x28"},
        "multimnist": {"skipped": "images are 36x36, the model takes 28x28"},
        "robustness": {"fgsm": {"0.1": 0.5}, "bim": {"0.1": 0.3}, "n": 100},
    },
    "lenet5": {
        "model": "lenet5",
        "checkpoint": "models/lenet5.pt",
        "mnist": {"accuracy": 0.96, "n": 1000},
        "rotated-mnist": {"n": 1000, "accuracy": {"0": 0.96, "35": 0.7, "90": 0.15}},
        "affnist": {"source": "affnist-synth", "accuracy": 0.5, "n": 1000},
        "robustness": {"fgsm": {"0.1": 0.2}, "bim": {"0.1": 0.05}, "n": 100},
    },
}


@pytest.fixture
def eval_dir(tmp_path) -> Path:
    """eval/metrics.json and two small figures, as the evaluate stage writes them."""
    out = tmp_path / "eval"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps(RESULTS))
    curves = {n: e["rotated-mnist"]["accuracy"] for n, e in RESULTS.items()}
    figures.rotation_curve(curves, out / "figures" / "rotation.png")
    import torch

    figures.image_grid([torch.rand(3, 1, 8, 8)], out / "figures" / "reconstructions.png")
    return out


def test_report_html_is_self_contained(eval_dir, tmp_path):
    sweep = tmp_path / "results.csv"
    sweep.write_text("trial_id,augment,final_val_accuracy\nt1,shift,0.91\nt2,none,0.88\n")
    path = report.write_report(eval_dir / "metrics.json", eval_dir / "report.html", sweep_csv=sweep)
    text = path.read_text()
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing fetched
    assert text.count('src="data:image/png;base64,') == 2
    assert "97.00%" in text and "Sabour 2017 99.75%" in text  # ours beside the paper's
    assert "DZone article 76.05%" in text  # LeNet5 at 35 degrees
    assert "affNIST (synth stand-in)" in text and "Sabour 2017 66" not in text
    assert "images are 40x40, the model takes 28x28" in text  # skips are explained
    assert '<table class="sweep">' in text and "0.9100" in text
    assert '<table id="robustness">' in text
    assert not list(eval_dir.glob(".*"))


def test_load_results_errors(tmp_path):
    with pytest.raises(CapsnetError, match="not found"):
        load_results(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(CapsnetError, match="not valid JSON"):
        load_results(bad)


PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  document.body.setAttribute('data-images', imgs.length);
  document.body.setAttribute('data-decoded',
    imgs.filter(i => i.complete && i.naturalWidth > 0).length);
  document.body.setAttribute('data-rows', document.querySelectorAll('#results tr').length);
  document.body.setAttribute('data-table-height',
    document.getElementById('results').getBoundingClientRect().height);
});
</script>"""


def test_report_renders_in_headless_chromium(eval_dir, tmp_path):
    if not CHROMIUM.is_file():
        pytest.skip(
            "no /usr/bin/chromium: install the Debian packages chromium and chromium-driver"
        )
    page = report.write_report(eval_dir / "metrics.json", eval_dir / "report.html")
    # A probe copy: the report itself has no scripts; the probe records what rendered.
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    profile = tmp_path / "profile"
    common = [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    dom = subprocess.run(
        [*common, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout).group(1)
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))
    assert attrs["images"] == "2" and attrs["decoded"] == "2", attrs
    assert int(attrs["rows"]) == 1 + len(RESULTS)
    assert float(attrs["table-height"]) > 20
    shot = tmp_path / "shot.png"
    taken = subprocess.run(
        [*common, f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri()],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert taken.returncode == 0, taken.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as image:
        colours = image.convert("L").getextrema()
    assert colours[0] < 100 and colours[1] > 200  # text and figures on a light page


def test_wandb_offline_eval_runs_hold_the_metrics(eval_dir, tmp_path, monkeypatch):
    from pipeline import tracking
    from pipeline.publish import stage as publish

    monkeypatch.setenv("WANDB_MODE", "offline")
    runs = publish.publish_runs(
        RESULTS,
        eval_dir / "figures",
        project="capsnet-test",
        group="exp-1",
        mode="offline",
        wandb_dir=tmp_path / "runs",
    )
    assert [r["name"] for r in runs] == ["capsnet-small", "lenet5", "comparison"]
    assert len({r["run_id"] for r in runs}) == 3
    found = tracking.offline_runs(tmp_path / "runs")
    assert set(found) == {r["run_id"] for r in runs}
    shared = tracking.read_history(found[runs[-1]["run_id"]])[0]
    assert {"figures/rotation", "figures/reconstructions"} <= {k.rsplit("/", 1)[0] for k in shared}
    for published in runs[:-1]:
        run_dir = found[published["run_id"]]
        info = tracking.read_run_info(run_dir)
        assert info["job_type"] == "eval" and info["group"] == "exp-1/eval"
        assert info["config"]["model"] == published["name"]
        history = tracking.read_history(run_dir)
        entry = RESULTS[published["name"]]
        assert history[0]["mnist/accuracy"] == entry["mnist"]["accuracy"]
        assert history[0]["rotated-mnist/accuracy/35"] == entry["rotated-mnist"]["accuracy"]["35"]
        assert history[0]["rotation_curve/_type"] == "table-file"
        assert not any(k.startswith("figures/") for k in history[0])  # no figure of its own
        curve = [(row["angle"], row["rotated_accuracy"]) for row in history[1:]]
        expected = {int(angle): acc for angle, acc in entry["rotated-mnist"]["accuracy"].items()}
        assert curve == sorted(expected.items())  # one row per angle, in angle order


def test_publish_stage_offline_never_reports_online(eval_dir, tmp_path, monkeypatch):
    from capsnet import config
    from pipeline.publish import stage as publish

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(
        publish, "create_wandb_report", lambda *a, **k: pytest.fail("W&B Report offline")
    )
    params = config.from_dict(config.Params, {"publish": {"dir": "runs", "project": "p"}})
    summary = publish.publish(params, Path("eval/metrics.json"), Path("eval/figures"))
    assert summary["mode"] == "offline" and summary["report_url"] is None
    assert summary["group"] == params.sweep.name
    assert [r["name"] for r in summary["runs"]] == ["capsnet-small", "lenet5", "comparison"]
    assert Path("eval/report.html").is_file()
    assert json.loads(Path("eval/published.json").read_text())["runs"] == summary["runs"]


def test_skipped_viewpoints_say_why_without_empty_brackets():
    html = report.render_html({**RESULTS, "viewpoints": {"skipped": "smallnorb is switched off"}})
    section = html[html.index("Novel viewpoints") :]
    assert "()" not in section and "Not run: smallnorb is switched off" in section
    ruled = report.render_html({**RESULTS, "viewpoints": {"rule": "target = max", "kinds": {}}})
    assert "familiar-viewpoint test error (target = max)." in ruled


def test_sweep_table_shows_only_the_columns_that_vary():
    rows = [
        {"trial_id": "00000", "model": "capsnet-small", "lr": "0.001",
         "augment": "shift", "final_val_accuracy": "0.91", "error": ""},
        {"trial_id": "00001", "model": "capsnet-small", "lr": "0.001",
         "augment": "none", "final_val_accuracy": "0.88", "error": "a lost node"},
    ]  # fmt: skip
    html = report.render_html(RESULTS, sweeps={"sweep/results.csv": rows})
    table = html[html.index('<table class="sweep">') :].split("</table>")[0]
    heads = re.findall(r"<th>([^<]*)</th>", table)
    assert heads == ["trial id", "augment", "final val accuracy"]
    assert "Every trial: model capsnet-small, lr 0.0010." in html
    assert "a lost node" not in html  # error texts are not shown
    assert table.index("0.9100") < table.index("0.8800")  # best first


def test_rotation_legend_sits_below_the_curves(tmp_path, monkeypatch):
    captured = {}

    def keep(fig, path):
        captured["fig"] = fig
        return Path(path)

    monkeypatch.setattr(figures, "save_figure", keep)
    curves = {f"model {i}": {"0": 0.99, "35": 0.7, "60": 0.3} for i in range(4)}
    figures.rotation_curve(curves, tmp_path / "rotation.png")
    fig = captured["fig"]
    fig.canvas.draw()
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent()
    assert legend.y1 < ax.get_window_extent().y0  # entirely below the plotting area


def test_perturbation_rows_that_change_nothing_are_not_drawn():
    import torch

    still = torch.full((11, 1, 4, 4), 0.5)
    moving = torch.linspace(0, 1, 11).view(11, 1, 1, 1).expand(11, 1, 4, 4)
    assert figures.visible_rows([still, moving, still + 0.001]) == [1]


def test_perturbation_rows_count_change_against_the_digits_ink():
    """A faint change across the sweep (a tenth of the digit's ink: what the committed
    capsnet-small drew as 15 rows of the same digit) is not drawn; a stroke that moves is."""
    digit = torch.zeros(11, 1, 28, 28)
    digit[:, :, 4:24, 12:16] = 1.0  # a vertical stroke, 80 pixels of ink
    faint = digit.clone()
    faint[-1, :, 4:12, 16] = 1.0  # 8 more pixels at one end
    moved = digit.clone()
    moved[-1] = 0
    moved[-1, :, 4:24, 16:20] = 1.0  # the stroke shifted by its width
    assert figures.visible_rows([digit, faint, moved]) == [2]


def test_report_names_every_figure_each_sweep_and_why_a_figure_is_missing(tmp_path):
    """smallNORB confusion matrices and the viewpoint curves are shown and captioned, each
    sweep has a plot and a table, and a capsule model without a perturbation figure is
    named with the reason."""
    norb = {
        "model": "em-capsnet-small",
        "checkpoint": "models-smallnorb/em-capsnet-small.pt",
        "smallnorb": {"accuracy": 0.6, "n": 100, "subset": "all", "source": "synth"},
    }
    capsule = {**RESULTS["capsnet-small"], "equivariance": {"dim_correlation": [0.1]}}
    results = {**RESULTS, "capsnet-small": capsule, "em-capsnet-small": norb}  # fmt: skip
    figs = tmp_path / "figures"
    figs.mkdir()
    for stem in ("confusion-capsnet-small", "confusion-em-capsnet-small-smallnorb", "viewpoints"):
        figures.image_grid([torch.rand(1, 1, 4, 4)], figs / f"{stem}.png")
    trials = [
        {"trial_id": "00000", "routing_iterations": "2", "final_val_accuracy": "0.51"},
        {"trial_id": "00001", "routing_iterations": "3", "final_val_accuracy": "0.26"},
    ]
    sweeps = {"sweep/results.csv": trials, "sweep-smallnorb/results.csv": trials}  # fmt: skip
    page = report.render_html(results, figs, sweeps)
    captions = re.findall(r"<figcaption>([^<]*)</figcaption>", page)
    assert any(c.endswith("(em-capsnet-small, smallnorb)") for c in captions), captions
    assert any(c.startswith("Test error per epoch on the familiar") for c in captions)
    viewpoints = page.index('alt="familiar and novel viewpoint error"')
    assert page.index("<h2>Sweeps</h2>") > viewpoints  # beside the viewpoint tables
    for source in sweeps:
        assert f'aria-label="sweep {source}"' in page and f"<h3>{source}</h3>" in page
    assert page.count('<table class="sweep">') == 2 and page.count("<rect ") == 4
    assert "No pose-perturbation figure for capsnet-small:" in page
    assert "em-capsnet-small" not in page[page.index('id="perturbation-none"') :].split("</p>")[0]


def test_counts_are_formatted_alike():
    from capsnet.evaluation.headline import count_text, epochs_text

    assert [count_text(v) for v in (3, 3.0, 76.66666666666667, None)] == ["3", "3", "76.7", "n/a"]
    assert epochs_text(1) == "1 epoch" and epochs_text(33.666) == "33.7 epochs"


def test_report_shows_one_checkpoint_per_model_and_training_set_and_says_what_it_left_out(
    tmp_path,
):
    """The other seeds and the comparison runs draw the same figures again: left out of the
    page (counted, with where they are), the first seed and the shared figures kept."""
    seeded = {
        **RESULTS,
        "capsnet-small@seed1": {**RESULTS["capsnet-small"], "checkpoint": "m/c@seed1.pt"},
        "lenet5@equal-time": {**RESULTS["lenet5"], "checkpoint": "m/lenet5@equal-time.pt"},
    }
    figs = tmp_path / "figures"
    figs.mkdir()
    stems = ["rotation", "equivariance", "confusion-capsnet-small", "confusion-capsnet-small_seed1"]
    stems += ["perturbation-capsnet-small_seed1", "confusion-lenet5_equal-time", "mine"]
    for stem in stems:
        figures.image_grid([torch.rand(1, 1, 4, 4)], figs / f"{stem}.png")
    results = parse_results(seeded)
    assert report.shown_checkpoints(results) == ["capsnet-small", "lenet5"]
    page = report.render_html(results, figs)
    shown = re.findall(r'<img src="data:image/png;base64,[^"]*" alt="([^"]*)"', page)
    assert shown == ["accuracy versus rotation", "equivariance", "confusion-capsnet-small", "mine"]
    assert "3 figures of the other seeds and of the comparison runs are left out" in page
    assert f"they are in {figs.as_posix()}/" in page


def test_committed_report_is_what_publish_renders_from_the_committed_run(
    committed_root, monkeypatch
):
    """eval/report.html is render_html of eval/metrics.json, eval/figures and the sweeps'
    results.csv files, byte for byte, all as committed (the publish stage writes it)."""
    from capsnet import config

    repo_root = committed_root
    params = config.load(repo_root / "params.yaml")
    out_dir = Path(params.evaluate.out_dir)
    committed = repo_root / params.publish.html
    if not committed.is_file():
        pytest.skip(f"no committed {params.publish.html}")
    results = load_results(repo_root / out_dir / "metrics.json")
    monkeypatch.chdir(repo_root)  # the figures folder named as publish names it: relative
    sweeps = report.read_sweeps(report.sweep_paths(params.publish))
    page = report.render_html(results, out_dir / "figures", sweeps)
    assert page == committed.read_text(encoding="utf-8"), (
        f"{params.publish.html} differs from what `capsnet publish` renders: run it"
    )


def test_viewpoint_curves_are_drawn_from_the_experiments_history(tmp_path):
    from capsnet.evaluation.figures import FigureDrawer

    history = [{"epoch": e, "familiar_error": 0.5 / e, "novel_error": 0.7 / e} for e in (1, 2)]
    model = {"model": "em-capsnet-small", "history": history}
    drawer = FigureDrawer(tmp_path)
    drawer.viewpoints({"kinds": {"azimuth": {"models": {"capsules": model}}, "elevation": {}}})
    assert list(drawer.written) == ["viewpoints"] and (tmp_path / "viewpoints.png").is_file()
    empty = FigureDrawer(tmp_path / "none")
    empty.viewpoints({"kinds": {"azimuth": {"skipped": "no data"}}})
    assert empty.written == {}
