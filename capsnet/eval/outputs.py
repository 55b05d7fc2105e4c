"""The evaluation's files and its printed summary: metrics.json (the results, NaN as null),
rotation.csv (angle, model, accuracy, std), and a table per checkpoint."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable
from pathlib import Path

from capsnet import evaluate
from capsnet.eval.comparison import COMPARISON_KEY, comparison_lines
from capsnet.eval.viewpoints import VIEWPOINTS_KEY, viewpoint_lines
from capsnet.io import atomic_write_text


def _finite(value):
    """JSON-safe: NaN and infinities become null (DVC and browsers reject NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def metrics_json(results: dict) -> str:
    """metrics.json's text: ``results`` indented, NaN and infinities as null."""
    return json.dumps(_finite(results), indent=2) + "\n"


def rotation_rows(results: dict) -> list[tuple[float, str, float, float | None]]:
    """(angle, entry, accuracy, std) rows of every checkpoint and seed-mean entry with a
    rotated-mnist sweep; std is None for a single checkpoint."""
    rows = []
    for name, entry in results.items():
        sweep = entry.get("rotated-mnist")
        if "model" not in entry or not isinstance(sweep, dict) or "accuracy" not in sweep:
            continue
        spread = ((entry.get("std") or {}).get("rotated-mnist") or {}).get("accuracy") or {}
        for angle, acc in sweep["accuracy"].items():
            std = spread.get(angle) if "checkpoint" not in entry else None
            rows.append((float(angle), name, acc, std))
    return sorted(rows, key=lambda r: (r[1], r[0]))


def rotation_csv(results: dict) -> str:
    """rotation.csv's text: a header ``angle,model,accuracy,std`` and one row per point
    (std empty for a single checkpoint)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["angle", "model", "accuracy", "std"])
    for angle, name, acc, std in rotation_rows(results):
        writer.writerow([evaluate.format_angle(angle), name, _number(acc), _number(std)])
    return buffer.getvalue()


def _number(value) -> str:
    """A CSV cell: six decimals, empty for None or a non-finite number."""
    return f"{value:.6f}" if isinstance(value, (float, int)) and math.isfinite(value) else ""


def write_outputs(results: dict, out_dir: str | Path) -> dict[str, Path]:
    """``out_dir``/rotation.csv then metrics.json (the manifest, last), each atomically;
    {output name: path}."""
    out = Path(out_dir)
    rotation = atomic_write_text(out / "rotation.csv", rotation_csv(results))
    metrics = atomic_write_text(out / "metrics.json", metrics_json(results))
    return {"metrics": metrics, "rotation_csv": rotation}


def summary_lines(results: dict) -> list[str]:
    """A human-readable table: one row per entry, accuracy per dataset (and per angle), then
    the "comparison" and the novel-viewpoint ("viewpoints") sections when ``results`` has them."""
    viewpoints = results.get(VIEWPOINTS_KEY)
    entries = {n: e for n, e in results.items() if n != COMPARISON_KEY and "model" in e}
    comparison = comparison_lines(results.get(COMPARISON_KEY))
    return _table_lines(entries) + comparison + viewpoint_lines(viewpoints)


def _fmt(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def _cell(value, key: str) -> str:
    if not isinstance(value, dict):
        return "-"
    if "skipped" in value:
        return "skipped"
    return _fmt(value.get(key))


def _sweep(entry: dict) -> dict:
    return entry.get("rotated-mnist", {}).get("accuracy", {})


def _columns(results: dict) -> list[tuple[str, Callable[[dict], str]]]:
    """(title, cell of an entry) for each dataset, one per angle for rotated-mnist."""
    keys: list[str] = []
    for entry in results.values():
        for key, value in entry.items():
            if isinstance(value, dict) and key not in keys and key != "std":
                keys.append(key)
    columns: list[tuple[str, Callable[[dict], str]]] = []
    for key in keys:
        if key == "rotated-mnist":
            sweeps = [e.get(key, {}).get("accuracy", {}) for e in results.values()]
            angles = list(dict.fromkeys(a for sweep in sweeps for a in sweep))
            columns += [(f"{a}°", lambda e, a=a: _fmt(_sweep(e).get(a))) for a in angles]
        elif key == "multimnist":
            columns.append(("multimnist", lambda e: _cell(e.get("multimnist"), "strict_accuracy")))
        elif key not in ("robustness", "equivariance"):
            columns.append((key, lambda e, key=key: _cell(e.get(key), "accuracy")))
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
