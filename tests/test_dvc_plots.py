"""`dvc plots show` on a fresh clone writes a page that draws offline: every script it
loads is a local file (the npm packages of .ci/setup, found from the page's folder up, so
`-o DIR` works too), every chart with data renders with them, and `dvc plots diff` draws
one rotation line per model and revision."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

VEGA_SCRIPTS = (
    "vega/build/vega.min.js",
    "vega-lite/build/vega-lite.min.js",
    "vega-embed/build/vega-embed.min.js",
)
#: The `$schema` of a vega-lite spec: a version tag vega-embed reads, never fetches.
SCHEMA_PREFIX = "https://vega.github.io/schema/"

#: Renders each chart of the page to SVG with the vega and vega-lite files the page's loader
#: finds (VEGA_PREFIXES from the page's folder, the first holding every VEGA_FILES entry).
RENDER_JS = r"""
const fs = require("fs");
const path = require("path");
const page = process.argv[2];
const text = fs.readFileSync(page, "utf8");
const dir = path.dirname(page);
const files = JSON.parse(text.match(/var VEGA_FILES = (\[[^\]]*\]);/)[1]);
const depth = Number(text.match(/var VEGA_DEPTH = (\d+);/)[1]);
let prefix = null;
for (let up = 0; up <= depth && prefix === null; up++) {
  const candidate = path.resolve(dir, "../".repeat(up) + ".vega/");
  if (files.every((f) => fs.existsSync(path.join(candidate, f)))) prefix = candidate;
}
if (prefix === null) { console.error("no .vega found"); process.exit(3); }
const load = (name) => require(path.join(prefix, files.find((f) => f.endsWith(name))));
const vega = load("/vega.min.js");
const vegaLite = load("/vega-lite.min.js");
const specs = [...text.matchAll(/var spec = (\{.*?\});\s*\n/gs)].map((m) => JSON.parse(m[1]));
const hasData = (s) =>
  Object.keys(s).length > 0 && (!Array.isArray(s.data.values) || s.data.values.length > 0);
(async () => {
  const drawn = [];
  for (const spec of specs.filter(hasData)) {
    const view = new vega.View(vega.parse(vegaLite.compile(spec).spec), { renderer: "none" });
    const svg = await view.toSVG();
    const revs = [...new Set((spec.data.values || []).map((d) => d.rev))];
    drawn.push({
      title: spec.title.text || spec.title,
      marks: (svg.match(/<path/g) || []).length,
      revs,
      encoding: JSON.stringify(spec.encoding || {}) + JSON.stringify(spec.layer || []),
    });
  }
  console.log(JSON.stringify({ drawn, empty: specs.length - specs.filter(hasData).length }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def run(args, cwd, env=None):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory, repo_root) -> tuple[Path, str, dict]:
    """A fresh clone of the repository with .vega linked in, the dvc command and its env."""
    vega = repo_root / ".vega" / "node_modules"
    if not all((vega / script).is_file() for script in VEGA_SCRIPTS):
        pytest.skip(f"the vega npm packages are not installed in {vega} (bash .ci/setup, npm)")
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    if dvc is None or shutil.which("git") is None or not (repo_root / ".git").exists():
        pytest.skip("needs dvc, git and a git checkout of the repository")
    work = tmp_path_factory.mktemp("clone") / "repo"
    run(["git", "clone", "-q", str(repo_root), str(work)], cwd=repo_root)
    for name in ("dvc.yaml", ".dvc/config", "pipeline/plots"):  # this checkout's, committed or not
        source, target = repo_root / name, work / name
        if source.is_dir():
            shutil.rmtree(target)
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
    (work / ".vega").symlink_to((repo_root / ".vega").resolve())  # what .ci/setup installs
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    return work, dvc, env


@pytest.fixture(scope="module")
def plots_page(clone) -> Path:
    """dvc_plots/index.html of `dvc plots show` in a fresh clone of the repository."""
    work, dvc, env = clone
    run([dvc, "plots", "show"], cwd=work, env=env)
    page = work / "dvc_plots" / "index.html"
    assert page.is_file(), "dvc plots show wrote no HTML"
    return page


def render(page: Path) -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = page.parent / "render.js"
    script.write_text(RENDER_JS)
    return json.loads(run([node, str(script), str(page)], cwd=page.parent))


def test_plots_page_loads_only_local_scripts(plots_page):
    html = plots_page.read_text()
    assert not re.findall(r"<script[^>]*\ssrc=", html)  # loaded by the page's own loader
    files = json.loads(re.search(r"var VEGA_FILES = (\[[^\]]*\]);", html).group(1))
    assert sorted(f.split("node_modules/")[1] for f in files) == sorted(VEGA_SCRIPTS)
    for url in re.findall(r"https?://[^\s\"'<>]+", html):
        assert url.startswith(SCHEMA_PREFIX), f"the page refers to {url}"
    assert not re.search(r"(src|href)=\"https?:", html)


def test_plots_page_draws_every_chart_offline(plots_page):
    result = render(plots_page)
    titles = {chart["title"] for chart in result["drawn"]}
    assert {"sweep/plots/by_routing.csv", "sweep/plots/by_augment.csv"} <= titles
    assert any(title.startswith("Test accuracy versus rotation") for title in titles), titles
    assert all(chart["marks"] > 0 for chart in result["drawn"]), result


def test_plots_diff_draws_a_line_per_model_and_revision_into_any_out_dir(clone):
    """`dvc plots diff HEAD -o DIR` with DIR two folders down: the page still finds the
    vega files, and the rotation chart keeps the two revisions apart (strokeDash = rev)."""
    work, dvc, env = clone
    rotation = work / "eval" / "rotation.csv"
    original = rotation.read_text()
    lines = original.splitlines()
    changed = [lines[0]] + [
        ",".join([r.split(",")[0], r.split(",")[1], "0.5", *r.split(",")[3:]]) for r in lines[1:]
    ]
    rotation.write_text("\n".join(changed) + "\n")
    routing = work / "sweep" / "plots" / "by_routing.csv"
    routing_original = routing.read_text()
    head, *rows = routing_original.splitlines()
    routing.write_text("\n".join([head, *(r.replace(",0.", ",0.1", 1) for r in rows)]) + "\n")
    try:
        run([dvc, "plots", "diff", "HEAD", "-o", "out/diff"], cwd=work, env=env)
    finally:
        rotation.write_text(original)
        routing.write_text(routing_original)
    result = render(work / "out" / "diff" / "index.html")
    (chart,) = [c for c in result["drawn"] if c["title"].startswith("Test accuracy versus")]
    assert sorted(chart["revs"]) == ["HEAD", "workspace"]
    assert '"strokeDash":{"field":"rev"' in chart["encoding"]  # in each line layer
    assert chart["marks"] > 0
    (bars,) = [c for c in result["drawn"] if c["title"] == "sweep/plots/by_routing.csv"]
    assert sorted(bars["revs"]) == ["HEAD", "workspace"]  # side by side, one colour each
    assert '"yOffset":{"field":"rev"' in bars["encoding"] and bars["marks"] > 0


def test_sweep_template_shows_revisions_side_by_side_on_an_axis_not_from_zero(repo_root):
    """The sweep's per-setting plots (dvc.yaml) use the project template: the revision in
    the encoding (offset and colour), the value axis fitted to the values (scale zero false,
    so the differences between trials show)."""
    template = repo_root / "pipeline" / "plots" / "sweep_by_setting.json"
    spec = json.loads(template.read_text())
    encoding = spec["encoding"]
    assert encoding["yOffset"]["field"] == "rev" and encoding["color"]["field"] == "rev"
    assert encoding["x"]["scale"]["zero"] is False
    assert encoding["y"]["field"] == "<DVC_METRIC_Y>"
    assert spec["data"]["values"] == "<DVC_METRIC_DATA>"
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    plots = [p for name in ("sweep", "sweep_smallnorb") for p in stages[name]["plots"]]
    templates = {next(iter(p)): next(iter(p.values())).get("template") for p in plots}
    templates = {path: t for path, t in templates.items() if "/plots/" in path}
    assert len(templates) == 4
    assert set(templates.values()) == {"pipeline/plots/sweep_by_setting.json"}, templates


def test_line_style_legends_draw_strokes_not_dots(repo_root):
    """Every template that tells lines apart by their dash (familiar/novel viewpoints, one
    revision from another) draws that legend as stroked lines, not as point symbols (a
    line mark with points draws every dash legend entry as the same dot)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            dash = node.get("strokeDash")
            if isinstance(dash, dict) and "field" in dash:
                found.append(dash)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for template in sorted((repo_root / "pipeline" / "plots").glob("*.json")):
        walk(json.loads(template.read_text()))
    assert len(found) >= 3
    for dash in found:  # a stroked symbol, drawn visibly whatever the colour encoding
        assert dash["legend"]["symbolType"] == "stroke", dash
        assert dash["legend"]["encode"]["symbols"]["update"]["strokeOpacity"] == {"value": 1}


#: The labels of each legend of a vega-lite spec rendered to SVG with the .vega packages.
LEGEND_JS = r"""
const fs = require("fs");
const [prefix, file] = process.argv.slice(2);
const vega = require(prefix + "/vega/build/vega.min.js");
const vegaLite = require(prefix + "/vega-lite/build/vega-lite.min.js");
const spec = JSON.parse(fs.readFileSync(file, "utf8"));
(async () => {
  const view = new vega.View(vega.parse(vegaLite.compile(spec).spec), { renderer: "none" });
  await view.runAsync();
  const scale = view.scale("color");
  console.log(JSON.stringify(scale.domain()));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_rotation_diff_of_a_three_seed_and_a_one_seed_run_has_one_colour_per_model(
    repo_root, tmp_path
):
    """`dvc plots diff` of a 3-seed revision (lines named after their seed mean,
    "capsnet-small (mean)") and a 1-seed one (`-S train.seeds=1`: the checkpoint
    "capsnet-small" alone): one colour, one legend entry, per model."""
    node, vega = shutil.which("node"), repo_root / ".vega" / "node_modules"
    if node is None or not all((vega / script).is_file() for script in VEGA_SCRIPTS):
        pytest.skip("needs node and the vega npm packages (bash .ci/setup)")
    models = ("capsnet-small", "lenet5", "lenet5@equal-time")
    values = []
    for model in models:
        mean = f"{model} (mean)"
        for angle in ("0", "35"):
            values += [
                {"angle": angle, "model": mean, "accuracy": "0.9", "std": "0.01", "group": mean,
                 "kind": "mean", "rev": "HEAD"},
                {"angle": angle, "model": model, "accuracy": "0.9", "std": "", "group": mean,
                 "kind": "seed", "rev": "HEAD"},
                {"angle": angle, "model": model, "accuracy": "0.8", "std": "", "group": model,
                 "kind": "checkpoint", "rev": "workspace"},
            ]  # fmt: skip
    text = (repo_root / "pipeline" / "plots" / "rotation_by_model.json").read_text()
    for anchor, value in {"<DVC_METRIC_X>": "angle", "<DVC_METRIC_Y>": "accuracy",
                          "<DVC_METRIC_TITLE>": "rotation", "<DVC_METRIC_X_LABEL>": "angle",
                          "<DVC_METRIC_Y_LABEL>": "accuracy"}.items():  # fmt: skip
        text = text.replace(anchor, value)
    spec = json.loads(text)
    spec["data"]["values"] = values
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "legend.js").write_text(LEGEND_JS)
    domain = json.loads(run([node, "legend.js", str(vega), "spec.json"], cwd=tmp_path))
    assert sorted(domain) == sorted(models)
