"""What eval/metrics.json["comparison"] shows, in words and table rows: per arm (equal
augmentation, equal training time, augmented baseline) the capsule model against each
baseline upright (0°) and at the headline angle, and whether the difference of means is
larger than the seeds' spread. Pure functions of the typed section (``capsnet.evaluation.results.
Comparison``; metrics.json's dict is typed on the way in); report.html, the README block
and the W&B publish run render what they return."""

from __future__ import annotations

import math
from dataclasses import dataclass

from capsnet.config import dataset_specs
from capsnet.evaluation.headline import epochs_text
from capsnet.evaluation.results import Comparison, ComparisonArm, ComparisonGroup, as_comparison
from pipeline.paper import ARTICLE, is_baseline, published
from pipeline.publish.cells import percent

#: The rotated-MNIST article's angle (pipeline.paper.ARTICLE): its LeNet5 and CapsNet
#: numbers are at 35°.
HEADLINE_ANGLE = 35.0
ARM_TITLES = {
    "equal_augmentation": "Equal augmentation",
    "equal_time": "Equal training time",
    "baseline_augmentation": "Augmented baseline",
}


def arms(comparison: Comparison | dict | None) -> dict[str, ComparisonArm]:
    """The arms of a comparison section in a fixed order (unknown arms last); {} for none."""
    found = section.arms if (section := as_comparison(comparison)) else {}
    order = [a for a in ARM_TITLES if a in found] + [a for a in found if a not in ARM_TITLES]
    return {a: found[a] for a in order}


def _angle_keys(comparison: Comparison | dict | None) -> list[str]:
    return sorted(
        {k for arm in arms(comparison).values() for g in arm.groups.values() for k in g.accuracy},
        key=float,
    )


def angle_key(comparison: Comparison | dict | None, target: float) -> str | None:
    """The evaluated angle nearest ``target`` as its key in the groups' accuracies."""
    keys = _angle_keys(comparison)
    return min(keys, key=lambda k: (abs(float(k) - target), float(k))) if keys else None


def stat(group: ComparisonGroup, key: str | None) -> tuple[float, float] | None:
    """(mean, std) of a group's accuracy at angle ``key``; None when not evaluated."""
    mean = group.accuracy.get(key)
    if mean is None or math.isnan(mean):
        return None
    std = group.std.get(key)
    return float(mean), float(std) if std is not None and std == std else 0.0


def show(value: tuple[float, float] | None) -> str:
    """A (mean, std) accuracy as "66.00% ± 1.20" ("66.00%" without a spread)."""
    return "–" if value is None else percent(*value)


def _reference(arm: ComparisonArm, fallback: str | None = None) -> str | None:
    """The capsule group of an arm: its "reference", else the first non-CNN model."""
    ref = arm.reference or fallback
    label = next((k for k, g in arm.groups.items() if ref in (k, g.model)), None)
    return label or next((k for k, g in arm.groups.items() if not is_baseline(g.model)), None)


def verdict(a: tuple[float, float], b: tuple[float, float], names: tuple[str, str], seeds):
    """("ahead" | "behind" | "unclear" | "one seed", words) for group a against group b."""
    diff = 100 * (a[0] - b[0])
    if min(seeds) < 2:
        return "one seed", f"one seed, so no spread to judge the {abs(diff):.2f}-point difference"
    spread = 100 * (a[1] + b[1])
    if abs(diff) > spread:
        leader = names[0] if diff > 0 else names[1]
        text = f"{leader} ahead by {abs(diff):.2f} points, more than the seeds' spread"
        text += f" (std sum {spread:.2f})"
        return ("ahead" if diff > 0 else "behind"), text
    count = str(seeds[0]) if seeds[0] == seeds[1] else f"{seeds[0]} and {seeds[1]}"
    return "unclear", (
        f"a difference of {abs(diff):.2f} points, within the seeds' spread (std sum {spread:.2f}): "
        f"no clear difference at {count} seeds"
    )


def _angle_words(key: str, target: float) -> str:
    angle = float(key)
    if angle == 0:
        return "at 0° (upright MNIST)"
    if angle == target:
        return f"at {angle:g}°"
    return f"at {angle:g}° (the evaluated angle nearest {target:g}°)"


def _pair(caps: ComparisonGroup, base: ComparisonGroup, key: str, target: float):
    """(outcome, clause) comparing two groups at angle ``key``; None when one lacks it."""
    a, b = stat(caps, key), stat(base, key)
    if a is None or b is None:
        return None
    kind, words = verdict(a, b, (caps.label, base.label), (caps.seeds, base.seeds))
    return kind, (
        f"{_angle_words(key, target)} {caps.label} {show(a)} against {base.label} {show(b)}, "
        f"{words}"
    )


def _time_sentence(arm: ComparisonArm, group: ComparisonGroup, reference: str) -> str:
    """The equal-time verdict: the budgeted times (the step-cost rule's, which decides the
    tolerance), the measured ones beside them, and which seeds' measured times a busy
    machine makes untrustworthy."""
    tolerance = arm.tolerance or 0.25
    budgeted, planned = arm.budgeted_seconds, group.budgeted_seconds
    budget, seconds = arm.time_budget_seconds, group.train_seconds
    label, epochs = group.label, group.epochs
    ran = f" ({epochs_text(epochs)})" if epochs is not None else ""
    if budgeted is not None and planned is not None:
        ratio = group.budgeted_ratio or planned / budgeted
        head = (
            f"Equal training time: by the step-cost rule (a step's cost times the steps) "
            f"{reference} trains {budgeted:.1f} s and {label}{ran} {planned:.1f} s, {ratio:.2f} "
            f"of it"
        )
        measured = ""
        if budget is not None and seconds is not None:
            measured = (
                f"; measured, {budget:.1f} s and {seconds:.1f} s of CPU time "
                f"({seconds / budget:.2f})"
                if budget
                else ""
            )
    else:
        if budget is None or seconds is None:
            return f"Equal training time: no time budget was recorded for {label}."
        ratio = group.time_ratio if group.time_ratio is not None else seconds / budget
        head = (
            f"Equal training time: the budget was {budget:.1f} s, {reference}'s mean training "
            f"time; {label} trained {seconds:.1f} s{ran}, {ratio:.2f} of the budget"
        )
        measured = ""
    within = group.within_tolerance
    if within is None:
        within = abs(ratio - 1) <= tolerance
    verdict = (
        f", within the {tolerance:.0%} tolerance" if within
        else f", NOT within the {tolerance:.0%} tolerance: not an equal-time comparison"
    )  # fmt: skip
    return head + verdict + measured + "." + _busy_words(arm, group, reference)


def _busy_words(arm: ComparisonArm, group: ComparisonGroup, reference: str) -> str:
    """ " Measured times of ... are not trustworthy: ..." for seeds trained on a busy
    machine (load average above its cores plus one); "" when none was."""
    rows = [arm.groups.get(reference), group]
    busy = [n for row in rows if row is not None for n in row.busy]
    if not busy:
        return ""
    load = max(row.load_average or 0.0 for row in rows if row is not None and row.busy)
    return (
        f" The measured times of {', '.join(busy)} are not trustworthy: other work shared the "
        f"machine (load average up to {load:.1f})."
    )


def _prefix(arm: ComparisonArm, group: ComparisonGroup, reference: str | None) -> str:
    title = ARM_TITLES.get(arm.name, arm.name)
    if arm.name == "baseline_augmentation":
        augment = group.augment or "its own"
        return f"{title} ({augment} augmentation, against the equal-augmentation {reference})"
    details = [arm.augment] if arm.augment else []
    if arm.epochs is not None:
        details.append(epochs_text(arm.epochs))
    return f"{title} ({', '.join(details)})" if details else title


def _arm_sentences(arm: ComparisonArm, keys: list[str], target: float, ref_arm: ComparisonArm):
    """(outcomes at the headline angle, sentences) for one arm; the augmented baseline is
    compared at the headline angle with the capsule group of ``ref_arm``."""
    if arm.name == "baseline_augmentation":
        ref = _reference(ref_arm, arm.reference)
        caps = ref_arm.groups[ref] if ref else None
        keys = keys[-1:]
    else:
        ref = _reference(arm)
        caps = arm.groups[ref] if ref else None
    outcomes, lines = [], []
    for label, group in arm.groups.items():
        if label == ref:
            continue
        if arm.name == "equal_time":
            lines.append(_time_sentence(arm, group, ref or str(arm.reference)))
        clauses = []
        for key in keys if caps else []:
            found = _pair(caps, group, key, target)
            if found:
                clauses.append(found[1])
                outcomes += [found[0]] if key == keys[-1] else []
        if clauses:  # the arm's verdict on this baseline: one sentence
            lines.append(f"{_prefix(arm, group, ref)}: " + "; ".join(clauses) + ".")
    return outcomes, lines


#: How each judged outcome of a comparison reads in the headline sentence.
_OUTCOME_WORDS = {
    "ahead": "ahead by more than the seeds' spread",
    "behind": "behind by more than the seeds' spread",
    "unclear": "level within the seeds' spread",
}


def _summary(outcomes: list[str], key: str, target: float) -> str:
    """The headline: how many comparisons the capsule model wins, loses or ties, e.g. "At
    35°, the capsule model is behind by more than the seeds' spread in 1 of 2 comparisons
    and level within the seeds' spread in 1 of 2." (only the outcomes that occurred)."""
    where = _angle_words(key, target)
    where = where[0].upper() + where[1:]
    total = len(outcomes)
    noun = "comparison" if total == 1 else "comparisons"
    parts = [
        f"{words} in {outcomes.count(kind)} of {total}"
        for kind, words in _OUTCOME_WORDS.items()
        if outcomes.count(kind)
    ]
    single = outcomes.count("one seed")
    unjudged = f"{single} of {total} {noun} used one seed, with no spread to judge by"
    if not parts:
        return f"{where}, {unjudged}."
    parts[0] += f" {noun}"
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + f" and {parts[-1]}"
    tail = f"; {unjudged}" if single else ""
    return f"{where}, the capsule model is {listed}{tail}."


def _paper_context(target: float) -> str | None:
    """The rotated-MNIST article's numbers (pipeline/paper.py) as context, never as our
    results."""
    sweep = dataset_specs.ROTATION_SETS[0]
    found = [
        published(metric, family)
        for family in ("lenet5", "capsnet")
        for metric in (f"{sweep}@0", f"{sweep}@35")
    ]
    if None in found:
        return None
    lenet, lenet35, caps, caps35 = (percent(p.accuracy) for p in found)
    return (
        f"For context, not our results: the article {ARTICLE} reports LeNet5 {lenet} on "
        f"upright MNIST and {lenet35} at 35°, a CapsNet {caps} and {caps35}, each trained "
        f"in its own setup."
    )


def sentences(comparison: Comparison | dict | None, angle: float = HEADLINE_ANGLE) -> list[str]:
    """Plain-English sentences saying what the comparison shows, favourable to capsules or
    not: a summary at the headline angle, then each arm's numbers; [] without arms."""
    found = arms(comparison)
    upright, headline = angle_key(comparison, 0.0), angle_key(comparison, angle)
    if not found or headline is None:
        return []
    keys = list(dict.fromkeys(k for k in (upright, headline) if k is not None))
    ref_arm = found.get("equal_augmentation") or next(iter(found.values()))
    outcomes, lines = [], []
    for arm in found.values():
        arm_outcomes, arm_lines = _arm_sentences(arm, keys, angle, ref_arm)
        outcomes += arm_outcomes
        lines += arm_lines
    summary = [_summary(outcomes, headline, angle)] if outcomes else []
    context = _paper_context(angle)
    return summary + lines + ([context] if context else [])


# --- rows for the tables -------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One arm and model of the comparison tables: seeds, augmentation, epochs, training
    seconds (mean, std), accuracy upright and at the headline angle ((mean, std) or None)
    and the headline angle's key."""

    arm: str
    model: str
    seeds: int
    augment: str | None
    epochs: float | None
    train_seconds: float | None
    train_seconds_std: float | None
    upright: tuple[float, float] | None
    headline: tuple[float, float] | None
    angle: str | None
    budgeted_seconds: float | None = None  # the equal-time arm's step-cost rule


def rows(comparison: Comparison | dict | None, angle: float = HEADLINE_ANGLE) -> list[Row]:
    """One row per arm and model (the group's label)."""
    upright, headline = angle_key(comparison, 0.0), angle_key(comparison, angle)
    return [
        Row(
            name,
            label,
            group.seeds,
            group.augment or arm.augment,
            arm.epochs if group.epochs is None else group.epochs,
            group.train_seconds,
            group.train_seconds_std,
            stat(group, upright),
            stat(group, headline),
            headline,
            group.budgeted_seconds,
        )
        for name, arm in arms(comparison).items()
        for label, group in arm.groups.items()
    ]


def seconds(row: Row) -> str:
    """A row's training time as "27.3 ± 0.4" (seconds), "–" when not recorded."""
    value, std = row.train_seconds, row.train_seconds_std
    if value is None:
        return "–"
    return f"{value:.1f}" + (f" ± {std:.1f}" if isinstance(std, (int, float)) and std else "")


def long_rows(comparison: Comparison | dict | None) -> list[list]:
    """[arm, model, seeds, angle, mean, std] for every arm, model and evaluated angle."""
    out = []
    for name, arm in arms(comparison).items():
        for label, group in arm.groups.items():
            for key in sorted(group.accuracy, key=float):
                found = stat(group, key)
                if found is not None:
                    out.append([name, label, group.seeds, float(key), *found])
    return out


def markdown(comparison: Comparison | dict | None, angle: float = HEADLINE_ANGLE) -> str:
    """The README's compact comparison: a table (arm, model, seeds, the step-cost rule's
    budgeted seconds, measured seconds, MNIST, the headline angle; mean ± std) and the
    sentences; "" without a comparison."""
    table = rows(comparison, angle)
    words = sentences(comparison, angle)
    if not table:
        return ""
    head = f"{float(table[0].angle):g}°" if table[0].angle is not None else f"{angle:g}°"
    lines = [
        f"| comparison arm | model | seeds | budgeted s | train s | MNIST (0°) | {head} |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table:
        arm = ARM_TITLES.get(r.arm, r.arm).lower()
        cells = [
            arm,
            r.model,
            str(r.seeds),
            "–" if r.budgeted_seconds is None else f"{r.budgeted_seconds:.1f}",
            seconds(r),
            show(r.upright),
            show(r.headline),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\n" + " ".join(words) if words else "")
