"""The DVC ``evaluate`` stage: every checkpoint of ``evaluate.models_dir`` (and of the usable
``extra_models_dirs``) with params.yaml's settings, plus the novel-viewpoint section, written
to ``evaluate.out_dir`` as one unit (``capsnet.io.files.OutputSet``): nothing there changes until
every checkpoint is evaluated and every file written; then figures/ is swapped in whole,
then rotation.csv and summary.json, then metrics.json last."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from capsnet.config import DATA_ROOT
from capsnet.evaluation.checkpoints import checkpoint_names, evaluate_checkpoints
from capsnet.evaluation.figures import FigureDrawer
from capsnet.evaluation.novel_viewpoints import VIEWPOINTS_KEY, evaluate_viewpoints
from capsnet.evaluation.outputs import FIGURE_FILES, FIGURES_DIR, check_targets, write_outputs
from capsnet.evaluation.request import EvalRequest
from capsnet.io.errors import CapsnetError
from capsnet.io.files import read_disabled
from capsnet.io.outputset import OutputSet


def stage_checkpoints(settings, log=None) -> tuple[list[Path], list[str]]:
    """(paths, entry names) of ``models_dir/*.pt`` and of every usable
    ``extra_models_dirs`` entry; an extra directory that is missing or holds DISABLED.txt
    is skipped with the reason logged. Extra names are the file stems, prefixed with their
    directory's name where a stem is already taken."""
    say = log or (lambda line: None)
    paths = sorted(Path(settings.models_dir).glob("*.pt"))
    if not paths:
        raise CapsnetError(f"{settings.models_dir}: no checkpoints (*.pt); run the train stage")
    names = checkpoint_names(paths)
    for extra in settings.extra_models_dirs:
        folder = Path(extra)
        if not folder.is_dir():
            say(f"skipping {folder}: not found (its stage has not run)")
            continue
        reason = read_disabled(folder)
        if reason is not None:
            say(f"skipping {folder}: {reason}")
            continue
        found = sorted(folder.glob("*.pt"))
        if not found:
            say(f"skipping {folder}: no checkpoints (*.pt)")
        for path, name in zip(found, checkpoint_names(found)):
            if name in names or name == VIEWPOINTS_KEY:
                name = f"{folder.name}/{name}"
            paths.append(path)
            names.append(name)
    return paths, names


def run_stage(params, data_root=None, mirror=None, log=None) -> dict[str, Path]:
    """Evaluate as params.yaml's ``evaluate`` section says (``params``: a config.Params);
    returns {output name: path} for metrics.json, rotation.csv and every figure."""
    settings = params.evaluate
    check_targets(settings.out_dir)
    paths, names = stage_checkpoints(settings, log)
    request = EvalRequest(
        settings,
        data=params.data,
        data_root=data_root or DATA_ROOT,
        mirror=mirror,
        log=log,
    )
    out = Path(settings.out_dir)
    with OutputSet() as outputs:
        drawer = FigureDrawer(outputs.directory(out / FIGURES_DIR, FIGURE_FILES))
        results = evaluate_checkpoints(paths, request, names=names, figures=drawer)
        if settings.viewpoints_dir:
            viewpoints = evaluate_viewpoints(settings.viewpoints_dir, request, drawer)
            results = dataclasses.replace(results, viewpoints=viewpoints)
        written = write_outputs(results, out, outputs)
    figures = {name: out / FIGURES_DIR / path.name for name, path in drawer.written.items()}
    return {**written, **figures}
