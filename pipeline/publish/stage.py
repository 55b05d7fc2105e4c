"""The publish stage: eval/report.html, eval/results.md (the results table the README
copies) and eval/published.json, one W&B eval run per evaluated checkpoint (job_type
"eval"), one "comparison" run with the seeds' comparison as a table, and a W&B Report
when online.

Publishing is one unit: metrics.json is read through the typed loader
(``capsnet.evaluation.results.load_results``, which refuses an empty or malformed result), the
README's markers and every target's permissions are checked, and every text is rendered
before anything is written; the W&B runs are logged next, and the files last, together
(``OutputSet``). W&B is offline unless an API key is configured
(pipeline.tracking.resolve_mode); nothing here touches the network in offline mode.
``capsnet publish`` (pipeline/publish/cli.py) is the stage's command.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from capsnet.evaluation.headline import cell_value
from capsnet.evaluation.results import (
    COMPARISON_KEY,
    Comparison,
    EvalResults,
    parse_results,
)
from capsnet.io.files import check_input, refuse_read_only
from capsnet.io.outputset import OutputSet
from pipeline import provenance, tracking
from pipeline.publish import comparison as comparison_text
from pipeline.publish import readme, report
from pipeline.publish.cells import publishable

REPORT_TITLE = "capsnet-pipeline: do capsules generalise to new viewpoints?"
#: Columns of the comparison table the publish stage logs: one row per arm, model and angle.
COMPARISON_COLUMNS = ("arm", "model", "seeds", "angle", "mean", "std")


def figures_for(name: str, fig_dir: Path) -> list[Path]:
    """The figures drawn for checkpoint ``name`` alone, matched by its exact figure stems
    (``capsnet.evaluation.figures.model_figure_stems``)."""
    from capsnet.evaluation.figures import model_figure_stems

    stems = model_figure_stems(name)
    return [p for p in report.figure_files(fig_dir) if p.stem in stems]


def shared_figures(fig_dir: Path) -> list[Path]:
    """The figures drawn across models (rotation, equivariance, ...): the comparison run's."""
    from capsnet.evaluation.figures import SHARED_FIGURES

    return [p for p in report.figure_files(fig_dir) if p.stem in SHARED_FIGURES]


def _images(paths: list[Path]) -> dict[str, Any]:
    import wandb

    return {f"figures/{p.stem}": wandb.Image(str(p), caption=report.caption(p)) for p in paths}


def _media(name: str, points: list[tuple[float, float]], fig_dir: Path) -> dict[str, Any]:
    """The rotation curve (a table and its line plot) and the figures of entry ``name``."""
    import wandb

    media: dict[str, Any] = {}
    if points:
        table = wandb.Table(columns=["angle", "accuracy"], data=[list(p) for p in points])
        media["rotation_curve"] = table
        media["rotation_plot"] = wandb.plot.line(
            table, "angle", "accuracy", title=f"{name}: accuracy versus rotation"
        )
    return media | _images(figures_for(name, fig_dir))


def publish_runs(
    results: EvalResults | dict,
    fig_dir: str | os.PathLike,
    *,
    project: str,
    group: str,
    mode: str,
    wandb_dir: str | os.PathLike,
    experiments: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Log one eval run per checkpoint entry, and one "comparison" run with the comparison
    table when metrics.json has one; returns [{name, run_id, mode, url}]. An eval run's
    group is its entry's experiment (``experiments``, default ``group``: the sweep that
    trained it, ``checkpoint_experiments``), the comparison run's ``group``. A run's id
    follows from the project, the experiment's group, the entry and a hash of its results,
    so publishing the same results again reuses the same ids."""
    if mode == "disabled":
        return []
    results = parse_results(results)
    fig_dir = Path(fig_dir)
    published = []
    try:
        for name, entry in results.checkpoints().items():
            run = tracking.start_run(
                project,
                (experiments or {}).get(name, group),
                f"eval-{name}",
                mode,
                wandb_dir,
                {"model": entry.model, "checkpoint": entry.checkpoint, "entry": name},
                job_type="eval",
                content=provenance.content_hash(entry.to_dict()),
            )
            metrics = entry.numbers()
            points = entry.rotation()
            run.log({**metrics, **_media(name, points, fig_dir)})
            for angle, accuracy in points:  # one row per angle: a line plot against "angle"
                run.log({"angle": angle, "rotated_accuracy": accuracy})
            run.summary.update(metrics)
            run_id, url = run.id, (run.url if mode == "online" else None)
            run.finish()  # before the next init, which would otherwise return this run
            published.append({"name": name, "run_id": run_id, "mode": mode, "url": url})
        shared = shared_figures(fig_dir)
        if shared or comparison_text.long_rows(results.comparison):
            published.append(
                _comparison_run(results.comparison, shared, project, group, mode, wandb_dir)
            )
    finally:
        tracking.finish_all([])  # waits until W&B's service has written every run
    return published


def checkpoint_experiments(results: EvalResults, params) -> dict[str, str]:
    """{checkpoint entry: the W&B experiment of its eval run}: ``publish.experiment`` for
    all when set; otherwise the sweep whose final training wrote the checkpoint (a train
    section's ``out_dir`` holding it: that sweep section's ``name``), so a checkpoint's eval
    run sits beside its sweep and train runs; ``sweep.name`` for any other."""
    from pipeline.sweep.sections import SWEEP_SECTIONS, TRAIN_SECTIONS

    fixed = params.publish.experiment
    owners = {
        os.path.normpath(getattr(params, train).out_dir): getattr(params, sweep).name
        for sweep, train in zip(SWEEP_SECTIONS, TRAIN_SECTIONS, strict=True)
    }
    return {
        name: fixed
        or owners.get(os.path.normpath(os.path.dirname(entry.checkpoint)), params.sweep.name)
        for name, entry in results.checkpoints().items()
    }


def _comparison_run(
    comparison: Comparison | None,
    shared: list[Path],
    project: str,
    group: str,
    mode: str,
    wandb_dir,
) -> dict:
    """One run (job_type "comparison") holding what spans models: the comparison as a
    table of COMPARISON_COLUMNS with its sentences in the summary, and the ``shared``
    figures (rotation, equivariance, reconstructions, viewpoints)."""
    import wandb

    run = tracking.start_run(
        project,
        group,
        "comparison",
        mode,
        wandb_dir,
        {"arms": list(comparison_text.arms(comparison))},
        job_type="comparison",
        content=provenance.content_hash(
            {
                "comparison": comparison.to_dict() if comparison is not None else None,
                "figures": [p.name for p in shared],
            }
        ),
    )
    rows = comparison_text.long_rows(comparison)
    logged = _images(shared)
    if rows:
        logged["comparison"] = wandb.Table(columns=list(COMPARISON_COLUMNS), data=rows)
        run.summary["comparison_text"] = " ".join(comparison_text.sentences(comparison))
    run.log(logged)
    run_id, url = run.id, (run.url if mode == "online" else None)
    run.finish()
    return {"name": COMPARISON_KEY, "run_id": run_id, "mode": mode, "url": url}


def _markdown_sweep(rows: list[dict[str, str]], limit: int = 20) -> str:
    if not rows:
        return "No sweep results."
    columns = report.sweep_columns(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r.get(c) or "" for c in columns) + " |" for r in rows[:limit]]
    return "\n".join(lines)


def report_filters(runs: list[dict[str, Any]], sweep_groups: dict[str, str]) -> dict[str, str]:
    """The W&B Report's run filters (wandb_workspaces expressions): the eval and comparison
    runs this publish logged, by id, and each sweep's trials, by its group
    ({results.csv: group}); never the whole project."""
    ids = ", ".join(repr(r["run_id"]) for r in runs if r.get("run_id"))
    filters = {"eval runs": f"ID in [{ids}]"}
    for source, sweep_group in sweep_groups.items():
        filters[f"sweep {source}"] = f"Group = {sweep_group!r} and JobType = 'sweep'"
    return filters


def create_wandb_report(
    results: EvalResults,
    *,
    project: str,
    group: str,
    runs: list[dict[str, Any]],
    sweeps: dict[str, list[dict[str, str]]],
    sweep_groups: dict[str, str],
    entity: str | None = None,
) -> str:
    """A W&B Report (wandb-workspaces) of the experiment just published: the result table,
    the comparison, the rotation curve of this publish's eval runs, the confusion matrices
    per test set, the novel viewpoints and each sweep; returns its URL. Online only."""
    import wandb
    import wandb_workspaces.reports.v2 as wr

    from capsnet.config.dataset_specs import CONFUSION_SETS

    entity = entity or wandb.Api().default_entity
    filters = report_filters(runs, sweep_groups)

    def runset(name: str) -> Any:
        return wr.Runset(entity=entity, project=project, name=name, filters=filters[name])

    eval_runs = runset("eval runs")
    doc = wr.Report(
        project=project,
        entity=entity,
        title=REPORT_TITLE,
        description=f"Evaluation of experiment {group}.",
    )
    blocks = [
        wr.H1(REPORT_TITLE),
        wr.P("Test accuracy of every final model beside the papers' numbers."),
        wr.MarkdownBlock(readme.results_table(results)),
    ]
    words = comparison_text.markdown(results.comparison)
    if words:
        blocks += [wr.H2("Comparison on rotated MNIST"), wr.MarkdownBlock(words)]
    blocks += [
        wr.H2("Accuracy versus rotation"),
        wr.PanelGrid(
            runsets=[eval_runs],
            panels=[
                wr.LinePlot(title="accuracy versus rotation", x="angle", y=["rotated_accuracy"]),
                wr.MediaBrowser(title="figures", media_keys=["figures/rotation"]),
            ],
        ),
    ]
    for test_set in CONFUSION_SETS:
        keys = [
            f"figures/confusion-{report.figure_slug(name)}-{report.figure_slug(test_set)}"
            for name, entry in results.checkpoints().items()
            if cell_value(entry, test_set) is not None
        ]
        if keys:
            blocks += [
                wr.H2(f"Confusion matrices on {test_set}"),
                wr.PanelGrid(
                    runsets=[eval_runs], panels=[wr.MediaBrowser(title=test_set, media_keys=keys)]
                ),
            ]
    viewpoints = readme.viewpoints_lines(results.viewpoints)
    if viewpoints:
        blocks += [wr.H2("Novel viewpoints"), wr.MarkdownBlock("\n".join(viewpoints))]
    for source, rows in sweeps.items():
        blocks += [wr.H2(f"Sweep {source}"), wr.MarkdownBlock(_markdown_sweep(rows))]
        if f"sweep {source}" in filters:
            blocks.append(
                wr.PanelGrid(
                    runsets=[runset(f"sweep {source}")],
                    panels=[wr.BarPlot(title="validation accuracy", metrics=["val_accuracy"])],
                )
            )
    doc.blocks = blocks
    doc.save()
    return doc.url


def sweep_groups(paths) -> dict[str, str]:
    """{sweep results.csv: the W&B group of its trials}, from the sweep name its best.json
    (beside it) records; a sweep without one is left out."""
    groups = {}
    for path in paths:
        best = Path(path).with_name("best.json")
        if not os.path.lexists(best):
            continue
        check_input(best)
        try:
            name = json.loads(best.read_text()).get("sweep")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(name, str) and name:
            groups[str(path)] = tracking.group_name(name, "sweep")
    return groups


def output_paths(settings) -> dict[str, Path]:
    """The publish stage's files, all beside ``publish.html``."""
    html = Path(settings.html)
    return {
        "html": html,
        "table": html.with_name("results.md"),
        "manifest": html.with_name("published.json"),
    }


def publish(params, metrics_path, fig_dir, log=None, readme_path=None) -> dict[str, Any]:
    """The whole stage for a ``config.Params``: report.html, results.md, the W&B runs, the
    W&B Report when online, ``readme_path``'s results block when given, published.json
    last. Everything is checked and rendered first; the files are written together after
    the runs. Returns what was published (the content of published.json)."""
    settings = params.publish
    say = log or (lambda line: None)
    results = publishable(metrics_path)
    paths = output_paths(settings)
    for name, path in paths.items():
        refuse_read_only(path, f"{path} (publish {name})")
    readme_text = readme.read_document(readme_path) if readme_path is not None else None
    origin = provenance.read_origin(params.train.out_dir)  # the run that trained them
    fig_dir = Path(fig_dir)
    sweeps = report.read_sweeps(report.sweep_paths(settings))
    html = report.render_html(results, fig_dir, sweeps)
    figure = os.path.relpath(fig_dir / "rotation.png", paths["table"].parent)
    table = readme.body(results, Path(figure).as_posix(), origin) + "\n"
    new_readme = None
    if readme_text is not None:
        figure = os.path.relpath(
            (fig_dir / "rotation.png").resolve(), Path(readme_path).resolve().parent
        )
        block = readme.block(results, Path(figure).as_posix(), origin)
        new_readme = readme.replace_block(readme_text, block, readme_path)

    group = settings.experiment or params.sweep.name
    mode = tracking.prepare_environment(settings.mode)
    runs = publish_runs(
        results, fig_dir, project=settings.project, group=group, mode=mode,
        wandb_dir=settings.dir, experiments=checkpoint_experiments(results, params),
    )  # fmt: skip
    where = tracking.workspace_path(settings.dir) / "wandb"
    say(f"logged {len(runs)} W&B eval run(s) ({mode}) under {where}")
    url = None
    if mode == "online" and settings.report:
        url = create_wandb_report(
            results,
            project=settings.project,
            group=group,
            runs=runs,
            sweeps=sweeps,
            sweep_groups=sweep_groups(sweeps),
        )
        say(f"W&B report: {url}")
    summary = {
        "mode": mode,
        "group": group,
        "html": str(paths["html"]),
        "table": str(paths["table"]),
        "runs": runs,
        "report_url": url,
    }
    with OutputSet() as outputs:
        outputs.file(paths["html"], html)
        outputs.file(paths["table"], table)
        if new_readme is not None and new_readme != readme_text:
            outputs.file(readme_path, new_readme)
        outputs.file(paths["manifest"], json.dumps(summary, indent=2) + "\n")
    say(f"wrote {paths['html']} and {paths['table']}")
    if readme_path is not None:
        changed = new_readme != readme_text
        say(f"{readme_path}: results table {'updated' if changed else 'unchanged'}")
    return summary
