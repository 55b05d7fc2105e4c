"""The headline numbers of an evaluation: which entry fills a model's cell for a test set
(the checkpoint trained for that set, a seed mean over a single checkpoint), its number and
deviation. Shared by the evaluate stage's summary metrics (``capsnet.evaluation.outputs``), the
report and the README table (``capsnet.evaluation.metrics``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

VIEWPOINTS_KEY = "viewpoints"  # metrics.json's novel-viewpoint section, not a checkpoint
COMPARISON_KEY = "comparison"  # metrics.json's seeds comparison, not a checkpoint


def model_entries(results: dict) -> dict[str, dict]:
    """The checkpoint and seed-mean entries of ``results`` (without the "viewpoints" and
    "comparison" sections)."""
    return {
        n: e
        for n, e in results.items()
        if n not in (VIEWPOINTS_KEY, COMPARISON_KEY) and isinstance(e, dict) and "model" in e
    }


def _angle_key(entry: dict, column: str) -> str | None:
    """The key of ``column``'s angle (``rotated-mnist@35``) in its sweep's accuracies."""
    base, _, angle = column.partition("@")
    accuracies = entry.get(base, {}).get("accuracy", {})
    return next((k for k in accuracies if float(k) == float(angle)), None)


def _swept(column: str) -> bool:
    """Whether ``column`` is one angle of a rotation sweep (``rotated-mnist@35``)."""
    from capsnet.data import registry

    spec = registry.of_column(column)
    return "@" in column and spec is not None and spec.rotations_of is not None


def _metric(column: str) -> str:
    """The metrics.json field that holds ``column``'s number (its dataset's headline)."""
    from capsnet.data import registry

    spec = registry.of_column(column)
    return "accuracy" if spec is None else spec.headline_metric


def cell_value(entry: dict, column: str) -> float | None:
    """The accuracy ``column`` stands for ("mnist", "rotated-mnist@35", "multimnist", ...),
    None when absent or skipped."""
    if _swept(column):
        key = _angle_key(entry, column)
        return None if key is None else entry[column.split("@")[0]]["accuracy"][key]
    value = entry.get(column)
    if not isinstance(value, dict) or "skipped" in value:
        return None
    found = value.get(_metric(column))
    return found if isinstance(found, (int, float)) else None


def std_value(entry: dict, column: str) -> float | None:
    std = entry.get("std") or {}
    if _swept(column):
        key = _angle_key(entry, column)
        return (std.get(column.split("@")[0]) or {}).get("accuracy", {}).get(key)
    value = std.get(column) or {}
    return value.get(_metric(column))


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


def count_text(value) -> str:
    """A count that may be a mean over seeds: "3", or one decimal ("33.7"); "n/a" when
    absent. Every place that shows a comparison's epochs formats them with this."""
    if not isinstance(value, (int, float)) or math.isnan(value):
        return "n/a"
    return f"{value:g}" if float(value).is_integer() else f"{value:.1f}"


def epochs_text(value) -> str:
    """'1 epoch', '3 epochs', '33.7 epochs' (a mean over seeds), 'epochs n/a'."""
    if count_text(value) == "n/a":
        return "epochs n/a"
    return f"{count_text(value)} epoch" + ("" if value == 1 else "s")


# --- which entry fills a model's cell ----------------------------------------------------------


def trained_for(column: str) -> str | None:
    """The training set a test column is scored for (its dataset's ``trained_on``: the part
    after "@" in a checkpoint name); None for a model's own set."""
    from capsnet.data import registry

    spec = registry.of_column(column)
    return None if spec is None else spec.trained_on


def _training_set(tag: str) -> bool:
    """Whether a name after "@" is a dataset; any other (equal-time, a strategy such as
    rotate) names a comparison run, which never fills a model's row."""
    from capsnet.data import registry

    return tag in registry.REGISTRY


_SEED = re.compile(r"(?:^|-)seed\d+$")


def _tag(stem: str) -> str:
    """The part of a checkpoint name after "@" without its seed (``lenet5@seed2`` -> "",
    ``lenet5@equal-time-seed1`` -> "equal-time", ``lenet5@multimnist`` -> "multimnist")."""
    return _SEED.sub("", stem.partition("@")[2])


def _stems(name: str, entry: dict) -> list[str]:
    paths = [entry.get("checkpoint"), *(entry.get("checkpoints") or [])]
    return [Path(p).stem for p in paths if p] or [name]


def trained_on(name: str, entry: dict) -> str | None:
    """The training set a checkpoint name announces (``lenet5@multimnist`` -> multimnist),
    None for a checkpoint trained on its model's own set (``lenet5``, ``lenet5@seed1``)."""
    return _tag(_stems(name, entry)[0]) or None


def comparison_run(name: str, entry: dict, comparison: dict | None = None) -> bool:
    """Whether an entry is an equal-time or augmented-baseline run (or their mean): named
    with an arm or strategy after "@", or listed in such an arm of ``comparison``."""
    tags = {_tag(stem) for stem in _stems(name, entry)}
    if any(tag and not _training_set(tag) for tag in tags):
        return True
    listed = {
        listed_name
        for arm, section in ((comparison or {}).get("arms") or {}).items()
        if arm != "equal_augmentation" and isinstance(section, dict)
        for group in (section.get("models") or {}).values()
        if isinstance(group, dict) and group.get("model") != section.get("reference")
        for listed_name in group.get("names") or []
    }
    return name in listed or bool(set(entry.get("names") or []) & listed)


def pick(entries: dict[str, dict], column: str) -> tuple[str, dict] | None:
    """The entry of one model that fills ``column``: among those with a number for it, the
    one trained for the column's set, then a seed mean over a single checkpoint, then the
    first; None when no entry has a number."""
    wanted = trained_for(column)
    found = [(n, e) for n, e in entries.items() if cell_value(e, column) is not None]
    if not found:
        return None

    def rank(item: tuple[str, dict]) -> tuple[bool, bool]:
        name, entry = item
        return trained_on(name, entry) == wanted, "checkpoint" not in entry

    best = max(rank(item) for item in found)
    return next(item for item in found if rank(item) == best)


def main_entries(results: dict) -> dict[str, dict]:
    """The entries the main table is built from: ``model_entries`` without the comparison
    runs (equal time, augmented baselines) and their means."""
    comparison = results.get(COMPARISON_KEY)
    return {
        name: entry
        for name, entry in model_entries(results).items()
        if not comparison_run(name, entry, comparison)
    }


def model_picks(entries: dict[str, dict], columns: list[str]) -> dict[str, dict[str, tuple]]:
    """{model: {column: (entry name, entry)}}: one row per model, each cell from ``pick``
    over that model's ``entries``."""
    models: dict[str, dict[str, dict]] = {}
    for name, entry in entries.items():
        models.setdefault(entry["model"], {})[name] = entry
    return {
        model: {c: found for c in columns if (found := pick(group, c)) is not None}
        for model, group in models.items()
    }
