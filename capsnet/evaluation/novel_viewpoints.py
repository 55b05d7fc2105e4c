"""metrics.json's "viewpoints" section: the checkpoints ``capsnet viewpoints`` selected,
scored on the familiar and novel smallNORB test subsets, and its summary lines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from capsnet.config import ROLE_CAPSULES
from capsnet.evaluation.datasets import TestSets, check_preprocessing, model_fit
from capsnet.evaluation.request import EvalRequest
from capsnet.evaluation.results import (
    VIEWPOINTS_KEY,  # noqa: F401  (the section's name)
    ViewpointKind,
    ViewpointModel,
    Viewpoints,
)
from capsnet.io.errors import CheckpointError, DataError
from capsnet.training import scoring as evaluate


def evaluate_viewpoints(
    viewpoints_dir: str | Path, request: EvalRequest, figures=None
) -> Viewpoints:
    """The section from ``capsnet viewpoints``'s output directory.

    The match is decided once, by the stage, on its test images: each kind's target,
    gap and verdict are the stage's selection. Both selected checkpoints are scored again
    on the same images (the stage's ``test_limit`` first familiar and novel test images,
    not ``params.limit``), so the errors shown are the ones the verdict was made on; a
    re-score that differs from the stage's numbers is recorded (``rescored_gap``) and
    said in the log. The section is skipped, with the reason, when the experiment did not run
    (missing or switched-off directory), and so is a kind whose test data is unavailable.
    ``figures`` (a ``FigureDrawer``) draws the per-epoch familiar and novel error curves.
    """
    from capsnet.evaluation import viewpoint_matching as viewpoints

    payload, reason = viewpoints.read_results(viewpoints_dir)
    if payload is None:
        request.say(f"viewpoints: skipped: {reason}")
        return Viewpoints(skipped=reason)
    if figures is not None:
        figures.viewpoints(payload)
    data = TestSets(_stage_limit(request, payload))
    kinds: list[ViewpointKind] = []
    for kind, entry in payload["kinds"].items():
        request.say(f"viewpoints: evaluating {kind}")
        try:
            kinds.append(_kind(Path(viewpoints_dir), kind, entry, data, request))
        except DataError as exc:
            kinds.append(ViewpointKind(kind, skipped=str(exc)))
    rule = payload.get("rule", viewpoints.RULE)  # the rule the stage matched by
    return Viewpoints(rule, None, tuple(kinds), viewpoints.PAPER_NOTE)


def _stage_limit(request: EvalRequest, payload: dict) -> EvalRequest:
    """``request`` scoring the first ``viewpoints.test_limit`` test images the stage
    measured on (all when it measured on all)."""
    import dataclasses

    limit = (payload.get("settings") or {}).get("test_limit")
    return dataclasses.replace(request, params=dataclasses.replace(request.params, limit=limit))


def _kind(
    folder: Path, kind: str, entry: dict, data: TestSets, request: EvalRequest
) -> ViewpointKind:
    """One kind (azimuth, elevation): the stage's verdict, both selected models scored."""
    from capsnet.evaluation import viewpoint_matching as viewpoints

    selection = entry["selection"]
    which = entry.get("kind", kind)  # azimuth or elevation (``kind`` may name a seed)
    paper = entry.get("paper_novel_error") or viewpoints.PAPER_NOVEL_ERROR.get(which, {})
    models = tuple(
        _scored(folder / info["checkpoint"], role, which, paper.get(role), data, request)
        for role, info in entry["models"].items()
    )
    familiar = [m.familiar_error for m in models]
    rescored_gap = max(familiar) - min(familiar)
    chosen = [selection["models"][m.role]["familiar_error"] for m in models]
    if any(abs(a - b) > 1e-9 for a, b in zip(familiar, chosen, strict=True)):
        request.say(
            f"viewpoints: {kind}: re-scored familiar errors {familiar} differ from the stage's "
            f"{chosen} on the same images; the verdict stays the stage's"
        )
    return ViewpointKind(
        kind,
        models=models,
        target_familiar_error=selection["target_familiar_error"],
        gap=float(selection["gap"]),
        matched=bool(selection["matched"]),
        tolerance=float(selection.get("tolerance", 0.0)),
        selection=selection,  # the verdict, made at training time on the same images
        paper_novel_error=paper,
        seed=entry.get("seed"),
        rescored_gap=rescored_gap,
    )


def _scored(
    path: Path, role: str, kind: str, paper: float | None, data: TestSets, request: EvalRequest
) -> ViewpointModel:
    """A selected checkpoint's error on the familiar and the novel subset of ``kind``."""
    from capsnet import models
    from capsnet.models import checkpoint

    model, meta = checkpoint.load(path, map_location="cpu")
    wrong = models.role_problem(meta["model_name"], role, ROLE_CAPSULES[role])
    if wrong is not None:
        raise CheckpointError(f"{path}: {wrong}")
    request.place(model)
    scores: dict[str, Any] = {}
    try:
        for which in ("familiar", "novel"):
            name = f"smallnorb-{kind}-{which}"
            dataset, _ = data.get(name, int(model.config.in_channels))
            unfit = model_fit(model, name, dataset)
            if unfit is not None:
                raise DataError(f"{path}: {unfit}")
            check_preprocessing(path, meta, name, request)
            with checkpoint.scoring(path):
                scored = evaluate.accuracy(
                    model, dataset, request.params.batch_size, request.device
                )
            scores[f"{which}_error"] = 1.0 - scored["accuracy"]
            scores[f"{which}_n"] = scored["n"]
    finally:
        model.cpu()
    return ViewpointModel(
        role,
        meta["model_name"],
        meta.get("metrics", {}).get("epoch"),
        scores["familiar_error"],
        scores["novel_error"],
        paper,
        checkpoint=str(path),
        familiar_n=scores["familiar_n"],
        novel_n=scores["novel_n"],
    )


def over_seeds(section: Viewpoints | None) -> dict[str, dict[str, Any]]:
    """Per kind (azimuth, elevation) with more than one scored seed: {"seeds": n, "matched":
    how many seeds matched, "models": {role: {"model", "familiar_error": (mean, std),
    "novel_error": (mean, std)}}} (sample std over the seeds); {} for one seed each."""
    import statistics

    groups: dict[str, list] = {}
    for entry in () if section is None or section.skipped else section.kinds:
        if entry.skipped is None:
            groups.setdefault(entry.viewpoints, []).append(entry)
    summary: dict[str, dict[str, Any]] = {}
    for kind, entries in groups.items():
        if len(entries) < 2:
            continue
        models: dict[str, dict[str, Any]] = {}
        for model in entries[0].models:
            same = [m for e in entries for m in e.models if m.role == model.role]
            models[model.role] = {"model": model.model}
            for key in ("familiar_error", "novel_error"):
                values = [getattr(m, key) for m in same]
                models[model.role][key] = (statistics.fmean(values), statistics.stdev(values))
        matched = sum(e.matched for e in entries)
        summary[kind] = {"seeds": len(entries), "matched": matched, "models": models}
    return summary


def viewpoint_lines(section: Viewpoints | None) -> list[str]:
    """Summary lines for the "viewpoints" section (none when absent)."""
    if section is None:
        return []
    if section.skipped is not None:
        return ["", f"novel viewpoints: skipped ({section.skipped})"]
    lines = ["", "novel viewpoints (smallNORB), at matched familiar error; paper in brackets:"]
    rows = [["kind", "role", "model", "epoch", "familiar error", "novel error", "gap"]]
    for entry in section.kinds:
        if entry.skipped is not None:
            lines.append(f"  {entry.kind}: skipped ({entry.skipped})")
            continue
        for m in entry.models:
            paper = m.paper_novel_error
            novel = f"{m.novel_error:.4f}" + (f" ({paper:.3f})" if paper is not None else "")
            match = f"{entry.gap:.4f} ({'matched' if entry.matched else 'NOT matched'})"
            familiar = f"{m.familiar_error:.4f}"
            rows.append([entry.kind, m.role, m.model, str(m.epoch), familiar, novel, match])
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines + ["  " + line for line in seeds_lines(section, lambda m, s: f"{m:.4f} ± {s:.4f}")]


def seeds_lines(section: Viewpoints, show: Callable[[float, float], str]) -> list[str]:
    """A sentence per kind with more than one seed (``over_seeds``): each model's familiar
    and novel error as ``show(mean, std)`` and how many seeds matched."""
    lines = []
    for kind, summary in over_seeds(section).items():
        cells = [
            f"{m['model']} {show(*m['familiar_error'])} familiar, {show(*m['novel_error'])} novel"
            for m in summary["models"].values()
        ]
        lines.append(
            f"{kind.capitalize()}, over {summary['seeds']} seeds (mean ± std of test error): "
            + "; ".join(cells)
            + f"; familiar errors matched in {summary['matched']} of {summary['seeds']} seeds."
        )
    return lines
