"""eval/summary.json, the evaluate stage's DVC metrics: tens of numbers under keys that
stay the same whatever the seeds or the datasets, each equal to the cell of the results
table it stands for."""

from __future__ import annotations

import json

import pytest
import yaml
from comparisonhelpers import checkpoint_entry, seeded_results

from capsnet.config.dataset_specs import summary_keys
from capsnet.evaluation.outputs import summary_metrics, write_outputs

KEYS = {*(k.key for k in summary_keys()), "mnist_sd", "rot35_sd", "n_seeds", "train_s"}


def _keys(summary: dict) -> set[str]:
    return {f"{group}.{key}" for group, row in summary.items() for key in _leaves(row)}


def _leaves(row: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in row.items():
        if isinstance(value, dict):
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append(prefix + key)
    return out


def test_summary_holds_the_headline_numbers_of_the_table():
    summary = summary_metrics(seeded_results())
    assert set(summary) == {"lenet5", "capsnet-small", "equal_time"}
    lenet = summary["lenet5"]
    assert set(lenet) == KEYS
    # the seed mean fills the row (0.955 ± 0.007 over lenet5 and lenet5@seed1), not a seed
    assert (lenet["mnist"], lenet["mnist_sd"], lenet["n_seeds"]) == (0.955, 0.007, 2)
    assert lenet["rot35"] == 0.5 and lenet["train_s"] == 20.0
    assert lenet["affnist"] is None and lenet["smallnorb"] is None  # skipped: null, kept
    caps = summary["capsnet-small"]
    assert (caps["mnist"], caps["rot35"], caps["n_seeds"], caps["mnist_sd"]) == (0.97, 0.7, 1, None)
    # the equal-time arm: the baseline's numbers, never the reference model's
    assert summary["equal_time"] == {
        "lenet5": {
            "mnist": 0.975,
            "mnist_sd": 0.007,
            "rot35": 0.6,
            "rot35_sd": 0.0,
            "n_seeds": 2,
            "train_s": 20.0,
        }
    }


def test_summary_keys_do_not_depend_on_seeds_or_datasets():
    three = summary_metrics(seeded_results())
    one = {
        "capsnet-small": checkpoint_entry("capsnet-small", 0.9, 0.6),
        "lenet5": checkpoint_entry("lenet5", 0.8, 0.5),
    }
    one["lenet5"]["mnist"] = {"skipped": "switched off"}
    single = summary_metrics(one)
    assert {k: set(v) for k, v in single.items()} == {"capsnet-small": KEYS, "lenet5": KEYS}
    assert _keys({k: three[k] for k in single}) == _keys(single)
    assert single["lenet5"]["mnist"] is None and single["lenet5"]["rot35"] == 0.5
    numbers = [v for row in single.values() for v in row.values()]
    assert all(v is None or isinstance(v, (int, float)) for v in numbers)  # no text


def test_summary_json_is_written_small_and_numeric(tmp_path):
    write_outputs(seeded_results(), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == summary_metrics(seeded_results())
    assert len(_keys(summary)) < 60
    assert all(isinstance(v, (int, float, type(None))) for v in _flat(summary))


def _flat(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _flat(v)
    else:
        yield value


def test_dvc_reads_the_summary_as_the_evaluate_metrics(repo_root):
    stage = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]["evaluate"]
    assert [next(iter(m)) for m in stage["metrics"]] == ["eval/summary.json"]
    assert "eval/metrics.json" in [next(iter(o)) for o in stage["outs"]]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_numbers_are_null(value):
    results = {"m": checkpoint_entry("m", value, 0.5)}
    assert summary_metrics(results)["m"]["mnist"] is None
