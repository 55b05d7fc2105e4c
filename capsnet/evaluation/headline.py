"""The headline numbers of an evaluation, on the metrics.json dataclasses
(``capsnet.evaluation.results``): which entry fills a model's cell for a test set (the
checkpoint trained for that set, a seed mean over a single checkpoint), its number and
deviation. One code path for the evaluate stage's summary metrics
(``capsnet.evaluation.outputs``), the report, the README table and the W&B runs. These
rules read the dataclasses; the dataclasses never call them."""

from __future__ import annotations

import math
import re
from pathlib import Path

from capsnet.evaluation.results import Comparison, Entry, EvalResults


def _angle_key(entry: Entry, column: str) -> str | None:
    """The key of ``column``'s angle (``rotated-mnist@35``) in its sweep's accuracies."""
    base, _, angle = column.partition("@")
    accuracies = entry.block(base).get("accuracy") or {}
    return next((k for k in accuracies if float(k) == float(angle)), None)


def _swept(column: str) -> bool:
    """Whether ``column`` is one angle of a rotation sweep (``rotated-mnist@35``)."""
    from capsnet.config import dataset_specs

    spec = dataset_specs.of_column(column)
    return "@" in column and spec is not None and spec.rotations_of is not None


def _metric(column: str) -> str:
    """The metrics.json field that holds ``column``'s number (its dataset's headline)."""
    from capsnet.config import dataset_specs

    spec = dataset_specs.of_column(column)
    return "accuracy" if spec is None else spec.headline_metric


def _number(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cell_value(entry: Entry, column: str) -> float | None:
    """The accuracy ``column`` stands for ("mnist", "rotated-mnist@35", "multimnist", ...),
    None when absent or skipped."""
    base = column.split("@")[0]
    if _swept(column):
        key = _angle_key(entry, column)
        return None if key is None else _number(entry.block(base)["accuracy"][key])
    block = entry.block(column)
    return None if "skipped" in block else _number(block.get(_metric(column)))


def std_value(entry: Entry, column: str) -> float | None:
    """The seeds' deviation of ``cell_value`` (None for a single checkpoint)."""
    base = column.split("@")[0]
    spread = entry.deviations.get(base)
    if not isinstance(spread, dict):
        return None
    if _swept(column):
        key = _angle_key(entry, column)
        return None if key is None else _number((spread.get("accuracy") or {}).get(key))
    return _number(spread.get(_metric(column)))


def table_columns(entries: dict[str, Entry], angle: float = 35.0) -> list[str]:
    """The result columns that hold at least one number of ``entries``, in the order the
    dataset specs give (``capsnet.config.dataset_specs.column_titles``)."""
    from capsnet.config import dataset_specs

    candidates = dataset_specs.column_titles(angle)
    return [c for c in candidates if any(cell_value(e, c) is not None for e in entries.values())]


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


#: A run whose accuracy on a set is below this multiple of chance (1 / classes) learned
#: nothing there; one at or above ``LEARNED`` times chance learned. A seed at chance on its
#: own set while another seed of its experiment learned is a failed run, named apart and
#: never averaged into the seed mean.
AT_CHANCE = 1.25
LEARNED = 2.0


def at_chance(entry: Entry, column: str, multiple: float = AT_CHANCE) -> bool:
    """Whether ``entry``'s accuracy on ``column`` is below ``multiple`` times chance (False
    where the column has no chance level or no number)."""
    from capsnet.config import dataset_specs

    chance, value = dataset_specs.chance(column), cell_value(entry, column)
    return chance is not None and value is not None and value < multiple * chance


def trained_for(column: str) -> str | None:
    """The training set a test column is scored for (its dataset's ``trained_on``: the part
    after "@" in a checkpoint name); None for a model's own set."""
    from capsnet.config import dataset_specs

    spec = dataset_specs.of_column(column)
    return None if spec is None else spec.trained_on


def _training_set(tag: str) -> bool:
    """Whether a name after "@" is a dataset; any other (equal-time, a strategy such as
    rotate) names a comparison run, which never fills a model's row."""
    from capsnet.config import dataset_specs

    return tag in dataset_specs.REGISTRY


_SEED = re.compile(r"(?:^|-)seed\d+$")


def _tag(stem: str) -> str:
    """The part of a checkpoint name after "@" without its seed (``lenet5@seed2`` -> "",
    ``lenet5@equal-time-seed1`` -> "equal-time", ``lenet5@multimnist`` -> "multimnist")."""
    return _SEED.sub("", stem.partition("@")[2])


def _stems(entry: Entry) -> list[str]:
    paths = [entry.checkpoint, *entry.checkpoints]
    return [Path(p).stem for p in paths if p] or [entry.name]


def trained_on(entry: Entry) -> str | None:
    """The training set a checkpoint name announces (``lenet5@multimnist`` -> multimnist),
    None for a checkpoint trained on its model's own set (``lenet5``, ``lenet5@seed1``)."""
    return _tag(_stems(entry)[0]) or None


def comparison_run(entry: Entry, comparison: Comparison | None = None) -> bool:
    """Whether an entry is an equal-time or augmented-baseline run (or their mean): named
    with an arm or strategy after "@", or listed in such an arm of ``comparison``."""
    tags = {_tag(stem) for stem in _stems(entry)}
    if any(tag and not _training_set(tag) for tag in tags):
        return True
    listed = {
        listed_name
        for arm in (comparison.arms.values() if comparison is not None else ())
        if arm.name != "equal_augmentation"
        for group in arm.groups.values()
        if group.model != arm.reference
        for listed_name in group.names
    }
    return entry.name in listed or bool(set(entry.names) & listed)


def pick(entries: dict[str, Entry], column: str) -> Entry | None:
    """The entry of one model that fills ``column``: among those with a number for it, the
    one trained for the column's set, then a seed mean over a single checkpoint, then the
    first; None when no entry has a number."""
    wanted = trained_for(column)
    found = [e for e in entries.values() if cell_value(e, column) is not None]
    if not found:
        return None

    def rank(entry: Entry) -> tuple[bool, bool]:
        return trained_on(entry) == wanted, entry.checkpoint is None

    best = max(rank(entry) for entry in found)
    return next(entry for entry in found if rank(entry) == best)


def main_entries(results: EvalResults) -> dict[str, Entry]:
    """The entries the main table is built from: the checkpoint and seed-mean entries
    without the comparison runs (equal time, augmented baselines) and their means."""
    return {
        name: entry
        for name, entry in results.entries.items()
        if not comparison_run(entry, results.comparison)
    }


def model_picks(entries: dict[str, Entry], columns: list[str]) -> dict[str, dict[str, Entry]]:
    """{model: {column: entry}}: one row per model, each cell from ``pick`` over that
    model's ``entries``."""
    models: dict[str, dict[str, Entry]] = {}
    for name, entry in entries.items():
        models.setdefault(entry.model, {})[name] = entry
    return {
        model: {c: found for c in columns if (found := pick(group, c)) is not None}
        for model, group in models.items()
    }
