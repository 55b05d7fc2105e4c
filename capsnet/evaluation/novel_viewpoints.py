"""metrics.json's "viewpoints" section: the checkpoints ``capsnet viewpoints`` selected,
scored on the familiar and novel smallNORB test subsets, and its summary lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capsnet.evaluation.datasets import TestSets, check_preprocessing, model_fit
from capsnet.evaluation.headline import VIEWPOINTS_KEY  # noqa: F401  (the section's name)
from capsnet.evaluation.request import EvalRequest
from capsnet.io.errors import DataError
from capsnet.training import scoring as evaluate


def evaluate_viewpoints(viewpoints_dir: str | Path, request: EvalRequest, figures=None) -> dict:
    """The section from ``capsnet viewpoints``'s output directory.

    For each kind, both selected checkpoints are evaluated on the familiar and the novel
    test subsets (``params.limit`` applies). Returns {"rule", "paper", "kinds": {kind:
    {"models": {"capsules"|"cnn": {"model", "checkpoint", "epoch", "familiar_error",
    "familiar_n", "novel_error", "novel_n", "paper_novel_error"}}, "target_familiar_error",
    "gap", "tolerance", "matched", "selection", "paper_novel_error"}}}; {"skipped": reason}
    when the experiment did not run (missing or switched-off directory), and a kind whose
    test data is unavailable is {"skipped": reason}. ``figures`` (a ``FigureDrawer``) draws
    the per-epoch familiar and novel error curves.
    """
    from capsnet.evaluation import viewpoint_matching as viewpoints

    payload, reason = viewpoints.read_results(viewpoints_dir)
    if payload is None:
        request.say(f"viewpoints: skipped: {reason}")
        return {"skipped": reason}
    if figures is not None:
        figures.viewpoints(payload)
    data = TestSets(request)
    kinds: dict[str, dict] = {}
    for kind, entry in payload["kinds"].items():
        request.say(f"viewpoints: evaluating {kind}")
        try:
            kinds[kind] = _kind(Path(viewpoints_dir), kind, entry, data, request)
        except DataError as exc:
            kinds[kind] = {"skipped": str(exc)}
    return {"rule": viewpoints.RULE, "paper": viewpoints.PAPER_NOTE, "kinds": kinds}


def _kind(folder: Path, kind: str, entry: dict, data: TestSets, request: EvalRequest) -> dict:
    """One kind (azimuth, elevation): both selected models scored, and the error gap."""
    from capsnet.evaluation import viewpoint_matching as viewpoints

    selection = entry["selection"]
    paper = entry.get("paper_novel_error") or viewpoints.PAPER_NOVEL_ERROR.get(kind, {})
    models: dict[str, dict] = {}
    for role, info in entry["models"].items():
        models[role] = _scored(folder / info["checkpoint"], kind, data, request)
        models[role]["paper_novel_error"] = paper.get(role)
    familiar = [m["familiar_error"] for m in models.values()]
    gap = max(familiar) - min(familiar)
    tolerance = float(selection.get("tolerance", 0.0))
    return {
        "models": models,
        "target_familiar_error": selection["target_familiar_error"],
        "gap": gap,
        "tolerance": tolerance,
        "matched": bool(gap <= tolerance + 1e-12),
        "selection": selection,  # at training time, on viewpoints.test_limit images
        "paper_novel_error": paper,
    }


def _scored(path: Path, kind: str, data: TestSets, request: EvalRequest) -> dict[str, Any]:
    """A selected checkpoint's error on the familiar and the novel subset of ``kind``."""
    from capsnet.models import checkpoint

    model, meta = checkpoint.load(path, map_location="cpu")
    model.to(request.device)
    result: dict[str, Any] = {
        "model": meta["model_name"],
        "checkpoint": str(path),
        "epoch": meta.get("metrics", {}).get("epoch"),
    }
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
            result[f"{which}_error"] = 1.0 - scored["accuracy"]
            result[f"{which}_n"] = scored["n"]
    finally:
        model.cpu()
    return result


def viewpoint_lines(section: dict | None) -> list[str]:
    """Summary lines for the "viewpoints" section (none when absent)."""
    if not isinstance(section, dict):
        return []
    if "skipped" in section:
        return ["", f"novel viewpoints: skipped ({section['skipped']})"]
    lines = ["", "novel viewpoints (smallNORB), at matched familiar error; paper in brackets:"]
    rows = [["kind", "role", "model", "epoch", "familiar error", "novel error", "gap"]]
    for kind, entry in section.get("kinds", {}).items():
        if "skipped" in entry:
            lines.append(f"  {kind}: skipped ({entry['skipped']})")
            continue
        for role, m in entry["models"].items():
            paper = m.get("paper_novel_error")
            novel = f"{m['novel_error']:.4f}" + (f" ({paper:.3f})" if paper is not None else "")
            match = f"{entry['gap']:.4f} ({'matched' if entry['matched'] else 'NOT matched'})"
            familiar = f"{m['familiar_error']:.4f}"
            rows.append([kind, role, m["model"], str(m["epoch"]), familiar, novel, match])
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines
