"""A dataset registered at run time (tests/data/toyset.py and its DatasetSpec) goes through
``capsnet train``, the checkpoint evaluation, the evaluate stage's summary.json and the
published results table with nothing else changed: the declaration is the only switch."""

from __future__ import annotations

import dataclasses
import json

import pytest
import toyset
from click.testing import CliRunner

from capsnet.config import dataset_specs


@pytest.fixture
def toy():
    dataset_specs.register(toyset.SPEC)
    yield toyset.SPEC
    dataset_specs.unregister(toyset.SPEC.name)


def test_registering_a_taken_name_is_refused(toy):
    with pytest.raises(Exception, match="toy-bars already registered"):
        dataset_specs.register(toy)


def test_a_registered_toy_dataset_trains_and_is_evaluated(toy, tmp_path, monkeypatch):
    from capsnet.cli import main
    from capsnet.config import Params
    from capsnet.evaluation.stage import run_stage

    monkeypatch.chdir(tmp_path)
    args = ["train", "--model", "lenet5", "--dataset", toy.name, "--epochs", "1"]
    args += ["--batch-size", "8", "--val-size", "6", "--device", "cpu", "--out", "run"]
    trained = CliRunner().invoke(main, args)
    assert trained.exit_code == 0, trained.output
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["dataset"] == toy.name and metrics[toy.name]["n"] == toyset.SIZES["test"]

    (tmp_path / "models").mkdir()
    (tmp_path / "run" / "model.pt").rename(tmp_path / "models" / "lenet5.pt")
    params = Params()
    settings = dataclasses.replace(
        params.evaluate, datasets=(toy.name,), viewpoints_dir="", device="cpu",
        robustness=dataclasses.replace(params.evaluate.robustness, enabled=False),
        equivariance=dataclasses.replace(params.evaluate.equivariance, enabled=False),
    )  # fmt: skip
    written = run_stage(dataclasses.replace(params, evaluate=settings), data_root=tmp_path)
    results = json.loads(written["metrics"].read_text())
    scored = results["lenet5"][toy.name]
    assert scored["n"] == toyset.SIZES["test"]
    assert scored["accuracy"] == pytest.approx(metrics[toy.name]["accuracy"])
    summary = json.loads(written["summary"].read_text())
    assert summary["lenet5"]["toy"] == pytest.approx(scored["accuracy"], abs=1e-6)

    from pipeline.publish.readme import results_table

    header, _, row = results_table(results).splitlines()[:3]
    assert header == "| model | toy bars |"
    assert row.startswith(f"| lenet5 | {100 * scored['accuracy']:.2f}%")
    assert toy.name not in dataset_specs.REGISTRY or dataset_specs.get(toy.name) is toy
