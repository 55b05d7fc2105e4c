"""The novel-viewpoint experiment's reusable parts (Hinton, Sabour, Frosst 2018, section
5.2; SPEC 2.3): the matching rule, the paper's numbers and reading the stage's results.
The stage itself (training, writing the outputs) is ``pipeline.viewpoints.stage``.

For each kind (azimuth, elevation), the capsule model and the CNN are trained on the
familiar viewpoints of the smallNORB training set (``<kind>-familiar``: azimuths 300..40
degrees, or the three lowest elevations) with ``capsnet.training.fit.fit``. After every epoch
(and, with ``viewpoints.checks_per_epoch``, at evenly spaced checks within it) each model's
error is measured on the familiar and the novel viewpoints of the test set.

The paper compares the two on novel viewpoints at matched familiar error (it stopped
training the capsules when they matched the CNN's familiar error). ``select_matched`` does
this after the fact: the target is the larger of the two models' best familiar errors (the
level both reach), and each model is taken at its FIRST check whose familiar error is at or
below the target; a model that learns fast needs checks within an epoch, or its first epoch
below the target can undershoot it by more than the tolerance. With ``viewpoints.match:
nearest`` a model is taken instead at its lowest error before that check when that is
nearer the target (a model whose error jumps by points between checks, such as a CNN in
small batches, can land far below the target right after being just above it). The
result names the chosen checks, their familiar and novel errors, the familiar-error gap
that remains and whether it is within the tolerance.

The stage writes, atomically as one directory, ``<out_dir>/<kind>/<model>.pt``
(the selected weights, with the history and selection in the checkpoint's metrics)
and ``<out_dir>/viewpoints.json``, then ``<out_dir>.csv`` beside the directory (kind, model,
epoch, familiar_error, novel_error; a small file git keeps, so `dvc plots show` draws it on a
fresh clone). With smallNORB switched off it writes ``DISABLED.txt`` and ``viewpoints.json``
= {"disabled": reason}, never numbers, and the CSV's header.

No torch, Ray, DVC or W&B here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from capsnet.config.viewpoints import KINDS

RESULTS_FILE = "viewpoints.json"
#: What the stage writes into its out_dir (replaced whole): the results and the
#: checkpoints of each kind (``<kind>/<model>.pt``).
OUT_DIR_FILES = (RESULTS_FILE, *(f"{kind}/*.pt" for kind in KINDS))
CSV_COLUMNS = ("kind", "seed", "model", "epoch", "familiar_error", "novel_error")
# Test error on the novel viewpoints at matched familiar error (paper section 5.2, SPEC 2.3).
PAPER_NOVEL_ERROR = {
    "azimuth": {"cnn": 0.20, "capsules": 0.135},
    "elevation": {"cnn": 0.178, "capsules": 0.123},
}
PAPER_NOTE = (
    "Hinton, Sabour, Frosst 2018, section 5.2: smallNORB test error on novel viewpoints of "
    "the baseline CNN and the capsules at matched familiar-viewpoint error"
)
RULES = {
    "first": (
        "target = the larger of the models' best familiar test errors; each model is taken at "
        "its first check (the end of an epoch, or one of viewpoints.checks_per_epoch within it) "
        "whose familiar error is <= target"
    ),
    "nearest": (
        "target = the larger of the models' best familiar test errors; each model is taken at "
        "whichever is nearer the target (the later on a tie) of its first check (the end of an "
        "epoch, or one of viewpoints.checks_per_epoch within it) whose familiar error is <= "
        "target and its lowest familiar error before that check"
    ),
    "lowest": (
        "the lowest familiar test error both models reach within the tolerance of each other: "
        "of every pair of checks whose weights are kept (each model's new best familiar errors, "
        "at epoch ends or viewpoints.checks_per_epoch within them), the pair within the "
        "tolerance whose higher error is lowest; target = that higher error (the nearest "
        "rule's pair when no pair is within the tolerance)"
    ),
}
RULE = RULES["first"]  # the default rule's text (ViewpointsParams.match: first)

# --- the matching rule (pure) -------------------------------------------------------------------


def select_matched(
    histories: Mapping[str, Sequence[Mapping[str, Any]]],
    tolerance: float = 0.0,
    rule: str = "first",
) -> dict[str, Any]:
    """The matched pair of epochs for per-model histories.

    ``histories``: {model or role: [{"epoch", "familiar_error", "novel_error"}, ...]} in
    the order measured ("epoch": whole, or fractional for a check within an epoch).
    Returns {"target_familiar_error", "gap", "tolerance", "matched", "models": {key:
    {"epoch", "familiar_error", "novel_error", "best_familiar_error"}}}, where target = max
    over models of their minimum familiar error, each model's check is the first whose
    familiar error <= target (``rule`` "first"), or whichever of that check and the
    model's lowest familiar error before it is nearer the target (``rule`` "nearest": for
    a model checked often whose error jumps past the target between two checks), gap = the
    spread of the chosen familiar errors and matched = gap <= tolerance. ValueError for no
    models, an empty history, a NaN error or an unknown rule.
    """
    if rule not in RULES:
        raise ValueError(f"unknown matching rule {rule!r}: one of {', '.join(RULES)}")
    if not histories:
        raise ValueError("select_matched needs at least one model history")
    if rule == "lowest":
        return _lowest_pair(histories, tolerance)
    best: dict[str, float] = {}
    for key, history in histories.items():
        errors = [float(record["familiar_error"]) for record in history]
        if not errors:
            raise ValueError(f"{key}: empty history (no epoch was measured)")
        if any(math.isnan(e) for e in errors):
            raise ValueError(f"{key}: a familiar error is NaN (empty test subset?)")
        best[key] = min(errors)
    target = max(best.values())
    chosen: dict[str, dict[str, Any]] = {}
    for key, history in histories.items():
        index = next(i for i, r in enumerate(history) if float(r["familiar_error"]) <= target)
        if rule == "nearest" and index > 0:
            above = min(range(index), key=lambda i: float(history[i]["familiar_error"]))
            over = float(history[above]["familiar_error"]) - target
            if over < target - float(history[index]["familiar_error"]):
                index = above  # the lowest approach from above is nearer the target
        record = history[index]
        novel = record.get("novel_error")
        chosen[key] = {
            "epoch": record.get("epoch", index + 1),
            "familiar_error": float(record["familiar_error"]),
            "novel_error": None if novel is None else float(novel),
            "best_familiar_error": best[key],
        }
    familiar = [c["familiar_error"] for c in chosen.values()]
    gap = max(familiar) - min(familiar)
    return {
        "target_familiar_error": target,
        "gap": gap,
        "tolerance": float(tolerance),
        "matched": bool(gap <= tolerance + 1e-12),
        "models": chosen,
    }


def _lowest_pair(histories: Mapping[str, Sequence[Mapping[str, Any]]], tolerance: float):
    """``select_matched`` by the "lowest" rule (two models): among the pairs of kept checks
    (``candidate_epochs`` of each) whose familiar errors are within ``tolerance``, the one
    whose higher error is lowest (then the smaller gap, then the earlier checks); the
    "nearest" selection when no pair is within the tolerance."""
    if len(histories) != 2:
        raise ValueError(f"the lowest rule pairs two models, got {len(histories)}")
    (key_a, a), (key_b, b) = histories.items()
    errors = {k: [float(r["familiar_error"]) for r in h] for k, h in histories.items()}
    for key, found in errors.items():
        if not found:
            raise ValueError(f"{key}: empty history (no epoch was measured)")
        if any(math.isnan(e) for e in found):
            raise ValueError(f"{key}: a familiar error is NaN (empty test subset?)")
    pairs = [
        (max(ea, eb), abs(ea - eb), i, j)
        for i in candidate_epochs(errors[key_a])
        for j in candidate_epochs(errors[key_b])
        if abs((ea := errors[key_a][i - 1]) - (eb := errors[key_b][j - 1])) <= tolerance + 1e-12
    ]
    if not pairs:
        return select_matched(histories, tolerance, "nearest")
    level, gap, i, j = min(pairs)
    chosen = {}
    for key, history, index in ((key_a, a, i), (key_b, b, j)):
        record, novel = history[index - 1], history[index - 1].get("novel_error")
        chosen[key] = {
            "epoch": record.get("epoch", index),
            "familiar_error": errors[key][index - 1],
            "novel_error": None if novel is None else float(novel),
            "best_familiar_error": min(errors[key]),
        }
    return {
        "target_familiar_error": level,
        "gap": gap,
        "tolerance": float(tolerance),
        "matched": True,
        "models": chosen,
    }


def candidate_epochs(familiar_errors: Sequence[float]) -> list[int]:
    """1-based positions of the checks (epochs, when measured once an epoch) that
    ``select_matched`` can ever choose: those whose familiar error is a new strict minimum
    (one at or above an earlier one is never the first <= any target, nor the lowest before
    it). Only these checks' weights need keeping."""
    out, low = [], math.inf
    for epoch, error in enumerate(familiar_errors, start=1):
        if error < low:
            out.append(epoch)
            low = error
    return out


# --- results --------------------------------------------------------------------------------


def csv_path(out_dir: str | Path) -> Path:
    """The per-epoch CSV of ``out_dir``: ``<out_dir>.csv``, beside the directory."""
    out = Path(out_dir)
    return out.with_name(out.name + ".csv")


def read_results(out_dir: str | Path) -> tuple[dict | None, str | None]:
    """(viewpoints.json content, None), or (None, why there are no results) for a missing,
    switched-off or unreadable ``out_dir``."""
    from capsnet.io.errors import CapsnetError
    from capsnet.io.files import read_disabled, read_json

    out = Path(out_dir)
    if not out.is_dir():
        return None, f"{out} not found (run `capsnet viewpoints` or `dvc repro viewpoints`)"
    reason = read_disabled(out)
    if reason is not None:
        return None, reason
    path = out / RESULTS_FILE
    try:
        payload = read_json(path)
    except CapsnetError as exc:
        return None, str(exc)
    if not isinstance(payload, dict) or not isinstance(payload.get("kinds"), dict):
        return None, f"{path}: no per-kind results"
    return payload, None
