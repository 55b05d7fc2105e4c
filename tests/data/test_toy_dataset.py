"""A dataset registered at run time (tests/data/toyset.py and its DatasetSpec) goes through
``capsnet train``, the checkpoint evaluation, the evaluate stage's summary.json and the
published results table with nothing else changed: the declaration is the only switch. Its
settings section (``data.toyset``, one field of DataParams) reaches its loader, the same at
every entry point."""

from __future__ import annotations

import dataclasses
import json

import pytest
import toyset
from click.testing import CliRunner

from capsnet.config import dataset_specs


def _install_section(monkeypatch, name: str, section: type) -> None:
    """What one more field of capsnet.config.data.DataParams does (``name``: ``section``'s
    params.yaml key under ``data``): a DataParams with the field, and a Params with that
    DataParams, wherever they are read by name."""
    from capsnet import config
    from capsnet.config import data as config_data
    from capsnet.data import datasets

    field = dataclasses.field(default_factory=section)
    data_params = dataclasses.make_dataclass(
        "DataParams", [(name, section, field)], bases=(config.DataParams,), frozen=True
    )
    sections = [
        (f.name, data_params if f.name == "data" else f.type,
         dataclasses.field(default_factory=data_params if f.name == "data" else f.type))
        for f in dataclasses.fields(config.Params)
    ]  # fmt: skip
    params = dataclasses.make_dataclass("Params", sections, frozen=True)
    monkeypatch.setattr(config, "Params", params)
    for module in (config, config_data, datasets):
        monkeypatch.setattr(module, "DataParams", data_params)


@pytest.fixture
def toy(monkeypatch):
    _install_section(monkeypatch, *toyset.DATA_FIELD)
    dataset_specs.register(toyset.SPEC)
    yield toyset.SPEC
    dataset_specs.unregister(toyset.SPEC.name)


@pytest.fixture
def seen(monkeypatch):
    """The brightness each toy load was asked for: [(split, data.toyset.brightness)]."""
    calls = []
    real = toyset.load_dataset

    def spy(request, **options):
        calls.append((request.split, getattr(request.settings, "brightness", None)))
        return real(request, **options)

    monkeypatch.setattr(toyset, "load_dataset", spy)
    return calls


def _write_params(path, brightness: int):
    path.write_text(f"data:\n  toyset:\n    brightness: {brightness}\n")
    return path


def test_the_toy_settings_change_what_load_returns(toy, tmp_path):
    from capsnet import config
    from capsnet.data.datasets import load

    params = config.load(_write_params(tmp_path / "params.yaml", 90))
    assert params.data.toyset.brightness == 90
    default = load(toy.name, "test", tmp_path)
    dim = load(toy.name, "test", tmp_path, data=params.data)
    assert int(default.images.max()) == 255 and int(dim.images.max()) == 90
    assert (default.images < 40).equal(dim.images < 40)  # only the bars changed


def test_a_bad_toy_setting_is_a_one_line_error_naming_it(toy, tmp_path, monkeypatch):
    from capsnet.cli import main

    monkeypatch.chdir(tmp_path)
    _write_params(tmp_path / "params.yaml", 7)
    args = ["train", "--model", "lenet5", "--dataset", toy.name, "--epochs", "1", "--out", "r"]
    failed = CliRunner().invoke(main, args)
    assert failed.exit_code != 0
    assert "data.toyset.brightness" in failed.output
    assert len(failed.output.strip().splitlines()) == 1, failed.output


def test_sweep_trials_and_final_training_read_the_toy_settings(toy, tmp_path, seen):
    """A sweep trial and the final training start from ``section_spec`` (params.yaml's
    data section), then load through ``load_split`` and ``load_test``."""
    from types import SimpleNamespace

    from capsnet import config
    from capsnet.training.run import load_split, load_test, section_spec

    params = config.load(_write_params(tmp_path / "params.yaml", 120))
    for section in (params.sweep, params.train):  # a trial, the final training
        spec = section_spec(
            section, SimpleNamespace(dataset=toy.name, channels=1), params, tmp_path
        )
        split = load_split(dataclasses.replace(spec, val_size=6))
        assert int(split.train.tensors[0].max()) == 120
        assert int(load_test(spec).images.max()) == 120
    assert seen and set(seen) == {("train", 120), ("test", 120)}


def test_registering_a_taken_name_is_refused(toy):
    with pytest.raises(Exception, match="toy-bars already registered"):
        dataset_specs.register(toy)


def test_a_registered_toy_dataset_trains_and_is_evaluated(toy, tmp_path, monkeypatch, seen):
    from capsnet import config
    from capsnet.cli import main
    from capsnet.evaluation.stage import run_stage

    monkeypatch.chdir(tmp_path)
    _write_params(tmp_path / "params.yaml", 90)  # what `capsnet train` reads by default
    args = ["train", "--model", "lenet5", "--dataset", toy.name, "--epochs", "1"]
    args += ["--batch-size", "8", "--val-size", "6", "--device", "cpu", "--out", "run"]
    trained = CliRunner().invoke(main, args)
    assert trained.exit_code == 0, trained.output
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["dataset"] == toy.name and metrics[toy.name]["n"] == toyset.SIZES["test"]
    assert set(seen) == {("train", 90), ("test", 90)}
    seen.clear()

    (tmp_path / "models").mkdir()
    (tmp_path / "run" / "model.pt").rename(tmp_path / "models" / "lenet5.pt")
    params = config.load("params.yaml")
    settings = dataclasses.replace(
        params.evaluate, datasets=(toy.name,), viewpoints_dir="", device="cpu",
        robustness=dataclasses.replace(params.evaluate.robustness, enabled=False),
        equivariance=dataclasses.replace(params.evaluate.equivariance, enabled=False),
    )  # fmt: skip
    written = run_stage(dataclasses.replace(params, evaluate=settings), data_root=tmp_path)
    results = json.loads(written["metrics"].read_text())
    assert seen == [("test", 90)]  # the evaluate stage scored what was trained on
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
