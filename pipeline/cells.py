"""eval/metrics.json (the schema of capsnet/eval/) read once, checked and typed
(``load_results`` -> ``EvalResults``), and turned into table cells: the column titles and
percentages. Which entry fills a model's cell lives in ``capsnet.headline``, shared
with the evaluate stage's summary metrics. Used by report.html (pipeline/report.py), the
README table (pipeline/readme.py) and the W&B eval runs (pipeline/publish.py)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsnet.errors import CapsnetError
from capsnet.headline import (  # noqa: F401  (re-exported for the report and README)
    COMPARISON_KEY,
    VIEWPOINTS_KEY,
    cell_value,
    comparison_run,
    main_entries,
    model_entries,
    model_picks,
    pick,
    std_value,
    table_columns,
    trained_on,
)
from capsnet.io import read_json

#: Sections of metrics.json beside the checkpoint and seed-mean entries.
SECTIONS = (COMPARISON_KEY, VIEWPOINTS_KEY)


@dataclass(frozen=True)
class Entry:
    """One evaluated checkpoint (``checkpoint`` set) or seed mean (``checkpoints``, ``seeds``
    and ``std`` set). ``scores`` maps each test set to its numbers or to {"skipped": why}."""

    name: str
    model: str
    checkpoint: str | None
    checkpoints: tuple[str, ...]
    seeds: int
    scores: dict[str, dict[str, Any]]
    raw: dict[str, Any] = field(repr=False)

    @property
    def skipped(self) -> dict[str, str]:
        """{test set: reason} of the sets this entry was not evaluated on."""
        return {k: str(v["skipped"]) for k, v in self.scores.items() if "skipped" in v}


@dataclass(frozen=True)
class EvalResults:
    """metrics.json, checked: the entries by name, the comparison and viewpoint sections."""

    entries: dict[str, Entry]
    comparison: dict[str, Any] | None
    viewpoints: dict[str, Any] | None
    raw: dict[str, dict] = field(repr=False)

    def checkpoints(self) -> dict[str, Entry]:
        """The entries of single checkpoints (no seed means)."""
        return {n: e for n, e in self.entries.items() if e.checkpoint is not None}


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _check_scores(where: str, scores: Any) -> None:
    """Numbers (or null) at every leaf but the known text fields; a skip has its reason."""
    text_keys = ("skipped", "source", "attack", "subset")
    if isinstance(scores, dict):
        for key, value in scores.items():
            if key in text_keys:
                if not isinstance(value, str):
                    raise CapsnetError(f"{where}/{key}: text expected")
            else:
                _check_scores(f"{where}/{key}", value)
    elif isinstance(scores, list):
        for i, value in enumerate(scores):
            _check_scores(f"{where}/{i}", value)
    elif not _is_number(scores):
        raise CapsnetError(f"{where}: a number expected, got {scores!r:.40}")


def _entry(path: Path, name: str, data: dict) -> Entry:
    where = f"{path}: {name}"
    model, checkpoint = data.get("model"), data.get("checkpoint")
    checkpoints = data.get("checkpoints") or []
    if not isinstance(model, str) or not model:
        raise CapsnetError(f"{where}: no model name")
    if checkpoint is None and not checkpoints:
        raise CapsnetError(f"{where}: neither a checkpoint nor the checkpoints of a seed mean")
    if not isinstance(checkpoint, (str, type(None))) or not all(
        isinstance(c, str) for c in checkpoints
    ):
        raise CapsnetError(f"{where}: checkpoint paths must be text")
    scores = {k: v for k, v in data.items() if isinstance(v, dict) and k != "std"}
    for key, value in scores.items():
        _check_scores(f"{where}/{key}", value)
    _check_scores(f"{where}/std", data.get("std") or {})
    seeds = data.get("seeds", 1)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise CapsnetError(f"{where}/seeds: a count >= 1 expected")
    return Entry(name, model, checkpoint, tuple(checkpoints), seeds, scores, data)


def load_results(path: str | os.PathLike) -> EvalResults:
    """metrics.json checked against the schema of capsnet/eval/ (CapsnetError naming the
    file and the entry otherwise); at least one evaluated checkpoint is required."""
    path = Path(path)
    return parse_results(read_json(path, "run the evaluate stage first"), path)


def parse_results(data: Any, path: str | os.PathLike = "metrics.json") -> EvalResults:
    """``load_results`` for a value already read (``path`` names it in errors)."""
    path = Path(path)
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise CapsnetError(f"{path}: not an evaluation result ({{name: {{...}}}} expected)")
    entries = {
        name: _entry(path, name, value) for name, value in data.items() if name not in SECTIONS
    }
    if not any(e.checkpoint is not None for e in entries.values()):
        raise CapsnetError(f"{path}: no evaluated checkpoint; run the evaluate stage first")
    comparison = data.get(COMPARISON_KEY)
    if comparison is not None and not isinstance(comparison.get("arms", {}), dict):
        raise CapsnetError(f"{path}: {COMPARISON_KEY}/arms: a mapping expected")
    return EvalResults(entries, comparison, data.get(VIEWPOINTS_KEY), data)


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
    title = TITLES.get(column, column)
    if column.startswith("smallnorb"):
        base = column.split("@")[0]
        scored = [e[base] for e in results.values() if cell_value(e, column) is not None]
        if any(str(s.get("source", "")).startswith("smallnorb-synth") for s in scored):
            return title + " (synth stand-in)"
    return title


def percent(value: float | None, std: float | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{100 * value:.2f}%"
    return text + (f" ± {100 * std:.2f}" if std is not None and not math.isnan(std) else "")


def paper_metric(column: str, entry: dict) -> str:
    if column == "affnist" and entry.get("affnist", {}).get("source") != "affnist":
        return ""  # the synthetic stand-in is never compared with the paper's affNIST
    if column.startswith("smallnorb") and str(
        entry.get(column.split("@")[0], {}).get("source", "")
    ).startswith("smallnorb-synth"):
        return ""  # nor the smallNORB stand-in with the paper's smallNORB
    return column
