"""The evaluation's files and its printed summary: metrics.json (the full results, NaN as
null), summary.json (the headline numbers under stable keys: the stage's DVC metrics),
rotation.csv (angle, model, accuracy, std), and a table per checkpoint."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable
from pathlib import Path

from capsnet.data import registry
from capsnet.evaluation.comparison import COMPARISON_KEY, comparison_lines
from capsnet.evaluation.headline import cell_value, main_entries, model_picks, std_value
from capsnet.evaluation.metrics import metrics_json
from capsnet.evaluation.novel_viewpoints import VIEWPOINTS_KEY, viewpoint_lines
from capsnet.io.outputset import OutputSet, refuse_target
from capsnet.training import scoring as evaluate


def rotation_rows(results: dict) -> list[tuple[float, str, float, float | None, str, str]]:
    """(angle, entry, accuracy, std, group, kind) rows of every checkpoint and seed-mean
    entry with a rotated-mnist sweep. kind: "mean" (a seed mean, with its std), "seed" (a
    checkpoint of a seed group) or "checkpoint" (in no group); group: the seed mean's name
    for a mean and its seeds, the entry's own name otherwise (one colour per group)."""
    group_of = {
        member: name
        for name, entry in results.items()
        if isinstance(entry, dict) and "checkpoint" not in entry
        for member in entry.get("names") or []
    }
    rows = []
    for name, entry in results.items():
        sweep = entry.get("rotated-mnist")
        if "model" not in entry or not isinstance(sweep, dict) or "accuracy" not in sweep:
            continue
        single = "checkpoint" in entry
        kind = "mean" if not single else "seed" if name in group_of else "checkpoint"
        spread = ((entry.get("std") or {}).get("rotated-mnist") or {}).get("accuracy") or {}
        for angle, acc in sweep["accuracy"].items():
            std = spread.get(angle) if not single else None
            rows.append((float(angle), name, acc, std, group_of.get(name, name), kind))
    return sorted(rows, key=lambda r: (r[1], r[0]))


def rotation_csv(results: dict) -> str:
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


#: The test sets of summary.json: {column of capsnet.evaluation.headline: key}. Every model has
#: every key (null where a set was not evaluated), so experiments compare column by column.
SUMMARY_SETS = {
    "mnist": "mnist",
    "rotated-mnist@35": "rot35",
    "expanded-mnist": "expanded",
    "affnist": "affnist",
    "multimnist": "multimnist",
    "smallnorb": "smallnorb",
}
#: The sets whose cells are seed means, with their standard deviation beside them.
SEEDED_SETS = ("mnist", "rot35")


def _rounded(value) -> float | None:
    return (
        round(float(value), 6) if isinstance(value, (int, float)) and math.isfinite(value) else None
    )


def _arm_models(results: dict, arm: str) -> dict[str, dict]:
    section = ((results.get(COMPARISON_KEY) or {}).get("arms") or {}).get(arm) or {}
    return {m: g for m, g in (section.get("models") or {}).items() if isinstance(g, dict)}


def _arm_row(group: dict) -> dict[str, float | None]:
    accuracy, std = group.get("accuracy") or {}, group.get("std") or {}
    at = {float(k): k for k in accuracy}
    row = {}
    for key, angle in (("mnist", 0.0), ("rot35", 35.0)):
        row[key] = _rounded(accuracy.get(at.get(angle)))
        row[f"{key}_sd"] = _rounded(std.get(at.get(angle)))
    row["n_seeds"] = group.get("seeds")
    row["train_s"] = _rounded(group.get("train_seconds"))
    return row


def summary_metrics(results: dict) -> dict[str, dict]:
    """summary.json: per model of the results table, the accuracy on each SUMMARY_SETS set
    (mean over seeds, ``<set>_sd`` their deviation for SEEDED_SETS), the seeds and the mean
    training seconds; per comparison arm other than equal augmentation (equal training time,
    augmented baselines), the baselines' numbers under ``<arm>.<model>``."""
    entries = main_entries(results)
    summary: dict[str, dict] = {}
    trained = _arm_models(results, "equal_augmentation")
    for model, chosen in model_picks(entries, list(SUMMARY_SETS)).items():
        row: dict = {}
        for column, key in SUMMARY_SETS.items():
            found = chosen.get(column)
            row[key] = _rounded(cell_value(found[1], column)) if found else None
            if key in SEEDED_SETS:
                row[f"{key}_sd"] = _rounded(std_value(found[1], column)) if found else None
        first = chosen.get("mnist") or chosen.get("rotated-mnist@35")
        row["n_seeds"] = first[1].get("seeds", 1) if first else None
        row["train_s"] = _rounded((trained.get(model) or {}).get("train_seconds"))
        summary[model] = row
    arms = (results.get(COMPARISON_KEY) or {}).get("arms") or {}
    for arm, section in arms.items():
        if arm == "equal_augmentation" or not isinstance(section, dict):
            continue
        rows = {
            model: _arm_row(group)
            for model, group in _arm_models(results, arm).items()
            if model != section.get("reference")
        }
        if rows:
            summary[arm] = rows
    return summary


#: {output name: file in the output folder}, in the order written (metrics.json last).
OUTPUT_FILES = {
    "rotation_csv": "rotation.csv",
    "summary": "summary.json",
    "metrics": "metrics.json",
}


def check_targets(out_dir: str | Path) -> None:
    """CapsnetError naming the first output file of ``out_dir`` that cannot be replaced
    (``capsnet.io.outputset.refuse_target``): found before any work."""
    for name in OUTPUT_FILES.values():
        refuse_target(Path(out_dir) / name)


def write_outputs(
    results: dict, out_dir: str | Path, outputs: OutputSet | None = None
) -> dict[str, Path]:
    """``out_dir``/rotation.csv, summary.json, then metrics.json (the manifest, last),
    published as one unit: into ``outputs`` when given (the caller commits it with its
    figures), else committed here; {output name: path}."""
    out = Path(out_dir)
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


def summary_lines(results: dict) -> list[str]:
    """A human-readable table: one row per entry, accuracy per dataset (and per angle), then
    the "comparison" and the novel-viewpoint ("viewpoints") sections when ``results`` has them."""
    viewpoints = results.get(VIEWPOINTS_KEY)
    entries = {n: e for n, e in results.items() if n != COMPARISON_KEY and "model" in e}
    comparison = comparison_lines(results.get(COMPARISON_KEY))
    return _table_lines(entries) + _skip_lines(entries) + comparison + viewpoint_lines(viewpoints)


def _skip_lines(entries: dict) -> list[str]:
    """Why the "skipped" cells are skipped: one line per reason, naming the pairs."""
    reasons: dict[str, list[str]] = {}
    for name, entry in entries.items():
        if "checkpoint" not in entry:
            continue  # a seed mean repeats its checkpoints' reasons
        for key, value in entry.items():
            if isinstance(value, dict) and "skipped" in value:
                reasons.setdefault(str(value["skipped"]), []).append(f"{name}/{key}")
    return [f"skipped: {reason} ({', '.join(pairs)})" for reason, pairs in reasons.items()]


def _fmt(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def _cell(value, key: str) -> str:
    if not isinstance(value, dict):
        return "-"
    if "skipped" in value:
        return "skipped"
    return _fmt(value.get(key))


def _sweep(entry: dict, key: str) -> dict:
    return entry.get(key, {}).get("accuracy", {})


def _columns(results: dict) -> list[tuple[str, Callable[[dict], str]]]:
    """(title, cell of an entry) for each dataset, one per angle for rotated-mnist."""
    keys: list[str] = []
    for entry in results.values():
        for key, value in entry.items():
            if isinstance(value, dict) and key not in keys and key != "std":
                keys.append(key)
    columns: list[tuple[str, Callable[[dict], str]]] = []
    for key in keys:
        spec = registry.of_column(key)
        if spec is not None and spec.rotations_of is not None:
            sweeps = [e.get(key, {}).get("accuracy", {}) for e in results.values()]
            angles = list(dict.fromkeys(a for sweep in sweeps for a in sweep))
            columns += [(f"{a}°", lambda e, a=a, k=key: _fmt(_sweep(e, k).get(a))) for a in angles]
        elif key not in ("robustness", "equivariance"):
            metric = "accuracy" if spec is None else spec.headline_metric
            columns.append((key, lambda e, key=key, m=metric: _cell(e.get(key), m)))
    return columns


def _table_lines(results: dict) -> list[str]:
    columns = _columns(results)
    header = ["checkpoint", "model", *[title for title, _ in columns]]
    rows = [
        [name, entry["model"], *[cell(entry) for _, cell in columns]]
        for name, entry in results.items()
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]
    ]
