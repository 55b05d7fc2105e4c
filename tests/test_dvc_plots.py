"""`dvc plots show` on a fresh clone writes a page that draws offline: every script it
loads is a local file (the npm packages of .ci/setup), and every chart renders with them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VEGA_SCRIPTS = (
    "vega/build/vega.min.js",
    "vega-lite/build/vega-lite.min.js",
    "vega-embed/build/vega-embed.min.js",
)
#: The `$schema` of a vega-lite spec: a version tag vega-embed reads, never fetches.
SCHEMA_PREFIX = "https://vega.github.io/schema/"

#: Renders each chart of the page to SVG with the page's own vega and vega-lite files.
RENDER_JS = r"""
const fs = require("fs");
const path = require("path");
const page = process.argv[2];
const text = fs.readFileSync(page, "utf8");
const srcs = [...text.matchAll(/<script[^>]*\ssrc="([^"]+)"/g)].map((m) => m[1]);
const dir = path.dirname(page);
const load = (name) => require(path.resolve(dir, srcs.find((s) => s.includes(name))));
const vega = load("/vega.min.js");
const vegaLite = load("/vega-lite.min.js");
const specs = [...text.matchAll(/var spec = (\{.*?\});\s*\n/gs)].map((m) => JSON.parse(m[1]));
(async () => {
  const drawn = [];
  for (const spec of specs.filter((s) => Object.keys(s).length)) {
    const view = new vega.View(vega.parse(vegaLite.compile(spec).spec), { renderer: "none" });
    const svg = await view.toSVG();
    drawn.push({ title: spec.title.text || spec.title, marks: (svg.match(/<path/g) || []).length });
  }
  console.log(JSON.stringify(drawn));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def run(args, cwd, env=None):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def plots_page(tmp_path_factory, repo_root) -> Path:
    """dvc_plots/index.html of `dvc plots show` in a fresh clone of the repository."""
    vega = repo_root / ".vega" / "node_modules"
    if not all((vega / script).is_file() for script in VEGA_SCRIPTS):
        pytest.skip(f"the vega npm packages are not installed in {vega} (bash .ci/setup, npm)")
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    if dvc is None or shutil.which("git") is None or not (repo_root / ".git").exists():
        pytest.skip("needs dvc, git and a git checkout of the repository")
    clone = tmp_path_factory.mktemp("clone") / "repo"
    run(["git", "clone", "-q", str(repo_root), str(clone)], cwd=repo_root)
    (clone / ".vega").symlink_to(repo_root / ".vega")  # what .ci/setup installs in a clone
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    run([dvc, "plots", "show"], cwd=clone, env=env)
    page = clone / "dvc_plots" / "index.html"
    assert page.is_file(), "dvc plots show wrote no HTML"
    return page


def test_plots_page_loads_only_local_scripts(plots_page):
    html = plots_page.read_text()
    sources = re.findall(r"<script[^>]*\ssrc=\"([^\"]+)\"", html)
    assert sorted(Path(src).as_posix().split("node_modules/")[1] for src in sources) == sorted(
        VEGA_SCRIPTS
    )
    for src in sources:
        assert (plots_page.parent / src).resolve().is_file(), src
    for url in re.findall(r"https?://[^\s\"'<>]+", html):
        assert url.startswith(SCHEMA_PREFIX), f"the page refers to {url}"
    assert not re.search(r"(src|href)=\"https?:", html)


def test_plots_page_draws_every_chart_offline(plots_page):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = plots_page.parent / "render.js"
    script.write_text(RENDER_JS)
    drawn = json.loads(run([node, str(script), str(plots_page)], cwd=plots_page.parent))
    titles = {chart["title"] for chart in drawn}
    assert {"sweep/plots/by_routing.csv", "sweep/plots/by_augment.csv"} <= titles
    assert any(title.startswith("Test accuracy versus rotation") for title in titles), titles
    assert all(chart["marks"] > 0 for chart in drawn), drawn
