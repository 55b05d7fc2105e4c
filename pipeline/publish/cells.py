"""Table cells of the evaluation results (``capsnet.evaluation.results``, the metrics.json
contract): the column titles (the dataset specs'), percentages and which paper number a
cell compares with. The report (pipeline/publish/report.py) and the README table
(pipeline/publish/readme.py) use them."""

from __future__ import annotations

import math
import os
from typing import Any

from capsnet.config import dataset_specs
from capsnet.evaluation.headline import cell_value
from capsnet.evaluation.results import Entry, EvalResults, load_results, parse_results
from pipeline.provenance import check_results_text


def column_title(column: str, entries: dict[str, Entry]) -> str:
    """The title of a result column (its dataset's spec); a stand-in's data named as such."""
    base, _, angle = column.partition("@")
    spec = dataset_specs.of_column(column)
    title = dataset_specs.column_title(column)
    if angle and spec is not None and spec.rotations_of is not None:
        return title
    scored = [e.source(base) for e in entries.values() if cell_value(e, column) is not None]
    if any(dataset_specs.is_stand_in(column, s) for s in scored):
        return title + " (synth stand-in)"
    return title


def percent(value: float | None, std: float | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{100 * value:.2f}%"
    return text + (f" ± {100 * std:.2f}" if std is not None and not math.isnan(std) else "")


def paper_metric(column: str, entry: Entry) -> str:
    """The column to look the paper's number up by; "" for a stand-in's data."""
    if dataset_specs.is_stand_in(column, entry.source(column.split("@")[0])):
        return ""  # a stand-in's data is never compared with the paper's
    return column


def publishable(results: Any, path: str | os.PathLike = "metrics.json") -> EvalResults:
    """metrics.json (its path, its content or typed) as the README and the report may print
    it: ``load_results`` / ``parse_results``, then every string checked as plain text
    (``pipeline.provenance.check_results_text``)."""
    if isinstance(results, (str, os.PathLike)):
        path, results = results, load_results(results)
    return check_results_text(path, parse_results(results, path))
