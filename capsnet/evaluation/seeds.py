"""Several checkpoints of one experiment (seeds): one seed-mean ``Entry`` with the mean of
every number and the standard deviations.

An experiment is the model name, the model config, the training config without the seed
(and without the settings that do not change what is learnt) and the training data
recorded in the checkpoint, and the comparison arm and label it was trained for;
checkpoints differing in anything else are not seeds of one another and are never averaged.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from capsnet.evaluation.results import Entry

#: TrainConfig fields that do not change the trained weights' distribution: the seed
#: itself, and how the run is shown or batched for validation.
NOT_EXPERIMENT = ("seed", "progress", "num_workers", "eval_batch_size")
#: Metrics and extra fields of a checkpoint that describe its training data.
DATA_FIELDS = ("dataset", "subset", "train_subset", "augment", "train_images", "train_size",
               "channels", "kind")  # fmt: skip


def experiment_key(meta: dict[str, Any]) -> str:
    """The experiment of a checkpoint (``capsnet.models.checkpoint.load``'s metadata) as text:
    equal for checkpoints that differ only in their seed."""
    train = {k: v for k, v in (meta.get("train_config") or {}).items() if k not in NOT_EXPERIMENT}
    data: dict[str, Any] = {}
    for source in (meta.get("metrics") or {}, meta.get("extra") or {}):
        data.update({k: source[k] for k in DATA_FIELDS if k in source})
    compared = (meta.get("extra") or {}).get("comparison")
    experiment = {
        "model": meta.get("model_name"),
        "model_config": meta.get("model_config"),
        "train_config": train,
        "data": data,
        "comparison": [compared.get(k) for k in ("arm", "label")]
        if isinstance(compared, dict)
        else None,
    }
    return json.dumps(experiment, sort_keys=True, default=str)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _combine(values: list) -> tuple[Any, Any]:
    """(mean tree, std tree) of equally shaped JSON values; (None, None) where they differ."""
    first = values[0]
    if all(_is_number(v) for v in values):
        clean = [float(v) for v in values]
        if any(math.isnan(v) for v in clean):
            return float("nan"), float("nan")
        return statistics.fmean(clean), statistics.stdev(clean) if len(clean) > 1 else 0.0
    if isinstance(first, dict) and all(isinstance(v, dict) for v in values):
        if "skipped" in first or any("skipped" in v for v in values):
            return (
                ({"skipped": first["skipped"]}, None)
                if all(v == first for v in values)
                else ({"skipped": "skipped for some of the checkpoints"}, None)
            )
        means, stds = {}, {}
        for key in first:
            if key == "n" and all(v.get("n") == first["n"] for v in values):
                means["n"] = first["n"]
                continue
            if not all(key in v for v in values):
                continue
            mean, std = _combine([v[key] for v in values])
            if mean is not None:
                means[key] = mean
            if std is not None:
                stds[key] = std
        return means, stds or None
    if isinstance(first, list) and all(
        isinstance(v, list) and len(v) == len(first) for v in values
    ):
        pairs = [_combine([v[i] for v in values]) for i in range(len(first))]
        if all(m is not None for m, _ in pairs):
            stds = [s for _, s in pairs]
            return [m for m, _ in pairs], stds if all(s is not None for s in stds) else None
        return None, None
    if all(v == first for v in values):
        return first, None
    return None, None


def aggregate_seeds(
    results: dict[str, Entry],
    experiments: dict[str, str] | None = None,
    seeds: dict[str, int] | None = None,
    own_sets: dict[str, str] | None = None,
) -> dict[str, Entry]:
    """For each experiment with several checkpoints (``experiments``: result name ->
    ``experiment_key``; without it, one experiment per model name): one seed-mean entry
    with the mean of every number, the deviations, the grouped result names (in the order
    of their ``seeds``) and their files. A seed at chance on its own test set (``own_sets``:
    result name -> the column of the set it was trained on; ``headline.at_chance``) while
    another seed learned there (``headline.LEARNED`` times chance) is a failed run: listed
    in the entry's ``failed``, left out of the mean. It is named after the model, or
    "<first name> (mean)" when that name is taken."""
    from capsnet.evaluation.headline import LEARNED, at_chance, cell_value

    groups: dict[tuple[str, str], list[str]] = {}
    for name, entry in results.items():
        if entry.checkpoint is not None:
            key = (entry.model, (experiments or {}).get(name, ""))
            groups.setdefault(key, []).append(name)
    out: dict[str, Entry] = {}
    for (model, _), names in groups.items():
        if len(names) < 2:
            continue
        names = sorted(names, key=lambda n: (seeds or {}).get(n, 0))
        own = {n: (own_sets or {}).get(n, "") for n in names}
        learned = any(
            cell_value(results[n], own[n]) is not None
            and not at_chance(results[n], own[n], LEARNED)
            for n in names
        )
        failed = tuple(n for n in names if learned and at_chance(results[n], own[n]))
        first, names = names[0], [n for n in names if n not in failed]
        entries = [results[n] for n in names]
        key, i = model, 1
        while key in results or key in out:  # a checkpoint name, or another experiment's mean
            key, i = (f"{first} (mean)" if i == 1 else f"{first} (mean {i})"), i + 1
        means, deviations = _mean_scores([e.scores for e in entries])
        out[key] = Entry(
            key, model, names=tuple(names), checkpoints=tuple(e.checkpoint for e in entries),
            seeds=len(entries), scores=means, deviations=deviations, failed=failed,
        )  # fmt: skip
    return out


def own_set(meta: dict[str, Any]) -> str:
    """The dataset a checkpoint was trained on, as its metadata records it (a run that
    records none trained on the default training set, ``SweepConfig.dataset``)."""
    from capsnet.config import SweepConfig

    for source in (meta.get("metrics") or {}, meta.get("extra") or {}):
        if isinstance(source.get("dataset"), str):
            return source["dataset"]
    return SweepConfig.dataset


def seed_of(meta: dict[str, Any]) -> int:
    """The training seed a checkpoint's metadata records (0 when it records none)."""
    seed = (meta.get("train_config") or {}).get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else 0


def _mean_scores(scores: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the mean of every block the entries share, their deviations)."""
    means, stds = {}, {}
    for key in scores[0]:
        if all(key in s for s in scores):
            mean, std = _combine([s[key] for s in scores])
            if mean is not None:
                means[key] = mean
            if std is not None:
                stds[key] = std
    return means, stds
