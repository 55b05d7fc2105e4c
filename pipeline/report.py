"""eval/report.html (self-contained: images inline, no scripts, readable offline) from
eval/metrics.json (the schema of capsnet/eval/), and the helpers the README table shares."""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from capsnet.errors import CapsnetError
from capsnet.io import atomic_write_text
from pipeline.paper import paper_number

# --- reading the evaluation -------------------------------------------------------------------


def load_results(path: str | os.PathLike) -> dict[str, dict]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CapsnetError(f"{path}: not found; run the evaluate stage first") from None
    except json.JSONDecodeError as exc:
        raise CapsnetError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise CapsnetError(f"{path}: not an evaluation result ({{name: {{...}}}} expected)")
    return data


VIEWPOINTS_KEY = "viewpoints"  # metrics.json's novel-viewpoint section, not a checkpoint


def model_entries(results: dict) -> dict[str, dict]:
    """The checkpoint and seed-mean entries of ``results`` (without the "viewpoints"
    section)."""
    return {n: e for n, e in results.items() if n != VIEWPOINTS_KEY and "model" in e}


def _angle_key(entry: dict, angle: float) -> str | None:
    accuracies = entry.get("rotated-mnist", {}).get("accuracy", {})
    return next((k for k in accuracies if float(k) == angle), None)


def cell_value(entry: dict, column: str) -> float | None:
    """The accuracy ``column`` stands for ("mnist", "rotated-mnist@35", "multimnist", ...),
    None when absent or skipped."""
    if column.startswith("rotated-mnist@"):
        key = _angle_key(entry, float(column.split("@", 1)[1]))
        return None if key is None else entry["rotated-mnist"]["accuracy"][key]
    value = entry.get(column)
    if not isinstance(value, dict) or "skipped" in value:
        return None
    found = value.get("strict_accuracy" if column == "multimnist" else "accuracy")
    return found if isinstance(found, (int, float)) else None


def std_value(entry: dict, column: str) -> float | None:
    std = entry.get("std") or {}
    if column.startswith("rotated-mnist@"):
        key = _angle_key(entry, float(column.split("@", 1)[1]))
        return (std.get("rotated-mnist") or {}).get("accuracy", {}).get(key)
    value = std.get(column) or {}
    return value.get("strict_accuracy" if column == "multimnist" else "accuracy")


def table_columns(results: dict, angle: float = 35.0) -> list[str]:
    """The result columns that hold at least one number, in a fixed order."""
    candidates = [
        "mnist",
        f"rotated-mnist@{angle:g}",
        "expanded-mnist",
        "affnist",
        "affnist-synth",
        "multimnist",
        "smallnorb",
        "smallnorb-azimuth-novel",
        "smallnorb-elevation-novel",
    ]
    return [c for c in candidates if any(cell_value(e, c) is not None for e in results.values())]


#: Column titles of the result tables (the rest are computed or the dataset's name).
TITLES = {
    "mnist": "MNIST",
    "expanded-mnist": "expanded MNIST",
    "affnist-synth": "affNIST (synth stand-in)",
    "multimnist": "MultiMNIST (strict)",
    "smallnorb": "smallNORB",
    "smallnorb-azimuth-novel": "smallNORB novel azimuths",
    "smallnorb-elevation-novel": "smallNORB novel elevations",
}


def column_title(column: str, results: dict) -> str:
    if column.startswith("rotated-mnist@"):
        return f"rotated MNIST {column.split('@')[1]}°"
    if column == "affnist":
        scored = [e["affnist"] for e in results.values() if cell_value(e, "affnist") is not None]
        real = scored and all(s.get("source") == "affnist" for s in scored)
        return "affNIST" if real else "affNIST (synth stand-in)"
    return TITLES.get(column, column)


def percent(value: float | None, std: float | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{100 * value:.2f}%"
    return text + (f" ± {100 * std:.2f}" if std else "")


def paper_metric(column: str, entry: dict) -> str:
    if column == "affnist" and entry.get("affnist", {}).get("source") != "affnist":
        return ""  # the synthetic stand-in is never compared with the paper's affNIST
    return column


# --- HTML ---------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.8em 0 1.6em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
.paper { color: #777; font-size: 0.85em; } .skipped { color: #a60; font-size: 0.85em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #555; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _image_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


def _results_table(results: dict, angle: float) -> str:
    results = model_entries(results)
    columns = table_columns(results, angle)
    head = "".join(f"<th>{_e(column_title(c, results))}</th>" for c in columns)
    rows = []
    for name, entry in results.items():
        cells = []
        for column in columns:
            ours = percent(cell_value(entry, column), std_value(entry, column))
            paper = paper_number(paper_metric(column, entry), entry.get("model", name))
            extra = (
                f'<br><span class="paper" title="{_e(paper.note)}">paper '
                f"{percent(paper.accuracy)}</span>"
                if paper
                else ""
            )
            cells.append(f"<td>{_e(ours)}{extra}</td>")
        label = name if "checkpoint" in entry else f"{name} (mean of {entry.get('seeds')} seeds)"
        rows.append(
            f"<tr><td>{_e(label)}</td><td>{_e(entry.get('model', ''))}</td>"
            + "".join(cells)
            + "</tr>"
        )
    skipped = [
        f"<li>{_e(name)} / {_e(key)}: {_e(value['skipped'])}</li>"
        for name, entry in results.items()
        if "checkpoint" in entry
        for key, value in entry.items()
        if isinstance(value, dict) and "skipped" in value
    ]
    notes = f'<ul class="skipped">{"".join(skipped)}</ul>' if skipped else ""
    return (
        f'<table id="results"><tr><th>entry</th><th>model</th>{head}</tr>'
        + "".join(rows)
        + "</table>"
        + (f"<p>Not evaluated (the reason is given):</p>{notes}" if notes else "")
    )


def _rotation_table(results: dict) -> str:
    entries = {n: e for n, e in results.items() if "accuracy" in e.get("rotated-mnist", {})}
    if not entries:
        return "<p>No rotated-MNIST results.</p>"
    angles = sorted({float(a) for e in entries.values() for a in e["rotated-mnist"]["accuracy"]})
    head = "".join(f"<th>{a:g}°</th>" for a in angles)
    rows = []
    for name, entry in entries.items():
        cells = "".join(
            f"<td>{percent(cell_value(entry, f'rotated-mnist@{a:g}'))}</td>" for a in angles
        )
        rows.append(f"<tr><td>{_e(name)}</td>{cells}</tr>")
    return f'<table id="rotation"><tr><th>entry</th>{head}</tr>{"".join(rows)}</table>'


def _robustness_table(results: dict) -> str:
    entries = {
        n: e["robustness"]
        for n, e in results.items()
        if "checkpoint" in e and "fgsm" in e.get("robustness", {})
    }
    if not entries:
        return ""
    epsilons = sorted({k for r in entries.values() for k in r["fgsm"]}, key=float)
    head = "".join(f"<th>{a} ε={_e(k)}</th>" for a in ("FGSM", "BIM") for k in epsilons)
    rows = [
        f"<tr><td>{_e(n)}</td>"
        + "".join(f"<td>{percent(r[a].get(k))}</td>" for a in ("fgsm", "bim") for k in epsilons)
        + "</tr>"
        for n, r in entries.items()
    ]
    return (
        "<h2>Adversarial robustness</h2><p>Accuracy under untargeted L-inf attacks on the "
        "MNIST test images (pixel range [0, 1]).</p>"
        f'<table id="robustness"><tr><th>entry</th>{head}</tr>{"".join(rows)}</table>'
    )


def _viewpoints_table(section: Any) -> str:
    """The novel-viewpoint comparison (metrics.json "viewpoints"), or a line saying why it
    is absent; empty when metrics.json has no such section."""
    if not isinstance(section, dict):
        return ""
    intro = (
        "<h2>Novel viewpoints (smallNORB)</h2><p>Both models trained on the familiar "
        "viewpoints only, compared on the novel ones at matched familiar-viewpoint test "
        f"error ({_e(section.get('rule', ''))}). Percentages are test error; the grey "
        "numbers are the paper's novel-viewpoint errors (Hinton et al. 2018, section 5.2).</p>"
    )
    if "skipped" in section:
        return intro + f'<p class="skipped">Not run: {_e(section["skipped"])}</p>'
    rows, notes = [], []
    for kind, entry in (section.get("kinds") or {}).items():
        if "skipped" in entry:
            notes.append(f"<li>{_e(kind)}: {_e(entry['skipped'])}</li>")
            continue
        for role, m in entry.get("models", {}).items():
            paper = m.get("paper_novel_error")
            extra = f'<br><span class="paper">paper {percent(paper)}</span>' if paper else ""
            match = "matched" if entry.get("matched") else "not matched"
            rows.append(
                f"<tr><td>{_e(kind)}</td><td>{_e(role)}</td><td>{_e(m.get('model', ''))}</td>"
                f"<td>{_e(m.get('epoch', ''))}</td><td>{percent(m.get('familiar_error'))}</td>"
                f"<td>{percent(m.get('novel_error'))}{extra}</td>"
                f"<td>{percent(entry.get('target_familiar_error'))}</td>"
                f"<td>{percent(entry.get('gap'))} ({match})</td></tr>"
            )
    table = (
        '<table id="viewpoints"><tr><th>viewpoints</th><th>role</th><th>model</th>'
        "<th>epoch</th><th>familiar error</th><th>novel error</th><th>target</th>"
        "<th>familiar gap</th></tr>" + "".join(rows) + "</table>"
        if rows
        else ""
    )
    skipped = f'<ul class="skipped">{"".join(notes)}</ul>' if notes else ""
    return intro + table + skipped


def read_sweep(path: str | os.PathLike | None) -> list[dict[str, str]]:
    if path is None or not Path(path).is_file():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _sweep_table(rows: list[dict[str, str]], limit: int = 40) -> str:
    if not rows:
        return "<p>No sweep results (sweep/results.csv) were found.</p>"
    columns = [c for c in rows[0] if any(r.get(c) for r in rows) and c not in ("error", "node")]

    def key(row):
        try:
            return -float(row.get("final_val_accuracy") or "nan")
        except ValueError:
            return 0.0

    ordered = sorted(rows, key=lambda r: (math.isnan(key(r)), key(r)))[:limit]

    def fmt(value: str) -> str:
        try:
            number = float(value)
        except ValueError:
            return _e(value)
        return f"{number:.4f}" if "." in value else _e(value)

    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{fmt(r.get(c) or '')}</td>" for c in columns) + "</tr>"
        for r in ordered
    )
    return f'<table id="sweep"><tr>{head}</tr>{body}</table>'


FIGURE_CAPTIONS = {
    "rotation": "Test accuracy versus rotation of the MNIST test digits, one line per model.",
    "reconstructions": "Upright and rotated inputs with the reconstructions from the "
    "predicted class capsule.",
    "equivariance": "Equivariance diagnostic: correlation of each pose dimension with the "
    "rotation angle, and how far the pose moves.",
    "perturbation": "Each of the class capsule's pose dimensions swept from -0.25 to 0.25 "
    "(steps of 0.05), reconstructed.",
    "confusion": "Confusion matrix on MNIST rotated by 35°.",
    "multimnist": "MultiMNIST inputs with the two predicted digits reconstructed.",
}


def caption(path: Path) -> str:
    stem = path.stem
    for prefix, text in FIGURE_CAPTIONS.items():
        if stem == prefix or stem.startswith(prefix + "-"):
            who = stem[len(prefix) + 1 :]
            return f"{text}" + (f" ({who})" if who else "")
    return stem


def render_html(
    results: dict,
    fig_dir: str | os.PathLike | None = None,
    sweep_rows: list[dict[str, str]] | None = None,
    title: str = "capsnet-pipeline evaluation",
    angle: float = 35.0,
) -> str:
    """The report as one HTML string: tables, and every figures/*.png inline (base64)."""
    figures = sorted(Path(fig_dir).glob("*.png")) if fig_dir and Path(fig_dir).is_dir() else []
    order = list(FIGURE_CAPTIONS)
    figures.sort(
        key=lambda p: (
            next((i for i, k in enumerate(order) if p.stem.startswith(k)), len(order)),
            p.stem,
        )
    )
    rotation = [p for p in figures if p.stem == "rotation"]
    others = [p for p in figures if p.stem != "rotation"]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<p>Generated {stamp} from eval/metrics.json. Percentages are test accuracy; the "
        "grey numbers are the papers' (Sabour et al. 2017; Hinton et al. 2018) for the same "
        "kind of model. affnist-synth is a stand-in and is never compared with affNIST.</p>",
        "<h2>Results</h2>",
        _results_table(results, angle),
        "<h2>Accuracy versus rotation</h2>",
        *[
            f"<figure>{_image_tag(p, 'accuracy versus rotation')}<figcaption>"
            f"{_e(caption(p))}</figcaption></figure>"
            for p in rotation
        ],
        _rotation_table(results),
        _robustness_table(results),
        _viewpoints_table(results.get(VIEWPOINTS_KEY)),
        "<h2>Sweep comparison</h2>",
        _sweep_table(sweep_rows or []),
        "<h2>Figures</h2>",
        *[
            f"<figure>{_image_tag(p, p.stem)}<figcaption>{_e(caption(p))}</figcaption></figure>"
            for p in others
        ],
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_report(
    metrics: str | os.PathLike,
    out: str | os.PathLike,
    fig_dir: str | os.PathLike | None = None,
    sweep_csv: str | os.PathLike | None = None,
    title: str = "capsnet-pipeline evaluation",
) -> Path:
    """Write the self-contained report for ``metrics`` to ``out`` atomically."""
    results = load_results(metrics)
    fig_dir = fig_dir if fig_dir is not None else Path(metrics).parent / "figures"
    text = render_html(results, fig_dir, read_sweep(sweep_csv), title)
    return atomic_write_text(out, text)
