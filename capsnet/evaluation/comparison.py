"""The comparison section of metrics.json: capsule model against baselines, several seeds
each, at equal augmentation and epochs, at equal training time and with the baselines'
own augmentation.

A checkpoint takes part when its metadata carries ``extra["comparison"]`` = {"arm",
"label", "reference", "time_budget_seconds"} (written by the train stage) and it was scored
on rotated MNIST (a model whose input shape does not fit that set, as the dataset registry
declares it, is skipped there and has no place in a rotation comparison). The
checkpoints of one arm and label are the seeds of one row; a row holds their mean accuracy
per evaluated rotation angle with the sample standard deviation (0.0 for one seed) and
their mean training time and epochs. The equal-time arm repeats the capsule reference's
row from the equal-augmentation arm. Its budget is what the step-cost rule counts (a
step's cost, measured back to back with the other model's, times the steps: a measure
other load on the machine does not move); each baseline gets its budgeted time over the
reference's (``budgeted_ratio``, which decides ``within_tolerance``: within
``TIME_TOLERANCE`` of 1) and its measured time over the reference's mean measured time
(``time_ratio``). Each run records the load average at its start and end: a seed that
trained on a busy machine (``busy``) has a measured time that is not trustworthy.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from capsnet.evaluation.headline import epochs_text
from capsnet.evaluation.results import (
    ARMS,
    COMPARISON_KEY,  # noqa: F401  (the section's name)
    Comparison,
    ComparisonArm,
    ComparisonGroup,
    Entry,
    as_comparison,
)
from capsnet.evaluation.seeds import seed_of
from capsnet.io.errors import CapsnetError

#: How far a baseline's training time may lie from the budget, as a fraction of it.
TIME_TOLERANCE = 0.25
#: Load average above the machine's cores plus this: other work shared the machine (a
#: run's own threads account for up to the cores).
BUSY_LOAD_MARGIN = 1.0


def busy_run(metrics: dict[str, Any]) -> float | None:
    """The highest load average a run recorded (``load_average``: [at its start, at its
    end]) when it exceeds its machine's ``cpus`` + ``BUSY_LOAD_MARGIN``; None otherwise."""
    loads, cpus = metrics.get("load_average"), metrics.get("cpus")
    if not isinstance(loads, list) or not _is_number(cpus):
        return None
    highest = max((float(x) for x in loads if _is_number(x)), default=None)
    return highest if highest is not None and highest > cpus + BUSY_LOAD_MARGIN else None


def comparison_meta(meta: dict[str, Any], source: str) -> dict[str, Any] | None:
    """A checkpoint's ``extra["comparison"]`` (``meta``: ``capsnet.models.checkpoint.load``'s
    metadata), None when it has none; CapsnetError naming ``source`` when it is malformed."""
    found = (meta.get("extra") or {}).get("comparison")
    if found is None:
        return None
    valid = isinstance(found, dict) and found.get("arm") in ARMS
    if valid:
        budget = found.get("time_budget_seconds")
        valid = (
            isinstance(found.get("label"), str)
            and bool(found["label"])
            and isinstance(found.get("reference"), (str, type(None)))
            and (budget is None or (_is_number(budget) and math.isfinite(budget)))
        )
    if not valid:
        raise CapsnetError(
            f"{source}: extra 'comparison' must be {{'arm': {' | '.join(ARMS)}, 'label': "
            f"text, 'reference': text or null, 'time_budget_seconds': seconds or null}}, "
            f"got {found!r:.200}"
        )
    return found


def comparison_section(
    results: dict[str, Entry], metas: dict[str, dict[str, Any]]
) -> Comparison | None:
    """metrics.json's "comparison" from the evaluated entries ``results`` and each
    checkpoint's metadata ``metas`` ({entry name: meta}); None when no checkpoint takes part."""
    groups: dict[str, dict[str, list[str]]] = {}
    for name, meta in metas.items():
        found = comparison_meta(meta, name)
        entry = results.get(name)
        if found is not None and entry is not None and entry.sweep():
            groups.setdefault(found["arm"], {}).setdefault(found["label"], []).append(name)
    if not groups:
        return None
    rows = {
        arm: {
            label: group_row(label, sorted(names, key=lambda n: seed_of(metas[n])), results, metas)
            for label, names in groups[arm].items()
        }
        for arm in ARMS
        if arm in groups
    }
    arms: dict[str, ComparisonArm] = {}
    equal = rows.get("equal_augmentation", {})
    if equal:
        arms["equal_augmentation"] = ComparisonArm(
            "equal_augmentation", equal, reference=_reference(equal, metas),
            augment=_common([row.augment for row in equal.values()]),
            epochs=_common([row.epochs for row in equal.values()]),
        )  # fmt: skip
    if "equal_time" in rows:
        arms["equal_time"] = _equal_time(rows["equal_time"], equal, metas)
    if "baseline_augmentation" in rows:
        arms["baseline_augmentation"] = ComparisonArm(
            "baseline_augmentation", rows["baseline_augmentation"]
        )
    angles = sorted(
        {float(a) for arm in rows.values() for row in arm.values() for a in row.accuracy}
    )
    return Comparison([int(a) if a.is_integer() else a for a in angles], arms)


def group_row(
    label: str, names: list[str], results: dict[str, Entry], metas: dict[str, dict]
) -> ComparisonGroup:
    """One row: the seeds ``names`` (entries of ``results``) of one arm and ``label``."""
    metas_ = [metas[n] for n in names]
    metrics = [m.get("metrics") or {} for m in metas_]
    seconds = [float(m["train_seconds"]) for m in metrics if _is_number(m.get("train_seconds"))]
    epochs = [float(m["epochs"]) for m in metrics if _is_number(m.get("epochs"))]
    sweeps = [results[n].sweep() for n in names]
    angles = [a for a in sweeps[0] if all(_is_number(s.get(a)) for s in sweeps)]
    extra = metas_[0].get("extra") or {}
    planned = [(m.get("extra") or {}).get("comparison", {}).get("planned_seconds") for m in metas_]
    loads = [m.get("load_average") for m in metrics]
    busy = {n: found for n, m in zip(names, metrics) if (found := busy_run(m)) is not None}
    return ComparisonGroup(
        label,
        model=metas_[0].get("model_name"),
        names=tuple(names),
        seeds=len(names),
        augment=extra.get("augment", metrics[0].get("augment")),
        epochs=statistics.fmean(epochs) if epochs else None,
        train_seconds=statistics.fmean(seconds) if seconds else None,
        train_seconds_std=_std(seconds) if seconds else None,
        accuracy={a: statistics.fmean(float(s[a]) for s in sweeps) for a in angles},
        std={a: _std([float(s[a]) for s in sweeps]) for a in angles},
        budgeted_seconds=statistics.fmean(planned) if all(map(_is_number, planned)) else None,
        busy=tuple(busy),
        load_average=max((float(x) for pair in loads if isinstance(pair, list)
                          for x in pair if _is_number(x)), default=None),
    )  # fmt: skip


def _equal_time(
    rows: dict[str, ComparisonGroup], equal: dict[str, ComparisonGroup], metas: dict
) -> ComparisonArm:
    """The equal-time arm: the reference's row, then each baseline's with its budgeted and
    measured time over the reference's; the tolerance judged on the budgeted times."""
    reference = _reference(rows, metas)
    budget = _mean_meta(rows, metas, "time_budget_seconds")
    if budget is None and reference in equal:
        budget = equal[reference].train_seconds
    budgeted = _mean_meta(rows, metas, "budgeted_seconds")
    models = {}
    if reference in equal:
        models[reference] = dataclasses.replace(equal[reference], budgeted_seconds=budgeted)
    for label, row in rows.items():
        seconds = row.train_seconds
        ratio = seconds / budget if seconds is not None and budget else None
        planned = row.budgeted_seconds
        budgeted_ratio = planned / budgeted if planned is not None and budgeted else None
        judged = budgeted_ratio if budgeted_ratio is not None else ratio  # older runs: measured
        within = judged is not None and abs(judged - 1) <= TIME_TOLERANCE
        models[label] = dataclasses.replace(
            row, time_ratio=ratio, within_tolerance=within, budgeted_ratio=budgeted_ratio
        )
    return ComparisonArm(
        "equal_time", models, reference, time_budget_seconds=budget, tolerance=TIME_TOLERANCE,
        budgeted_seconds=budgeted,
    )  # fmt: skip


def _mean_meta(rows: dict[str, ComparisonGroup], metas: dict, key: str) -> float | None:
    """The mean of the rows' checkpoints' comparison ``key`` (None where none records it)."""
    found = [
        float(value)
        for row in rows.values()
        for n in row.names
        if _is_number(value := comparison_meta(metas[n], n).get(key))
    ]
    return statistics.fmean(found) if found else None


def _reference(rows: dict[str, ComparisonGroup], metas: dict) -> str | None:
    """The capsule model the rows' checkpoints name as their reference (None if they differ)."""
    found = [comparison_meta(metas[n], n).get("reference") for r in rows.values() for n in r.names]
    return _common(found)


def _common(values: list):
    """The value all of ``values`` share, None when they differ."""
    return values[0] if values and all(v == values[0] for v in values) else None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _std(values: list[float]) -> float:
    """Sample standard deviation; 0.0 for a single value."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def comparison_lines(
    section: Comparison | None, angles: tuple[str, ...] = ("0", "35")
) -> list[str]:
    """The comparison as printed lines: per arm and row the seeds, epochs, training time
    (and its ratio to the budget) and mean ± std accuracy at ``angles`` (those evaluated)."""
    section = as_comparison(section)
    if section is None:
        return []
    lines = ["", "comparison (mean ± std over seeds)"]
    for name, arm in section.arms.items():
        budget = arm.time_budget_seconds
        lines.append(f"{name}" + (f" (budget {budget:.1f} s)" if _is_number(budget) else ""))
        for label, row in arm.groups.items():
            shown = [a for a in angles if a in row.accuracy] or list(row.accuracy)[:2]
            cells = [f"{a}° {_pct(row.accuracy[a])} ± {_pct(row.std.get(a))}" for a in shown]
            time = _fmt(row.train_seconds, "s")
            if _is_number(row.time_ratio):
                outside = "" if row.within_tolerance else ", outside tolerance"
                time += f" (x{row.time_ratio:.2f}{outside})"
            parts = [f"{row.seeds} seed(s)", epochs_text(row.epochs), time, *cells]
            lines.append(f"  {label}: " + ", ".join(parts))
    return lines


def _pct(value) -> str:
    return "n/a" if not _is_number(value) or math.isnan(value) else f"{100 * value:.2f}%"


def _fmt(value, unit: str) -> str:
    return "n/a" if not _is_number(value) else f"{value:.1f}{unit}"
