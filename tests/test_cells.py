"""The typed reading of eval/metrics.json (capsnet/evaluation/results.py): what the report,
the README table and the W&B eval runs get from an entry and from the viewpoint section, and the
schema errors."""

from __future__ import annotations

import copy
import json

import pytest

from capsnet.evaluation import probes
from capsnet.evaluation.headline import cell_value, main_entries, model_picks, std_value, trained_on
from capsnet.evaluation.results import ViewpointKind, ViewpointModel, parse_results
from capsnet.io.errors import CapsnetError

CAPS = {
    "model": "capsnet-small",
    "checkpoint": "models/capsnet-small.pt",
    "mnist": {"accuracy": 0.97, "n": 1000},
    "rotated-mnist": {"n": 500, "accuracy": {"35": 0.8, "-30": 0.85, "0": 0.97}},
    "affnist": {"skipped": "images are 40x40"},
    "multimnist": {"strict_accuracy": 0.6, "at_least_one": 0.9, "n": 200},
    "smallnorb": {"skipped": "switched off", "source": "smallnorb-synth (stand-in)"},
    "robustness": {"attack": "untargeted L-inf", "fgsm": {"0.1": 0.5}, "bim": {"0.1": 0.3}},
}
MEAN = {
    "model": "capsnet-small",
    "names": ["capsnet-small", "capsnet-small@seed1"],
    "checkpoints": ["models/capsnet-small.pt", "models/capsnet-small@seed1.pt"],
    "seeds": 2,
    "mnist": {"accuracy": 0.96, "n": 1000},
    "std": {"mnist": {"accuracy": 0.01}},
}
VIEWPOINTS = {
    "rule": "target = max",
    "kinds": {
        "azimuth": {
            "models": {
                "capsules": {"model": "em", "epoch": 1, "familiar_error": 0.1,
                             "novel_error": 0.2, "paper_novel_error": 0.135},
                "cnn": {"model": "cnn", "epoch": 2, "familiar_error": 0.11, "novel_error": 0.3},
            },
            "target_familiar_error": 0.11,
            "gap": 0.01,
            "matched": True,
        },
        "elevation": {"skipped": "no checkpoint"},
    },
}  # fmt: skip


def test_entry_reads_each_test_set_through_its_accessors():
    original = copy.deepcopy(CAPS)
    entry = parse_results({"capsnet-small": CAPS}).entries["capsnet-small"]
    assert cell_value(entry, "mnist") == 0.97 and cell_value(entry, "multimnist") == 0.6  # strict
    assert cell_value(entry, "rotated-mnist@35") == 0.8 and cell_value(entry, "affnist") is None
    assert std_value(entry, "mnist") is None and entry.test_size("rotated-mnist@35") == 500
    assert entry.source("smallnorb") == "smallnorb-synth (stand-in)"
    assert entry.rotation() == [(-30.0, 0.85), (0.0, 0.97), (35.0, 0.8)]
    assert probes.attacks(entry) == {"fgsm": {"0.1": 0.5}, "bim": {"0.1": 0.3}}
    assert entry.skipped == {"affnist": "images are 40x40", "smallnorb": "switched off"}
    assert trained_on(entry) is None
    numbers = entry.numbers()
    assert numbers["rotated-mnist/accuracy/-30"] == 0.85 and numbers["multimnist/n"] == 200
    assert not any(k.startswith(("affnist", "smallnorb")) for k in numbers)  # skipped sets
    assert "robustness/attack" not in numbers  # text is not a metric
    canonical = entry.to_dict()
    assert canonical == original
    canonical["mnist"]["accuracy"] = 0.0
    assert cell_value(entry, "mnist") == 0.97  # a copy


def test_seed_means_fill_the_rows_and_picks_are_entries():
    results = parse_results({"capsnet-small": CAPS, "capsnet-small (mean)": MEAN})
    mean = results.entries["capsnet-small (mean)"]
    assert mean.checkpoint is None and mean.seeds == 2 and std_value(mean, "mnist") == 0.01
    assert list(results.checkpoints()) == ["capsnet-small"]
    picks = model_picks(main_entries(results), ["mnist", "multimnist"])
    assert picks == {
        "capsnet-small": {"mnist": mean, "multimnist": results.entries["capsnet-small"]}
    }


def test_viewpoints_are_typed_and_skips_keep_their_reason():
    section = parse_results({"c": CAPS, "viewpoints": VIEWPOINTS}).viewpoints
    assert section.rule == "target = max" and section.skipped is None
    azimuth, elevation = section.kinds
    assert azimuth == ViewpointKind(
        "azimuth",
        models=(
            ViewpointModel("capsules", "em", 1, 0.1, 0.2, 0.135),
            ViewpointModel("cnn", "cnn", 2, 0.11, 0.3, None),
        ),
        target_familiar_error=0.11,
        gap=0.01,
        matched=True,
    )
    assert elevation == ViewpointKind("elevation", skipped="no checkpoint")
    off = parse_results({"c": CAPS, "viewpoints": {"skipped": "smallnorb is off"}}).viewpoints
    assert off.skipped == "smallnorb is off" and off.kinds == () and off.rule is None
    assert parse_results({"c": CAPS}).viewpoints is None


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"kinds": []}, "m.json: viewpoints/kinds: a mapping expected"),
        ({"kinds": {"azimuth": 3}}, "m.json: viewpoints/azimuth: a mapping expected"),
        ({"rule": 1, "kinds": {}}, "m.json: viewpoints/rule: str expected"),
        (
            {"kinds": {"azimuth": {"models": {"cnn": {"epoch": "two"}}}}},
            "m.json: viewpoints/azimuth/models/cnn/epoch: a number expected",
        ),
        (
            {"kinds": {"azimuth": {"gap": "big", "models": {}}}},
            "m.json: viewpoints/azimuth/gap: a number expected",
        ),
    ],
)
def test_malformed_viewpoints_are_refused_with_where(section, expected):
    with pytest.raises(CapsnetError) as info:
        parse_results({"c": CAPS, "viewpoints": section}, "m.json")
    assert str(info.value) == expected


def test_comparison_is_typed_for_the_sentences_and_tables():
    section = {
        "angles": [0, 35],
        "arms": {
            "equal_time": {
                "reference": "capsnet-small",
                "time_budget_seconds": 60.0,
                "tolerance": 0.25,
                "models": {
                    "lenet5": {"model": "lenet5", "names": ["lenet5", "lenet5@seed1"],
                               "epochs": 30.5, "train_seconds": 59.0, "time_ratio": 0.98,
                               "within_tolerance": True, "accuracy": {"0": 0.97, "35": "x"},
                               "std": {"0": 0.01}},
                    "broken": [1, 2],
                },
            },
            "odd": "not an arm",
        },
    }  # fmt: skip
    results = parse_results({"c": CAPS, "comparison": section})
    comparison = results.comparison
    assert list(comparison.arms) == ["equal_time"]  # a part that is no mapping is left out
    arm = comparison.arms["equal_time"]
    assert (arm.reference, arm.time_budget_seconds, arm.tolerance) == ("capsnet-small", 60.0, 0.25)
    (group,) = arm.groups.values()
    assert group.label == "lenet5" and group.seeds == 2  # counted from the names
    assert (group.epochs, group.train_seconds, group.time_ratio) == (30.5, 59.0, 0.98)
    assert group.within_tolerance is True and group.train_seconds_std is None
    assert group.accuracy == {"0": 0.97, "35": None} and group.std == {"0": 0.01}
    written = comparison.to_dict()  # the typed section: the malformed parts are not kept
    assert written["angles"] == [0, 35] and list(written["arms"]) == ["equal_time"]
    assert list(written["arms"]["equal_time"]["models"]) == ["lenet5"]
    assert written["arms"]["equal_time"]["models"]["lenet5"]["accuracy"] == {"0": 0.97, "35": None}


@pytest.mark.parametrize(
    "committed",
    [
        "eval/metrics.json",
        "docs/results/cpu-profile/metrics.json",
        "docs/results/smallnorb-profile/metrics.json",
    ],
)
def test_the_committed_metrics_json_round_trips_byte_for_byte(repo_root, committed):
    """One contract: each committed file the evaluate stage wrote, read into the
    dataclasses (which keep no copy of what was read) and written back by the same
    serialiser, is the same bytes."""
    import dataclasses

    from capsnet.evaluation import results as metrics
    from capsnet.evaluation.outputs import rotation_csv, summary_metrics

    path = repo_root / committed
    text = path.read_text()
    results = metrics.load_results(path)
    kept = {f.name for cls in (metrics.EvalResults, metrics.Entry, metrics.Comparison,
                               metrics.Viewpoints) for f in dataclasses.fields(cls)}  # fmt: skip
    assert not any(name.startswith("_") for name in kept)  # no raw dict behind the types
    assert results.to_json() == text
    assert metrics.metrics_json(results.to_dict()) == text
    assert metrics.parse_results(json.loads(text)) == results
    outputs = {"summary.json": json.dumps(summary_metrics(results), indent=2) + "\n",
               "rotation.csv": rotation_csv(results)}  # fmt: skip
    for name, written in outputs.items():  # the stage's other files, from the same types
        if (path.parent / name).is_file():
            assert written == (path.parent / name).read_text(), name
