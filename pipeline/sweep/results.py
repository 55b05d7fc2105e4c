"""The sweep's outputs: results.csv (one row per trial), best.json (the best trial's
config and metrics) and the plot CSVs DVC draws, or marked outputs for a switched-off
dataset. They hold what a rerun on the same machine reproduces: trials by their number in
Tune's generation order, no node ids or wall times (those stay in Tune's state and W&B)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from capsnet.cli.boundary import error_cause
from capsnet.config import SweepConfig, dataset_specs
from capsnet.io.files import DISABLED_MARKER, atomic_write_text, clear_disabled
from capsnet.io.outputset import atomic_directory
from capsnet.io.outputset import write_disabled as write_disabled_outputs
from pipeline.sweep.trainable import applies
from pipeline.tracking import trial_number

#: Metrics each MNIST trial reports after every epoch (both maximised); a smallNORB trial
#: reports val_accuracy only (``SweepConfig.metrics``).
METRICS = ("val_accuracy", "val_rotated_accuracy")


def _first_line(error: BaseException | None) -> str:
    """The trial's error by its cause: exception type and first meaningful line."""
    return "" if error is None else error_cause(error)


def result_rows(results, sweep: SweepConfig) -> list[dict[str, Any]]:
    """One row per trial: its number, status, the device it trained on (``cpu``, ``mps``
    or ``cuda:N <GPU name>``) and its peak GPU memory in MiB (empty off CUDA), the
    searched parameters, final and best metrics and epochs run, in trial order."""
    rows = []
    for result in results:
        metrics = result.metrics or {}
        frame = result.metrics_dataframe
        row: dict[str, Any] = {
            "trial_id": _trial_number(result),
            "status": "ERROR" if result.error else "TERMINATED",
            "device": metrics.get("device", ""),
            "peak_gpu_memory_mb": _peak_memory(frame, metrics),
        }
        for name in sweep.parameters():
            row[name] = result.config.get(name)
        for metric in sweep.metrics():
            row[f"final_{metric}"] = metrics.get(metric)
            values = frame[metric].dropna() if frame is not None and metric in frame else []
            row[f"best_{metric}"] = float(max(values)) if len(values) else None
        row["epochs"] = metrics.get("epoch", 0)
        row["early_stopped"] = bool(not result.error and row["epochs"] < sweep.epochs)
        row["error"] = _first_line(result.error)
        rows.append(row)
    rows.sort(key=lambda r: r["trial_id"])
    return rows


def _trial_number(result) -> str:
    """The trial's number: from Tune's trial id, or its directory for a trial that errored
    before reporting (``pipeline.sweep.stage.trial_dirname``)."""
    tune_id = (result.metrics or {}).get("trial_id")
    return trial_number(tune_id or Path(result.path).name.removeprefix("trial_"))


def _peak_memory(frame, metrics) -> float | None:
    """The largest peak GPU memory a trial reported (None when it trained off CUDA)."""
    name = "peak_gpu_memory_mb"
    values = frame[name].dropna() if frame is not None and name in frame else []
    if len(values):
        return float(max(values))
    return metrics.get(name)


def best_result(results, sweep: SweepConfig, experiment: str = "") -> dict[str, Any] | None:
    """The best trial by ``sweep.metric`` at its last epoch: its config and metrics, and the
    Tune ``experiment`` (the directory under ``storage_path``) it belongs to.

    Ties are broken by a fixed rule, so a rerun or a restored sweep picks the same config:
    the trial that trained more epochs, then the one whose searched settings come first as
    JSON with sorted keys (never the trial's number, which follows Tune's order)."""
    good = [r for r in results if not r.error and r.metrics.get(sweep.metric) is not None]
    if not good:
        return None
    best = min(good, key=lambda r: _rank(r, sweep))
    data = {"dataset": sweep.dataset}
    if dataset_specs.get(sweep.dataset).rotated_validation:
        data["rotation_angle"] = sweep.rotation_angle
    else:
        data["channels"] = sweep.channels
    return {
        "sweep": sweep.name,
        **({"experiment": experiment} if experiment else {}),
        "metric": sweep.metric,
        "mode": "max",
        **data,
        "trial_id": _trial_number(best),
        "config": {name: best.config.get(name) for name in sweep.parameters()},
        "metrics": {
            "epoch": best.metrics.get("epoch"),
            **{metric: best.metrics.get(metric) for metric in sweep.metrics()},
        },
    }


def _rank(result, sweep: SweepConfig) -> tuple[float, int, str]:
    """Sort key of a trial: best metric first, then more epochs, then its settings."""
    settings = {name: result.config.get(name) for name in sweep.parameters()}
    text = json.dumps(settings, sort_keys=True, default=str)
    return (-float(result.metrics[sweep.metric]), -int(result.metrics.get("epoch") or 0), text)


def _csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else row.get(c) for c in columns})
    return buffer.getvalue()


def plot_rows(
    rows: list[dict[str, Any]], key: str, metrics: tuple[str, ...] = METRICS
) -> list[dict[str, Any]]:
    """The best final val accuracy (and its other metrics) per value of ``key``."""
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["status"] != "TERMINATED" or row["final_val_accuracy"] is None:
            continue
        value = str(row[key]) if row[key] is not None else "n/a"
        if not applies(row["model"], key):
            value = "n/a"
        label = f"{row['model']}/{value}" if key == "routing_iterations" else value
        current = groups.get(label)
        if current is None or row["final_val_accuracy"] > current["val_accuracy"]:
            groups[label] = {key: label, **{m: row[f"final_{m}"] for m in metrics}}
    return [groups[k] for k in sorted(groups)]


ABLATION_COLUMNS = ["setting", "parameter", "value", "val_accuracy", "mean_val_accuracy", "trials"]


def ablation_rows(rows: list[dict[str, Any]], sweep: SweepConfig) -> list[dict[str, Any]]:
    """One row per value of each searched parameter ("pose=vector"): the best and the mean
    final val accuracy of the finished trials with that value, and how many there were
    (the ablation of the EM paper's table, the other axes at their best or averaged)."""
    out = []
    for key in sweep.space.searched():
        groups: dict[str, list[float]] = {}
        for row in rows:
            if row["status"] != "TERMINATED" or row["final_val_accuracy"] is None:
                continue
            value = str(row[key]) if applies(row["model"], key) else "n/a"
            groups.setdefault(value, []).append(float(row["final_val_accuracy"]))
        for value in sorted(groups):
            scores = groups[value]
            out.append(
                {
                    "setting": f"{key}={value}",
                    "parameter": key,
                    "value": value,
                    "val_accuracy": max(scores),
                    "mean_val_accuracy": round(sum(scores) / len(scores), 6),
                    "trials": len(scores),
                }
            )
    return out


def result_columns(sweep: SweepConfig) -> list[str]:
    """results.csv's columns: trial number, status, device, peak GPU memory, the recorded
    parameters, final and best metrics, epochs, early stopping and the error."""
    columns = ["trial_id", "status", "device", "peak_gpu_memory_mb", *sweep.parameters()]
    columns += [f"{kind}_{metric}" for kind in ("final", "best") for metric in sweep.metrics()]
    return [*columns, "epochs", "early_stopped", "error"]


def output_paths(out_dir, sweep: SweepConfig) -> dict[str, Path]:
    """results.csv, best.json and the plot data: by_routing and by_augment for MNIST,
    by_routing and ablation (every searched parameter) for smallNORB."""
    out = Path(out_dir)
    plots = (
        ("by_routing", "ablation") if dataset_specs.get(sweep.dataset).sweep_records_all else PLOTS
    )
    return {
        "results": out / "results.csv",
        "best": out / "best.json",
        **{name: out / "plots" / f"{name}.csv" for name in plots},
    }


PLOTS = ("by_routing", "by_augment")


def write_outputs(out_dir, rows, best, sweep: SweepConfig) -> dict[str, str]:
    """<out>/plots/ (swapped in whole), results.csv, then best.json last: the train stage
    reads best.json, so a new one means the set is new. Without a best trial an earlier
    best.json is removed rather than left beside the new results (``output_paths``)."""
    paths = output_paths(out_dir, sweep)
    metrics = sweep.metrics()
    with atomic_directory(Path(out_dir) / "plots", ("*.csv",)) as plots:
        for name, key in (("by_routing", "routing_iterations"), ("by_augment", "augment")):
            if name in paths:
                text = _csv(plot_rows(rows, key, metrics), [key, *metrics])
                atomic_write_text(plots / paths[name].name, text)
        if "ablation" in paths:
            text = _csv(ablation_rows(rows, sweep), ABLATION_COLUMNS)
            atomic_write_text(plots / paths["ablation"].name, text)
    atomic_write_text(paths["results"], _csv(rows, result_columns(sweep)))
    clear_disabled(out_dir)  # left by an earlier run with the data off
    if best is not None:
        atomic_write_text(paths["best"], json.dumps(best, indent=2) + "\n")
    else:
        paths.pop("best").unlink(missing_ok=True)
    return {k: str(v) for k, v in paths.items()}


def write_disabled(out_dir, sweep: SweepConfig, reason: str) -> dict[str, str]:
    """The outputs of a sweep whose dataset is switched off, so DVC finds every declared
    output and nothing looks like a result: <out>/DISABLED.txt saying why, best.json
    ``{"disabled": reason}``, results.csv and the plot files with their header and no
    rows."""
    paths = output_paths(out_dir, sweep)
    metrics = list(sweep.metrics())
    headers = {
        "results": result_columns(sweep),
        "by_routing": ["routing_iterations", *metrics],
        "by_augment": ["augment", *metrics],
        "ablation": ABLATION_COLUMNS,
    }
    empty = {paths[name]: _csv([], columns) for name, columns in headers.items() if name in paths}
    write_disabled_outputs(out_dir, reason, [paths["best"]], empty, replace=False)
    marker = Path(out_dir) / DISABLED_MARKER
    return {"disabled": str(marker), **{k: str(v) for k, v in paths.items()}}
