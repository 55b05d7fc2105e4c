"""Evaluation: checkpoints x datasets -> metrics.json, rotation.csv and figures.

One entry per checkpoint: {"model", "checkpoint", "mnist": {"accuracy", "n"},
"rotated-mnist": {"n", "accuracy": {"<angle>": x}}, "affnist": {"source", "accuracy", "n"},
"multimnist": {"strict_accuracy", "at_least_one", "half_credit", "n"}, "robustness": {...},
"equivariance": {...}}; a dataset that does not fit a model is {"skipped": reason}. Several
checkpoints of one experiment (equal model and training configs but the seed) add an
entry with the mean of every number, the standard deviations under "std" and the grouped
checkpoints under "names". Checkpoints the train stage made for the comparison add the
"comparison" section (capsule model against baselines over seeds). The stage adds a
"viewpoints" section.

Modules by job: results (the dataclasses of metrics.json, built by the writers below and
returned by its reader, and the one serialiser), headline (the rules reading them: a
column's number, which entry fills a table cell),
request (the settings of one evaluation), datasets (test sets, model fit), checkpoints
(evaluating), probes (robustness, equivariance, ...: one table of name -> probe), seeds
(aggregating), comparison (its section), figures (drawn while each model is loaded),
outputs (metrics.json, rotation.csv, summary.json, the summary table), novel_viewpoints
(the smallNORB novel-viewpoint section), stage (the DVC stage).
"""

#: each name -> the module that defines it, imported on first use (PEP 562), so the
#: torch-free modules of this package stay torch-free to import.
_HOMES = {
    "EvalRequest": "capsnet.evaluation.request",
    "FigureDrawer": "capsnet.evaluation.figures",
    "TestSets": "capsnet.evaluation.datasets",
    "VIEWPOINTS_KEY": "capsnet.evaluation.novel_viewpoints",
    "aggregate_seeds": "capsnet.evaluation.seeds",
    "checkpoint_names": "capsnet.evaluation.checkpoints",
    "evaluate_checkpoints": "capsnet.evaluation.checkpoints",
    "evaluate_model": "capsnet.evaluation.checkpoints",
    "evaluate_viewpoints": "capsnet.evaluation.novel_viewpoints",
    "metrics_json": "capsnet.evaluation.results",
    "model_fit": "capsnet.evaluation.datasets",
    "rotation_csv": "capsnet.evaluation.outputs",
    "run_stage": "capsnet.evaluation.stage",
    "stage_checkpoints": "capsnet.evaluation.stage",
    "summary_lines": "capsnet.evaluation.outputs",
    "viewpoint_lines": "capsnet.evaluation.novel_viewpoints",
    "write_outputs": "capsnet.evaluation.outputs",
}


def __getattr__(name: str):
    from capsnet import _moved

    if (error := _moved(f"{__name__}.{name}")) is not None:
        raise error
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "VIEWPOINTS_KEY",
    "EvalRequest",
    "FigureDrawer",
    "TestSets",
    "aggregate_seeds",
    "checkpoint_names",
    "evaluate_checkpoints",
    "evaluate_model",
    "evaluate_viewpoints",
    "metrics_json",
    "model_fit",
    "rotation_csv",
    "run_stage",
    "stage_checkpoints",
    "summary_lines",
    "viewpoint_lines",
    "write_outputs",
]
