"""Checkpoints x datasets -> one result entry per checkpoint (schema in
capsnet/evaluation/__init__.py).

Every checkpoint is loaded (and so validated) before any data is read; each model is then
moved to the device once, scored on every dataset, and handed to the figure drawer while
it is still loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capsnet.evaluation.comparison import comparison_meta, comparison_section
from capsnet.evaluation.datasets import TestSets, check_preprocessing, image_shape, model_fit
from capsnet.evaluation.figures import FigureDrawer
from capsnet.evaluation.probes import run_probes
from capsnet.evaluation.request import EvalRequest
from capsnet.evaluation.results import COMPARISON_KEY, Entry, EvalResults
from capsnet.evaluation.seeds import aggregate_seeds, experiment_key, own_set, seed_of
from capsnet.io.errors import CapsnetError, DataError, DatasetDisabled
from capsnet.training import scoring as evaluate


def checkpoint_names(paths: Sequence[str | Path]) -> list[str]:
    """Readable unique names: the file stem, or its folder for a generic 'model.pt'."""
    paths = [Path(p) for p in paths]
    names = [
        p.parent.name if p.stem in ("model", "checkpoint") and p.parent.name else p.stem
        for p in paths
    ]
    if len(set(names)) != len(names):
        names = [str(p) for p in paths]
    return names


def evaluate_checkpoints(
    paths: Sequence[str | Path],
    request: EvalRequest | None = None,
    names: Sequence[str] | None = None,
    figures: FigureDrawer | None = None,
) -> EvalResults:
    """Evaluate every checkpoint on ``request.params.datasets``; one entry per checkpoint
    (named ``names``, default ``checkpoint_names(paths)``) plus a mean entry per experiment
    with several seeds (``capsnet.evaluation.seeds``) and, when some checkpoint takes part in
    the comparison, the comparison section (``capsnet.evaluation.comparison``). ``figures``
    draws each model's figures while it is loaded."""
    from capsnet.models import checkpoint

    request = request or EvalRequest()
    loaded = [checkpoint.load(path, map_location="cpu") for path in paths]  # fail early
    names = list(names) if names is not None else checkpoint_names(paths)
    compared = [comparison_meta(meta, str(path)) for path, (_, meta) in zip(paths, loaded)]
    if any(compared) and COMPARISON_KEY in names:
        path = paths[names.index(COMPARISON_KEY)]
        raise CapsnetError(f"{path}: the name {COMPARISON_KEY!r} is the comparison section's")
    data = TestSets(request)
    entries: dict[str, Entry] = {}
    for name, path, (model, meta) in zip(names, paths, loaded):
        request.place(model)
        request.say(f"evaluating {name} ({meta['model_name']})")
        with evaluate.remembering_predictions():  # the figures reuse the scores' forward passes
            with checkpoint.scoring(path):
                scores = evaluate_model(model, data, request, (path, meta))
            entry = Entry(name, meta["model_name"], str(path), scores=scores)
            if figures is not None:
                figures.add_model(name, model, entry, data, request)
        entries[name] = entry
        model.cpu()
    metas = {name: meta for name, (_, meta) in zip(entries, loaded)}
    experiments = {name: experiment_key(meta) for name, meta in metas.items()}
    seeds = {name: seed_of(meta) for name, meta in metas.items()}
    own_sets = {name: own_set(meta) for name, meta in metas.items()}
    entries.update(aggregate_seeds(entries, experiments, seeds, own_sets))
    results = EvalResults(entries, comparison_section(entries, metas))
    if figures is not None:
        figures.finish(results)
    return results


def evaluate_model(
    model, data: TestSets, request: EvalRequest, source: tuple[Any, dict] | None = None
) -> dict[str, Any]:
    """{dataset: result} for a loaded model on the device, then {probe: block} for each
    probe the request switches on (``capsnet.evaluation.probes.PROBES``); ``source``:
    (checkpoint path, its metadata), checked against the request's preprocessing."""
    entry: dict[str, Any] = {
        name: _evaluate_one(model, name, data, request, source) for name in request.params.datasets
    }
    entry.update(run_probes(model, data, request))
    return entry


def _evaluate_one(model, name: str, data: TestSets, request: EvalRequest, source) -> dict:
    if image_shape(name) is not None:
        reason = model_fit(model, name)
        if reason is not None:
            return {"skipped": reason}
    try:
        dataset, info = data.get(name, int(model.config.in_channels))
    except DatasetDisabled as exc:
        return {"skipped": str(exc)}
    except DataError as exc:
        raise DataError(f"{name}: {exc}") from None
    reason = model_fit(model, name, dataset)
    if reason is not None:
        return {"skipped": reason, **info}
    if source is not None:
        check_preprocessing(*source, name, request)
    params = request.params
    scored = evaluate.score(
        model, name, dataset, params.batch_size, request.device, angles=params.angles
    )
    return {**info, **scored}
