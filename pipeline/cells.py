"""Table cells of the evaluation results (``capsnet.metrics``, the metrics.json
contract): the column titles, percentages and which paper number a cell compares with. The
report (pipeline/report.py) and the README table (pipeline/readme.py) use them."""

from __future__ import annotations

import math

from capsnet.metrics import Entry

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


def column_title(column: str, entries: dict[str, Entry]) -> str:
    """The title of a result column; a stand-in's data named as such."""
    if column.startswith("rotated-mnist@"):
        return f"rotated MNIST {column.split('@')[1]}°"
    if column == "affnist":
        scored = [e.source("affnist") for e in entries.values() if e.value("affnist") is not None]
        real = scored and all(s == "affnist" for s in scored)
        return "affNIST" if real else "affNIST (synth stand-in)"
    title = TITLES.get(column, column)
    if column.startswith("smallnorb"):
        base = column.split("@")[0]
        scored = [e.source(base) for e in entries.values() if e.value(column) is not None]
        if any(str(s or "").startswith("smallnorb-synth") for s in scored):
            return title + " (synth stand-in)"
    return title


def percent(value: float | None, std: float | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{100 * value:.2f}%"
    return text + (f" ± {100 * std:.2f}" if std is not None and not math.isnan(std) else "")


def paper_metric(column: str, entry: Entry) -> str:
    """The column to look the paper's number up by; "" for a stand-in's data."""
    if column == "affnist" and entry.source("affnist") != "affnist":
        return ""  # the synthetic stand-in is never compared with the paper's affNIST
    if column.startswith("smallnorb") and str(entry.source(column.split("@")[0]) or "").startswith(
        "smallnorb-synth"
    ):
        return ""  # nor the smallNORB stand-in with the paper's smallNORB
    return column
