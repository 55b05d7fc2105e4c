"""eval/report.html (self-contained: images inline, no scripts, readable offline) from
eval/metrics.json (the schema of capsnet/evaluation/): the results table, the comparison in words
and tables, the skipped pairs folded, the rotation, robustness, viewpoint and sweep tables
and the figures."""

from __future__ import annotations

import base64
import csv
import html
import math
import os
from pathlib import Path
from typing import Any

from capsnet.config import dataset_specs
from capsnet.evaluation.headline import (
    cell_value,
    count_text,
    main_entries,
    model_picks,
    std_value,
    table_columns,
    trained_on,
)
from capsnet.evaluation.probes import PROBES, has_pose_diagnostic
from capsnet.evaluation.results import Comparison, Entry, EvalResults, Viewpoints
from capsnet.io.files import atomic_write_text, check_input
from pipeline.paper import paper_number
from pipeline.publish import comparison as comparison_text
from pipeline.publish.cells import column_title, paper_metric, percent, publishable
from pipeline.publish.readme import match_text, seeds_lines, viewpoints_at_chance

# --- HTML ---------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.8em 0 1.6em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
.paper { color: #777; font-size: 0.85em; } .skipped { color: #a60; font-size: 0.85em; }
details summary { color: #a60; cursor: pointer; margin: 0.5em 0; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #555; }
.wide { max-width: 100%; overflow-x: auto; } .sweep { font-size: 0.8em; }
.sweep th { white-space: normal; max-width: 7em; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def figure_files(fig_dir: str | os.PathLike | None) -> list[Path]:
    """The figures (``*.png``) of ``fig_dir``, [] when it is missing; each is held to the
    one input check (``check_input``) first, so a FIFO or device named like a figure is
    refused in one line instead of hanging the read."""
    if not fig_dir or not os.path.lexists(fig_dir):
        return []
    check_input(fig_dir, kind="directory")
    found = sorted(Path(fig_dir).glob("*.png"))
    for path in found:
        check_input(path)
    return found


def _image_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


def _cell(column: str, model: str, entry: Entry | None) -> str:
    if entry is None:
        return "<td>–</td>"
    ours = percent(cell_value(entry, column), std_value(entry, column))
    paper = paper_number(paper_metric(column, entry), model)
    extra = (
        f'<br><span class="paper" title="{_e(paper.label)}: {_e(paper.note)}">'
        f"{_e(paper.cite)} {percent(paper.accuracy)}</span>"
        if paper
        else ""
    )
    return f'<td title="{_e(entry.name)}">{_e(ours)}{extra}</td>'


def _results_table(results: EvalResults, angle: float) -> str:
    """One row per model, one column per test set, each cell from the checkpoint trained
    for that set (the seeds' mean ± std where there are seeds); the cell's tooltip names it."""
    entries = main_entries(results)
    columns = table_columns(entries, angle)
    head = "".join(f"<th>{_e(column_title(c, entries))}</th>" for c in columns)
    rows = [
        f"<tr><td>{_e(model)}</td>"
        + "".join(_cell(c, model, chosen.get(c)) for c in columns)
        + "</tr>"
        for model, chosen in model_picks(entries, columns).items()
    ]
    return (
        f'<table id="results"><tr><th>model</th>{head}</tr>{"".join(rows)}</table>'
        "<p>Each cell is from the checkpoint trained for that test set (hover for its name); "
        "mean ± standard deviation over seeds where several were trained.</p>"
    )


def _skipped_fold(results: EvalResults) -> str:
    """The model/dataset pairs not evaluated, folded, grouped by reason."""
    reasons: dict[str, list[str]] = {}
    for name, entry in results.checkpoints().items():
        for test_set, reason in entry.skipped.items():
            reasons.setdefault(reason, []).append(f"{name} / {test_set}")
    count = sum(len(pairs) for pairs in reasons.values())
    if not count:
        return ""
    items = [
        f"<li>{_e(pairs[0])}: {_e(reason)}</li>"
        if len(pairs) == 1
        else f"<li>{_e(reason)} ({len(pairs)}): {_e(', '.join(pairs))}</li>"
        for reason, pairs in reasons.items()
    ]
    return (
        f'<details id="skipped"><summary>{count} model/dataset pairs skipped</summary>'
        f'<ul class="skipped">{"".join(items)}</ul></details>'
    )


def _comparison_section(comparison: Comparison | None, angle: float) -> str:
    """The comparison in words, then one table per arm."""
    rows = comparison_text.rows(comparison, angle)
    if not rows:
        return ""
    key = rows[0].angle
    where = f"{float(key):g}°" if key is not None else f"{angle:g}°"
    words = "".join(f"<p>{_e(s)}</p>" for s in comparison_text.sentences(comparison, angle))
    tables = []
    for arm in dict.fromkeys(r.arm for r in rows):
        body = "".join(
            f"<tr><td>{_e(r.model)}</td><td>{r.seeds}</td><td>{_e(r.augment or '–')}</td>"
            f"<td>{_e(count_text(r.epochs))}</td>"
            f"<td>{'–' if r.budgeted_seconds is None else f'{r.budgeted_seconds:.1f}'}</td>"
            f"<td>{_e(comparison_text.seconds(r))}</td>"
            f"<td>{_e(comparison_text.show(r.upright))}</td>"
            f"<td>{_e(comparison_text.show(r.headline))}</td></tr>"
            for r in rows
            if r.arm == arm
        )
        tables.append(
            f"<h3>{_e(comparison_text.ARM_TITLES.get(arm, arm))}</h3>"
            f'<table class="comparison" id="comparison-{_e(arm)}"><tr><th>model</th>'
            "<th>seeds</th><th>augment</th><th>epochs</th><th>budgeted seconds</th>"
            "<th>train seconds</th>"
            f"<th>0°</th><th>{where}</th></tr>{body}</table>"
        )
    return "<h2>Comparison</h2>" + words + "".join(tables)


def _rotation_table(results: EvalResults) -> str:
    curves = {n: dict(e.rotation()) for n, e in results.entries.items() if e.rotation()}
    if not curves:
        return "<p>No rotated-MNIST results.</p>"
    angles = sorted({a for curve in curves.values() for a in curve})
    head = "".join(f"<th>{a:g}°</th>" for a in angles)
    rows = []
    for name, curve in curves.items():
        cells = "".join(f"<td>{percent(curve.get(a))}</td>" for a in angles)
        rows.append(f"<tr><td>{_e(name)}</td>{cells}</tr>")
    return f'<table id="rotation"><tr><th>entry</th>{head}</tr>{"".join(rows)}</table>'


def _probe_tables(results: EvalResults) -> str:
    """Each probe's table (``capsnet.evaluation.probes``), percentages per checkpoint."""
    parts = []
    for probe in PROBES.values():
        table = probe.table(results) if probe.table else None
        if table is None:
            continue
        head = "".join(f"<th>{_e(c)}</th>" for c in table.columns)
        rows = "".join(
            f"<tr><td>{_e(name)}</td>" + "".join(f"<td>{percent(v)}</td>" for v in cells) + "</tr>"
            for name, cells in table.rows
        )
        parts.append(
            f"<h2>{_e(table.title)}</h2><p>{_e(table.note)}</p>"
            f'<table id="{_e(table.id)}"><tr><th>entry</th>{head}</tr>{rows}</table>'
        )
    return "".join(parts)


def _viewpoints_table(section: Viewpoints | None) -> str:
    """The novel-viewpoint comparison (metrics.json "viewpoints"), or a line saying why it
    is absent; empty when metrics.json has no such section."""
    if section is None:
        return ""
    rule = section.rule
    intro = (
        "<h2>Novel viewpoints (smallNORB)</h2><p>Both models trained on the familiar "
        "viewpoints only, compared on the novel ones at matched familiar-viewpoint test "
        f"error{f' ({_e(rule)})' if rule else ''}. Percentages are test error; the grey "
        "numbers are the paper's novel-viewpoint errors (Hinton et al. 2018, section 5.2).</p>"
    )
    if section.skipped is not None:
        return intro + f'<p class="skipped">Not run: {_e(section.skipped)}</p>'
    rows, notes = [], []
    for entry in section.kinds:
        kind = entry.kind
        if entry.skipped is not None:
            notes.append(f"<li>{_e(kind)}: {_e(entry.skipped)}</li>")
            continue
        for m in entry.models:
            paper = m.paper_novel_error
            extra = f'<br><span class="paper">paper {percent(paper)}</span>' if paper else ""
            epoch = "" if m.epoch is None else m.epoch
            rows.append(
                f"<tr><td>{_e(kind)}</td><td>{_e(m.role)}</td><td>{_e(m.model)}</td>"
                f"<td>{_e(epoch)}</td><td>{percent(m.familiar_error)}</td>"
                f"<td>{percent(m.novel_error)}{extra}</td>"
                f"<td>{percent(entry.target_familiar_error)}</td>"
                f"<td>{_e(match_text(entry))}</td></tr>"
            )
    table = (
        '<table id="viewpoints"><tr><th>viewpoints</th><th>role</th><th>model</th>'
        "<th>epoch</th><th>familiar error</th><th>novel error</th><th>target</th>"
        "<th>familiar gap</th></tr>" + "".join(rows) + "</table>"
        if rows
        else ""
    )
    skipped = f'<ul class="skipped">{"".join(notes)}</ul>' if notes else ""
    notes_after = [*seeds_lines(section), viewpoints_at_chance(section)]
    seeds = "".join(f"<p>{_e(line)}</p>" for line in notes_after if line)
    return intro + table + seeds + skipped


def read_sweep(path: str | os.PathLike | None) -> list[dict[str, str]]:
    """The rows of a sweep's results.csv ([] when there is none)."""
    if path is None or not os.path.lexists(path):
        return []
    check_input(path)
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def sweep_paths(settings) -> list[str]:
    """The results.csv of every sweep the report shows (``publish`` settings)."""
    return [settings.sweep_results, *settings.extra_sweep_results]


def read_sweeps(paths) -> dict[str, list[dict[str, str]]]:
    """{path as given: its trials} for each sweep results.csv (empty for a missing file)."""
    return {str(path): read_sweep(path) for path in paths}


def sweep_columns(rows: list[dict[str, str]]) -> list[str]:
    """The results.csv columns any trial fills, but the error text (the report and the W&B
    Report show the trials' settings and accuracies)."""
    return [c for c in rows[0] if c != "error" and any(r.get(c) for r in rows)]


def _sweep_order(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The trials by final validation accuracy, best first (trials without one last)."""

    def key(row):
        try:
            value = -float(row.get("final_val_accuracy") or "nan")
        except ValueError:
            value = math.nan
        return (math.isnan(value), 0.0 if math.isnan(value) else value)

    return sorted(rows, key=key)


def _sweep_table(rows: list[dict[str, str]], source: str, limit: int = 40) -> str:
    """The best ``limit`` trials by final validation accuracy; the settings every trial
    shares are one line above the table, so the table has only the columns that vary."""
    if not rows:
        return f"<p>No sweep results ({_e(source)}) were found.</p>"
    filled = sweep_columns(rows)
    shared = [c for c in filled if len({r.get(c) for r in rows}) == 1 and len(rows) > 1]
    columns = [c for c in filled if c not in shared]
    ordered = _sweep_order(rows)[:limit]

    def fmt(value: str) -> str:
        try:
            number = float(value)
        except ValueError:
            return _e(value)
        return f"{number:.4f}" if "." in value else _e(value)

    common = ", ".join(f"{_e(c)} {fmt(rows[0].get(c) or '')}" for c in shared)
    head = "".join(f"<th>{_e(c.replace('_', ' '))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{fmt(r.get(c) or '')}</td>" for c in columns) + "</tr>"
        for r in ordered
    )
    return (
        f'<p class="sweep-shared">Every trial: {common}.</p>' if common else ""
    ) + f'<div class="wide"><table class="sweep"><tr>{head}</tr>{body}</table></div>'


_SETTINGS_SKIP = {"trial_id", "status", "device", "peak_gpu_memory_mb", "epochs", "early_stopped"}


def _sweep_plot(rows: list[dict[str, str]], source: str, limit: int = 40) -> str:
    """The trials' final validation accuracy as a horizontal bar chart (inline SVG, no
    script), best first, each bar labelled with its trial and the settings that vary."""
    scored = [r for r in _sweep_order(rows) if _float(r.get("final_val_accuracy")) is not None]
    if not scored:
        return ""
    scored = scored[:limit]
    varying = [
        c
        for c in sweep_columns(rows)
        if c not in _SETTINGS_SKIP
        and not c.endswith("accuracy")
        and len({r.get(c) for r in rows}) > 1
    ]
    bar_h, label_w, plot_w = 18, 430, 360
    height = bar_h * len(scored) + 30
    bars = []
    for i, row in enumerate(scored):
        value = _float(row["final_val_accuracy"])
        y = 20 + i * bar_h
        label = f"{row.get('trial_id', i)}: " + ", ".join(f"{c}={row.get(c)}" for c in varying)
        width = max(0.0, min(1.0, value)) * plot_w
        bars.append(
            f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{_e(label)}</text>'
            f'<rect x="{label_w}" y="{y + 2}" width="{width:.1f}" height="{bar_h - 4}" '
            f'fill="#4c78a8"/><text x="{label_w + width + 4:.1f}" y="{y + 12}">'
            f"{100 * value:.1f}%</text>"
        )
    axis = f'<text x="{label_w}" y="12">final validation accuracy (0 to 100%), {_e(source)}</text>'
    return (
        f'<figure class="sweep-plot"><svg xmlns="http://www.w3.org/2000/svg" '
        f'width="{label_w + plot_w + 60}" height="{height}" font-size="11" '
        f'font-family="sans-serif" role="img" aria-label="sweep {_e(source)}">'
        f"{axis}{''.join(bars)}</svg><figcaption>Final validation accuracy per trial of "
        f"{_e(source)}, best first.</figcaption></figure>"
    )


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _sweeps_section(sweeps: dict[str, list[dict[str, str]]]) -> str:
    """One part per sweep (``{results.csv path: its rows}``): its plot, then its table."""
    if not sweeps:
        return "<h2>Sweeps</h2><p>No sweep results were given.</p>"
    parts = ["<h2>Sweeps</h2>"]
    for source, rows in sweeps.items():
        parts += [
            f"<h3>{_e(source)}</h3>",
            _sweep_plot(rows, source),
            _sweep_table(rows, source),
        ]
    return "".join(parts)


FIGURE_CAPTIONS = {
    "rotation": "Test accuracy versus rotation of the MNIST test digits, one line per model.",
    "reconstructions": "Upright and rotated inputs with the reconstructions from the "
    "predicted class capsule.",
    **{name: probe.caption for name, probe in PROBES.items() if probe.figure},
    "perturbation": "Each of the class capsule's pose dimensions swept from -0.25 to 0.25 "
    "(steps of 0.05), reconstructed.",
    "confusion": "Confusion matrix (rows: true class, columns: predicted) on the test set "
    "its title names.",
    "viewpoints": "Test error per epoch on the familiar (solid) and novel (dashed) "
    "viewpoints, one colour per model.",
    # each multi-label set's figure (capsnet.evaluation.figures.MODEL_FIGURES)
    **dict.fromkeys(
        dataset_specs.MULTI_LABEL_SETS,
        "MultiMNIST inputs with the two predicted digits reconstructed.",
    ),
}


def figure_slug(name: str) -> str:
    """An entry's name as its figures' file names hold it (as capsnet.evaluation.figures writes
    them): ``perturbation-<slug>.png``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def shown_checkpoints(results: EvalResults) -> list[str]:
    """The checkpoints whose own figures the report shows: the first of each model and
    training set in the results table; the other seeds and the comparison runs (equal
    time, augmented baselines) draw the same figures again."""
    first: dict[tuple[str, str | None], str] = {}
    for name, entry in main_entries(results).items():
        if entry.checkpoint is not None:
            first.setdefault((entry.model, trained_on(entry)), name)
    return list(first.values())


def _left_out(results: EvalResults, figures: list[Path]) -> set[Path]:
    """The figures of the checkpoints ``shown_checkpoints`` leaves out."""
    shown = set(shown_checkpoints(results))
    stems = {
        f"{prefix}-{figure_slug(name)}"
        for name in results.checkpoints()
        if name not in shown
        for prefix in FIGURE_CAPTIONS
    }
    return {p for p in figures if p.stem in stems or figure_owner(p.stem) in stems}


def figure_owner(stem: str) -> str:
    """A figure's stem without the evaluation set a per-set figure adds
    (``confusion-<name>-<set>`` -> ``confusion-<name>``; the registry's set names)."""
    from capsnet.config.dataset_specs import CONFUSION_SETS

    for test_set in CONFUSION_SETS:
        if stem.endswith(f"-{figure_slug(test_set)}"):
            return stem[: -len(test_set) - 1]
    return stem


def _perturbation_note(results: EvalResults, figures: list[Path]) -> str:
    """Why a shown capsule model (one with a pose diagnostic) has no perturbation figure."""
    stems = {p.stem for p in figures}
    missing = [
        name
        for name in shown_checkpoints(results)
        if has_pose_diagnostic(results.entries[name])
        and f"perturbation-{figure_slug(name)}" not in stems
    ]
    if not missing:
        return ""
    return (
        f'<p id="perturbation-none">No pose-perturbation figure for {_e(", ".join(missing))}: '
        "a figure shows only the pose dimensions whose reconstruction visibly changes across "
        "the sweep (docs/guides/evaluation.md), and none did (or the model has no decoder).</p>"
    )


def caption(path: Path) -> str:
    stem = path.stem
    owner = figure_owner(stem)
    test_set = stem[len(owner) + 1 :]
    for prefix, text in FIGURE_CAPTIONS.items():
        if owner == prefix or owner.startswith(prefix + "-"):
            who = ", ".join(w for w in (owner[len(prefix) + 1 :], test_set) if w)
            return f"{text}" + (f" ({who})" if who else "")
    return stem


def render_html(
    results: EvalResults | dict,
    fig_dir: str | os.PathLike | None = None,
    sweeps: dict[str, list[dict[str, str]]] | None = None,
    title: str = "capsnet-pipeline evaluation",
    angle: float = 35.0,
) -> str:
    """The report as one HTML string: tables, and every figures/*.png inline (base64).
    ``results`` is metrics.json typed (``load_results``) or its content, checked here;
    ``sweeps`` maps each sweep's results.csv path to its rows (``read_sweeps``)."""
    results = publishable(results)
    figures = figure_files(fig_dir)
    order = list(FIGURE_CAPTIONS)
    figures.sort(
        key=lambda p: (
            next((i for i, k in enumerate(order) if p.stem.startswith(k)), len(order)),
            p.stem,
        )
    )
    rotation = [p for p in figures if p.stem == "rotation"]
    viewpoints = [p for p in figures if p.stem == "viewpoints"]
    left_out = _left_out(results, figures)
    others = [p for p in figures if p not in (*rotation, *viewpoints) and p not in left_out]
    more = (
        f"<p>{len(left_out)} figures of the other seeds and of the comparison runs are "
        f"left out of this page; they are in {_e(Path(fig_dir).as_posix())}/ and in the "
        "W&amp;B eval runs.</p>"
        if left_out
        else ""
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        "<p>Generated from eval/metrics.json. Percentages are test accuracy; the "
        "grey numbers are the papers' (Sabour et al. 2017; Hinton et al. 2018) for the same "
        "kind of model. affnist-synth is a stand-in and is never compared with affNIST.</p>",
        "<h2>Results</h2>",
        _results_table(results, angle),
        _comparison_section(results.comparison, angle),
        _skipped_fold(results),
        "<h2>Accuracy versus rotation</h2>",
        *[
            f"<figure>{_image_tag(p, 'accuracy versus rotation')}<figcaption>"
            f"{_e(caption(p))}</figcaption></figure>"
            for p in rotation
        ],
        _rotation_table(results),
        _probe_tables(results),
        _viewpoints_table(results.viewpoints),
        *[
            f"<figure>{_image_tag(p, 'familiar and novel viewpoint error')}<figcaption>"
            f"{_e(caption(p))}</figcaption></figure>"
            for p in viewpoints
        ],
        _sweeps_section(sweeps or {}),
        "<h2>Figures</h2>",
        *([more] if more else []),
        _perturbation_note(results, figures),
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
    results = publishable(metrics)
    fig_dir = fig_dir if fig_dir is not None else Path(metrics).parent / "figures"
    sweeps = read_sweeps([sweep_csv]) if sweep_csv is not None else {}
    text = render_html(results, fig_dir, sweeps, title)
    return atomic_write_text(out, text)
