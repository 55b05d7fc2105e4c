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

Modules by job: request (the settings of one evaluation), datasets (test sets, model fit),
checkpoints (evaluating), seeds (aggregating), comparison (its section), figures (drawn
while each model is loaded), outputs (metrics.json, rotation.csv, the summary table),
viewpoints (the smallNORB novel-viewpoint section), stage (the DVC stage).
"""

from capsnet.eval.checkpoints import checkpoint_names, evaluate_checkpoints, evaluate_model
from capsnet.eval.datasets import TestSets, model_fit
from capsnet.eval.figures import FigureDrawer
from capsnet.eval.outputs import metrics_json, rotation_csv, summary_lines, write_outputs
from capsnet.eval.request import EvalRequest
from capsnet.eval.seeds import aggregate_seeds
from capsnet.eval.stage import run_stage, stage_checkpoints
from capsnet.eval.viewpoints import VIEWPOINTS_KEY, evaluate_viewpoints, viewpoint_lines

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
