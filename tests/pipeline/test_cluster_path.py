"""The cluster path: the device column of results.csv."""

from __future__ import annotations

from types import SimpleNamespace

from capsnet.config import SweepConfig
from pipeline import results


def _result(trial_id: str, device: str, epoch: int = 2):
    metrics = {
        "trial_id": trial_id,
        "node": "node-1",
        "device": device,
        "epoch": epoch,
        "val_accuracy": 0.5,
        "val_rotated_accuracy": 0.25,
        "time_total_s": 3.0,
    }
    config = {"model": "capsnet-small", "routing_iterations": 1, "augment": "none"}
    return SimpleNamespace(
        metrics=metrics, metrics_dataframe=None, error=None, config=config, path=trial_id
    )


def test_results_csv_names_the_device_each_trial_trained_on(tmp_path):
    sweep = SweepConfig.from_dict({"epochs": 2})
    rows = results.result_rows([_result("t1", "NVIDIA A10G"), _result("t0", "cpu")], sweep)
    assert [(r["trial_id"], r["device"]) for r in rows] == [("t0", "cpu"), ("t1", "NVIDIA A10G")]
    columns = results.result_columns(sweep)
    assert columns[:4] == ["trial_id", "status", "node", "device"]
    results.write_outputs(tmp_path, rows, None, sweep)
    header, *lines = (tmp_path / "results.csv").read_text().splitlines()
    assert header.split(",")[:4] == ["trial_id", "status", "node", "device"]
    assert [line.split(",")[3] for line in lines] == ["cpu", "NVIDIA A10G"]
