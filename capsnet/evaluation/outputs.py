"""The evaluation's files and its printed summary, from the metrics.json dataclasses
(``capsnet.evaluation.results``): metrics.json (the full results, NaN as null),
summary.json (the headline numbers under stable keys: the stage's DVC metrics),
rotation.csv (angle, model, accuracy, std), and a table per checkpoint."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capsnet.config import dataset_specs
from capsnet.evaluation.comparison import comparison_lines
from capsnet.evaluation.headline import cell_value, main_entries, model_picks, std_value
from capsnet.evaluation.novel_viewpoints import viewpoint_lines
from capsnet.evaluation.probes import PROBES
from capsnet.evaluation.results import (
    ComparisonGroup,
    Entry,
    EvalResults,
    metrics_json,
    parse_results,
)
from capsnet.io.outputset import OutputSet, check_owned, refuse_target
from capsnet.training import scoring as evaluate


def _typed(results: EvalResults | dict[str, Any]) -> EvalResults:
    """``results`` as the dataclasses (metrics.json's content is parsed and checked)."""
    return parse_results(results, evaluated=False)


def rotation_rows(results: EvalResults) -> list[tuple[float, str, float, float | None, str, str]]:
    """(angle, entry, accuracy, std, group, kind) rows of every checkpoint and seed-mean
    entry with a rotated-mnist sweep. kind: "mean" (a seed mean, with its std), "seed" (a
    checkpoint of a seed group) or "checkpoint" (in no group); group: the seed mean's name
    for a mean and its seeds, the entry's own name otherwise (one colour per group)."""
    results = _typed(results)
    group_of = {member: name for name, mean in results.means().items() for member in mean.names}
    rows = []
    for name, entry in results.entries.items():
        if not entry.has_sweep():
            continue
        single = entry.checkpoint is not None
        kind = "mean" if not single else "seed" if name in group_of else "checkpoint"
        spread = entry.sweep_std()
        for angle, acc in entry.sweep().items():
            std = spread.get(angle) if not single else None
            rows.append((float(angle), name, acc, std, group_of.get(name, name), kind))
    return sorted(rows, key=lambda r: (r[1], r[0]))


def rotation_csv(results: EvalResults) -> str:
    """rotation.csv's text: a header ``angle,model,accuracy,std,group,kind`` and one row per
    point (std empty for a single checkpoint); see ``rotation_rows``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["angle", "model", "accuracy", "std", "group", "kind"])
    for angle, name, acc, std, group, kind in rotation_rows(results):
        row = [evaluate.format_angle(angle), name, _number(acc), _number(std), group, kind]
        writer.writerow(row)
    return buffer.getvalue()


def _number(value) -> str:
    """A CSV cell: six decimals, empty for None or a non-finite number."""
    return f"{value:.6f}" if isinstance(value, (float, int)) and math.isfinite(value) else ""


def _rounded(value) -> float | None:
    return (
        round(float(value), 6) if isinstance(value, (int, float)) and math.isfinite(value) else None
    )


def _seeded() -> list[dataset_specs.SummaryKey]:
    """The summary.json numbers given as seed means (those at a rotation-sweep angle)."""
    return [k for k in dataset_specs.summary_keys() if k.sweep_angle is not None]


def _arm_row(group: ComparisonGroup) -> dict[str, float | None]:
    at = {float(k): k for k in group.accuracy}
    row = {}
    for summary in _seeded():
        row[summary.key] = _rounded(group.accuracy.get(at.get(summary.sweep_angle)))
        row[f"{summary.key}_sd"] = _rounded(group.std.get(at.get(summary.sweep_angle)))
    row["n_seeds"] = group.seeds
    row["train_s"] = _rounded(group.train_seconds)
    return row


def summary_metrics(results: EvalResults) -> dict[str, dict]:
    """summary.json: per model of the results table, the accuracy under each of the dataset
    specs' summary keys (``capsnet.config.dataset_specs.summary_keys``: every model has
    every key, null where a set was not evaluated, so experiments compare column by column;
    a seed mean with ``<key>_sd`` its deviation), the seeds and the mean training seconds;
    per comparison arm other than equal augmentation (equal training time, augmented
    baselines), the baselines' numbers under ``<arm>.<model>``."""
    results = _typed(results)
    arms = results.comparison.arms if results.comparison is not None else {}
    trained = arms["equal_augmentation"].groups if "equal_augmentation" in arms else {}
    keys, seeded = dataset_specs.summary_keys(), _seeded()
    summary: dict[str, dict] = {}
    for model, chosen in model_picks(main_entries(results), [k.column for k in keys]).items():
        row: dict = {}
        for summary_key in keys:
            column, key, found = summary_key.column, summary_key.key, chosen.get(summary_key.column)
            row[key] = _rounded(cell_value(found, column)) if found else None
            if summary_key.sweep_angle is not None:
                row[f"{key}_sd"] = _rounded(std_value(found, column)) if found else None
        first = next((chosen[k.column] for k in seeded if k.column in chosen), None)
        row["n_seeds"] = first.seeds if first else None
        row["train_s"] = _rounded(trained[model].train_seconds) if model in trained else None
        summary[model] = row
    for name, arm in arms.items():
        if name == "equal_augmentation":
            continue
        rows = {m: _arm_row(g) for m, g in arm.groups.items() if m != arm.reference}
        if rows:
            summary[name] = rows
    return summary


#: {output name: file in the output folder}, in the order written (metrics.json last).
OUTPUT_FILES = {
    "rotation_csv": "rotation.csv",
    "summary": "summary.json",
    "metrics": "metrics.json",
}


#: What the figures folder holds (capsnet.evaluation.figures): it is replaced whole.
FIGURE_FILES = ("*.png",)
FIGURES_DIR = "figures"


def check_targets(out_dir: str | Path) -> None:
    """CapsnetError naming the first output file of ``out_dir`` that cannot be replaced
    (``capsnet.io.outputset.refuse_target``): found before any work."""
    for name in OUTPUT_FILES.values():
        refuse_target(Path(out_dir) / name)
    check_owned(Path(out_dir) / FIGURES_DIR, FIGURE_FILES)


def write_outputs(
    results: EvalResults, out_dir: str | Path, outputs: OutputSet | None = None
) -> dict[str, Path]:
    """``out_dir``/rotation.csv, summary.json, then metrics.json (the manifest, last),
    published as one unit: into ``outputs`` when given (the caller commits it with its
    figures), else committed here; {output name: path}."""
    results, out = _typed(results), Path(out_dir)
    own = outputs is None
    outputs = outputs or OutputSet()
    texts = {
        "rotation_csv": rotation_csv(results),
        "summary": json.dumps(summary_metrics(results), indent=2) + "\n",
        "metrics": metrics_json(results),
    }
    written = {key: outputs.file(out / OUTPUT_FILES[key], text) for key, text in texts.items()}
    if own:
        outputs.commit()
    return written


#: The width of a stage's log (the evaluate stage prints the compact table within it).
LOG_WIDTH = 120


def summary_lines(results: EvalResults, angles: tuple[str, ...] | None = None) -> list[str]:
    """A human-readable table: one row per entry, accuracy per dataset (and per angle of
    ``angles``, default every one), then the comparison and the novel-viewpoint sections
    when ``results`` has them."""
    results = _typed(results)
    comparison = comparison_lines(results.comparison)
    entries = results.entries
    return (
        _table_lines(entries, angles)
        + _scored_lines(results)
        + _skip_lines(results)
        + comparison
        + viewpoint_lines(results.viewpoints)
    )


def fit_width(lines: list[str], width: int = LOG_WIDTH) -> list[str]:
    """``lines`` with each longer than ``width`` wrapped at spaces, continued indented."""
    import textwrap

    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
        else:
            out += textwrap.wrap(line, width, subsequent_indent="    ", break_long_words=True)
    return out


def _scored_lines(results: EvalResults) -> list[str]:
    """How many test images each set's numbers come from (a range when checkpoints were
    scored on different counts), and which numbers come from a stand-in's data."""
    counts: dict[str, list[int]] = {}
    sources: dict[str, set[str]] = {}
    for entry in results.checkpoints().values():
        for key, block in entry.scores.items():
            if isinstance(block, dict) and isinstance(block.get("n"), int):
                counts.setdefault(key, []).append(block["n"])
                if block.get("source"):
                    sources.setdefault(key, set()).add(str(block["source"]))
    parts = []
    for key, ns in counts.items():
        n = f"{min(ns)}" if min(ns) == max(ns) else f"{min(ns)}-{max(ns)}"
        spec = dataset_specs.of_column(key)
        part = f"{key} {n} images" + (" per angle" if spec and spec.rotations_of else "")
        for source in sorted(sources.get(key, ())):
            standing = dataset_specs.is_stand_in(key, source)
            part += f" ({source}: the synthetic stand-in for {key})" if standing else f" ({source})"
        parts.append(part)
    return [f"scored on: {'; '.join(parts)}"] if parts else []


def _skip_lines(results: EvalResults) -> list[str]:
    """Why the "skipped" cells are skipped: one line per reason, naming the pairs (a seed
    mean repeats its checkpoints' reasons)."""
    reasons: dict[str, list[str]] = {}
    for name, entry in results.checkpoints().items():
        for key, reason in entry.skipped.items():
            reasons.setdefault(reason, []).append(f"{name}/{key}")
    return [f"skipped: {reason} ({', '.join(pairs)})" for reason, pairs in reasons.items()]


def _fmt(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def _cell(block: dict, key: str) -> str:
    if not block:
        return "-"
    if "skipped" in block:
        return "skipped"
    return _fmt(block.get(key))


def _columns(
    entries: dict[str, Entry], shown: tuple[str, ...] | None = None
) -> list[tuple[str, Callable[[Entry], str]]]:
    """(title, cell of an entry) for each dataset, one per angle for rotated-mnist (the
    angles of ``shown`` only, when given)."""
    keys = list(dict.fromkeys(key for entry in entries.values() for key in entry.scores))
    columns: list[tuple[str, Callable[[Entry], str]]] = []
    for key in keys:
        spec = dataset_specs.of_column(key)
        if spec is not None and spec.rotations_of is not None:
            sweeps = [e.block(key).get("accuracy") or {} for e in entries.values()]
            angles = list(dict.fromkeys(a for sweep in sweeps for a in sweep))
            angles = [a for a in angles if shown is None or a in shown]
            columns += [
                (f"{a}°", lambda e, a=a, k=key: _fmt((e.block(k).get("accuracy") or {}).get(a)))
                for a in angles
            ]
        elif key not in PROBES:
            metric = "accuracy" if spec is None else spec.headline_metric
            columns.append((key, lambda e, key=key, m=metric: _cell(e.block(key), m)))
    return columns


def _table_lines(entries: dict[str, Entry], angles: tuple[str, ...] | None = None) -> list[str]:
    columns = _columns(entries, angles)
    header = ["checkpoint", "model", *[title for title, _ in columns]]
    rows = [
        [name, entry.model, *[cell(entry) for _, cell in columns]]
        for name, entry in entries.items()
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]
    ]
