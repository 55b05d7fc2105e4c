"""The README results block: built from eval/metrics.json by a pure function, rewritten by
the publish stage, and the committed README kept equal to the committed metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from comparisonhelpers import seeded_results

from capsnet import config
from capsnet.evaluation.metrics import model_picks, parse_results
from capsnet.io.errors import CapsnetError
from pipeline.publish import readme

ROOT = Path(__file__).resolve().parents[1]


def _entry(model: str, checkpoint: str, **sets) -> dict:
    """A metrics.json entry: the given sets scored, every other MNIST set skipped."""
    entry = {"model": model, "checkpoint": checkpoint}
    for name in ("mnist", "rotated-mnist", "expanded-mnist", "affnist", "multimnist"):
        entry[name] = {"skipped": "images do not fit the model"}
    entry.update(sets)
    return entry


def _model(model: str, mnist: float, rot35: float, expanded: float, synth: float, multi: float):
    return {
        model: _entry(
            model,
            f"models/{model}.pt",
            mnist={"accuracy": mnist, "n": 1000},
            **{"rotated-mnist": {"n": 1000, "accuracy": {"0": mnist, "35": rot35}}},
        ),
        f"{model}@expanded-mnist": _entry(
            model,
            f"models/{model}@expanded-mnist.pt",
            affnist={"source": "affnist-synth", "accuracy": synth, "n": 1000},
            **{"expanded-mnist": {"accuracy": expanded, "n": 1000}},
        ),
        f"{model}@multimnist": _entry(
            model,
            f"models/{model}@multimnist.pt",
            multimnist={"strict_accuracy": multi, "at_least_one": 0.9, "n": 1000},
        ),
    }


METRICS = {
    **_model("capsnet-small", 0.97, 0.66, 0.84, 0.51, 0.34),
    **_model("lenet5", 0.955, 0.634, 0.558, 0.3265, 0.0605),
    "viewpoints": {"skipped": "smallnorb is switched off"},
}


def _rows(table: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("|")
    ]


def test_results_table_has_one_row_per_model_and_a_column_per_test_set():
    table = readme.results_table(METRICS)
    rows = _rows(table)
    assert rows[0] == [
        "model",
        "MNIST",
        "rotated MNIST 35°",
        "expanded MNIST",
        "affNIST (synth stand-in)",
        "MultiMNIST (strict)",
    ]
    assert [r[0] for r in rows[2:]] == ["capsnet-small", "lenet5"]
    assert rows[2][1:] == [
        "97.00% (Sabour 2017: 99.75%)",
        "66.00% (DZone article: 84.09%)",
        "84.00% (Sabour 2017: 99.20%)",
        "51.00%",  # the synthetic stand-in is never set beside the paper's affNIST
        "34.00% (Sabour 2017: 94.80%)",
    ]
    assert rows[3][1:] == [
        "95.50% (DZone article: 98.68%)",
        "63.40% (DZone article: 76.05%)",
        "55.80%",  # LeNet5 is never set beside Sabour et al.'s baseline CNN
        "32.65%",
        "6.05%",
    ]
    assert (
        "MNIST and rotated MNIST 35° from `models/<model>.pt`; expanded MNIST and affNIST "
        "(synth stand-in) from `models/<model>@expanded-mnist.pt`; MultiMNIST (strict) from "
        "`models/<model>@multimnist.pt`." in table
    )
    assert "Test images per cell: 1,000." in table
    assert "Novel smallNORB viewpoints: not run: smallnorb is switched off." in table
    assert readme.results_table(METRICS) == table  # pure: same input, same text


def test_a_cell_comes_from_the_checkpoint_trained_for_its_set():
    metrics = _model("capsnet-small", 0.97, 0.66, 0.84, 0.51, 0.34)
    # the MNIST-trained checkpoint also scored on affNIST: the expanded-MNIST one still wins
    metrics["capsnet-small"]["affnist"] = {"source": "affnist", "accuracy": 0.2, "n": 50}
    metrics["capsnet-small@expanded-mnist"]["affnist"]["source"] = "affnist"
    row = _rows(readme.results_table(metrics))[2]
    assert row[4] == "51.00% (Sabour 2017: 79.00%)"  # the real affNIST beside Sabour's number
    assert "Test images per cell: 1,000." in readme.results_table(metrics)


def test_a_seed_mean_fills_the_cell_with_its_deviation():
    one = _entry("lenet5", "models/lenet5-s0.pt", mnist={"accuracy": 0.95, "n": 100})
    two = _entry("lenet5", "models/lenet5-s1.pt", mnist={"accuracy": 0.97, "n": 100})
    mean = {
        "model": "lenet5",
        "checkpoints": [one["checkpoint"], two["checkpoint"]],
        "seeds": 2,
        "mnist": {"accuracy": 0.96, "n": 100},
        "std": {"mnist": {"accuracy": 0.0141}},
    }
    table = readme.results_table({"lenet5-s0": one, "lenet5-s1": two, "lenet5 (mean)": mean})
    rows = _rows(table)
    assert len(rows) == 3 and rows[2] == ["lenet5", "96.00% ± 1.41 (DZone article: 98.68%)"]
    assert "MNIST from the mean of 2 seeds." in table


def test_seed_means_fill_the_rows_and_comparison_runs_never_do():
    metrics = seeded_results()
    metrics["viewpoints"] = {"skipped": "smallnorb is switched off"}
    table = readme.results_table(metrics)
    rows = _rows(table)
    assert rows[0] == ["model", "MNIST", "rotated MNIST 35°"]
    # lenet5's row is its equal-augmentation seeds' mean, never lenet5@equal-time's
    lenet5 = ["95.50% ± 0.70 (DZone article: 98.68%)", "50.00% ± 0.00 (DZone article: 76.05%)"]
    assert rows[2] == ["lenet5", *lenet5]
    capsules = ["97.00% (Sabour 2017: 99.75%)", "70.00% (DZone article: 84.09%)"]
    assert rows[3] == ["capsnet-small", *capsules]
    assert rows[4] == [
        "comparison arm", "model", "seeds", "budgeted s", "train s", "MNIST (0°)", "35°"
    ]  # fmt: skip
    assert rows[7] == [
        "equal augmentation", "lenet5", "3", "–", "20.0 ± 0.5", "95.00% ± 0.10", "60.00% ± 1.00"
    ]  # fmt: skip
    assert rows[8][:3] == ["equal training time", "lenet5", "2"]
    assert "capsnet-small ahead by 10.00 points, more than the seeds' spread" in table
    assert table.index("For context, not our results") < table.index("Novel smallNORB")
    only_time = {n: e for n, e in metrics.items() if "equal-time" in n or n == "capsnet-small"}
    assert [r[0] for r in _rows(readme.results_table(only_time))[2:]] == ["capsnet-small"]


def test_missing_sets_are_dashes_and_viewpoints_are_a_table_when_run():
    section = {
        "kinds": {
            "azimuth": {
                "models": {
                    "capsules": {
                        "model": "em-capsnet-small",
                        "familiar_error": 0.1,
                        "novel_error": 0.15,
                        "paper_novel_error": 0.135,
                    },
                    "cnn": {
                        "model": "smallnorb-cnn",
                        "familiar_error": 0.1,
                        "novel_error": 0.2,
                        "paper_novel_error": 0.2,
                    },
                },
                "gap": 0.0,
                "tolerance": 0.01,
                "target_familiar_error": 0.1,
                "matched": True,
            },
            "elevation": {"skipped": "no test data"},
        }
    }
    metrics = {
        "lenet5": _entry("lenet5", "models/lenet5.pt", mnist={"accuracy": 0.9, "n": 10}),
        "capsnet-small@multimnist": _model("capsnet-small", 0, 0, 0, 0, 0.5)[
            "capsnet-small@multimnist"
        ],
        "viewpoints": section,
    }
    rows = _rows(readme.results_table(metrics))
    assert rows[0] == ["model", "MNIST", "MultiMNIST (strict)"]
    assert rows[2] == ["lenet5", "90.00% (DZone article: 98.68%)", "–"]
    assert rows[3] == ["capsnet-small", "–", "50.00% (Sabour 2017: 94.80%)"]
    assert rows[4][0] == "novel viewpoints"
    novel = "15.00% (Hinton 2018, real smallNORB: 13.50%)"
    verdict = "0.00% ≤ 1.00%: matched"  # the stage's gap against its tolerance
    assert ["azimuth", "em-capsnet-small", "10.00%", novel, "10.00%", verdict] in rows
    assert ["elevation", "skipped: no test data", "", "", "", ""] in rows


def test_update_readme_rewrites_only_the_block_atomically(tmp_path):
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps(METRICS))
    path = tmp_path / "README.md"
    path.write_text(f"# x\n\nintro\n{readme.BEGIN}\nold table\n{readme.END}\ntail\n")
    assert readme.update_readme(path, metrics, "eval/figures/rotation.png")
    text = path.read_text()
    assert text.startswith("# x\n\nintro\n") and text.endswith(f"{readme.END}\ntail\n")
    assert readme.current_block(text) == readme.block(METRICS, "eval/figures/rotation.png")
    assert (
        "old table" not in text and "![accuracy versus rotation](eval/figures/rotation.png)" in text
    )
    assert not readme.update_readme(path, metrics, "eval/figures/rotation.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "metrics.json"]


@pytest.mark.parametrize(
    "text",
    [
        "no markers\n",
        f"{readme.BEGIN}\n{readme.BEGIN}\n{readme.END}\n",
        f"{readme.END}\n{readme.BEGIN}\n",
    ],
)
def test_update_readme_needs_one_pair_of_markers(tmp_path, text):
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps(METRICS))
    path = tmp_path / "README.md"
    path.write_text(text)
    with pytest.raises(CapsnetError, match=r"README.md: needs one <!-- results:begin -->"):
        readme.update_readme(path, metrics)
    assert path.read_text() == text
    with pytest.raises(CapsnetError, match=r"none\.md: not found"):
        readme.update_readme(tmp_path / "none.md", metrics)


def test_the_publish_stage_writes_its_table_as_a_dvc_output(repo_root):
    """Every file the publish stage writes is one of its DVC outputs: the table goes to
    eval/results.md, and the README's copy is refreshed by `capsnet publish --readme`."""
    stage = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]["publish"]
    assert stage["cmd"].split()[:4] == ["python", "-m", "capsnet", "publish"]
    assert "--readme" not in stage["cmd"]
    outs = [next(iter(o)) for o in stage["outs"]]
    assert outs == ["eval/report.html", "eval/results.md", "eval/published.json"]
    assert "eval/metrics.json" in stage["deps"]


def test_dvc_lock_eval_and_the_readme_are_one_run(committed_root):
    """Every committed output of the pipeline is the file dvc.lock records (one `dvc repro`
    wrote them all), and the README block's origin line names the CPU kind they depend on."""
    import hashlib

    import yaml

    lock = yaml.safe_load((committed_root / "dvc.lock").read_text())
    checked = []
    for stage in lock["stages"].values():
        for out in stage.get("outs", []):
            path = committed_root / out["path"]
            if path.is_file():
                assert hashlib.md5(path.read_bytes()).hexdigest() == out["md5"], out["path"]
                checked.append(out["path"])
    assert {"eval/metrics.json", "eval/results.md", "models-viewpoints.csv"} <= set(checked)
    block = readme.current_block((committed_root / "README.md").read_text(), "README.md")
    origin = next(line for line in block.splitlines() if line.startswith(readme.ORIGIN_PREFIX))
    assert "AVX" in origin and "commit `" in origin


def _without_origin(block: str) -> str:
    return "\n".join(
        line for line in block.splitlines() if not line.startswith(readme.ORIGIN_PREFIX)
    ).replace("\n\n\n", "\n\n")


def test_committed_readme_table_matches_committed_metrics(committed_root):
    """The block in README.md is what `capsnet publish --readme README.md` writes from
    eval/metrics.json (the origin line names the machine of the committed run), as both
    are committed."""
    repo_root = committed_root
    params = config.load(repo_root / "params.yaml")
    out_dir = repo_root / params.evaluate.out_dir
    metrics = json.loads((out_dir / "metrics.json").read_text())
    figure = os.path.relpath(out_dir / "figures" / "rotation.png", repo_root)
    committed = readme.current_block((repo_root / "README.md").read_text(), "README.md")
    assert _without_origin(committed) == readme.block(metrics, figure), (
        "README.md's results table differs from eval/metrics.json: run "
        "`capsnet publish --readme README.md`"
    )
    table = out_dir / "results.md"
    if table.is_file():  # written by the publish stage since it became an output
        assert readme.body(metrics) in table.read_text()


def test_cpu_profile_doc_table_matches_its_metrics(repo_root):
    """docs/cpu-profile.md holds the block the profile's publish stage wrote, regenerated
    from the profile's eval/metrics.json (kept beside it)."""
    doc = repo_root / "docs" / "cpu-profile.md"
    metrics = json.loads((repo_root / "docs" / "cpu-profile" / "metrics.json").read_text())
    committed = readme.current_block(doc.read_text(), doc)
    assert committed == readme.block(metrics, "cpu-profile/rotation.png"), (
        "docs/cpu-profile.md's table differs from docs/cpu-profile/metrics.json: run "
        "python -m pipeline.publish.readme docs/cpu-profile.md docs/cpu-profile/metrics.json "
        "cpu-profile/rotation.png"
    )
    assert (repo_root / "docs" / "cpu-profile" / "rotation.png").stat().st_size > 0
    capsules = metrics["comparison"]["arms"]["equal_augmentation"]["models"]["capsnet-small"]
    assert capsules["seeds"] == 3 and capsules["augment"] == "shift"


def test_smallnorb_profile_doc_table_matches_its_metrics(repo_root):
    """docs/smallnorb-profile.md holds the block regenerated from the smallNORB profile's
    eval/metrics.json (kept beside it): 3 seeds of each kind, the first at chance named."""
    doc = repo_root / "docs" / "smallnorb-profile.md"
    metrics = json.loads((repo_root / "docs" / "smallnorb-profile" / "metrics.json").read_text())
    committed = readme.current_block(doc.read_text(), doc)
    assert committed == readme.block(metrics), (
        "docs/smallnorb-profile.md's table differs from docs/smallnorb-profile/metrics.json: "
        "run python -m pipeline.publish.readme docs/smallnorb-profile.md "
        "docs/smallnorb-profile/metrics.json"
    )
    kinds = metrics["viewpoints"]["kinds"]
    assert sorted(kinds) == sorted(f"{k}{s}" for k in ("azimuth", "elevation")
                                   for s in ("", "@seed1", "@seed2"))  # fmt: skip
    assert "Azimuth, over 3 seeds" in committed and "Elevation, over 3 seeds" in committed
    assert (repo_root / "docs" / "smallnorb-profile" / "viewpoints.png").stat().st_size > 0


def test_a_run_at_chance_is_named_under_the_table(committed_root):
    """A single checkpoint below 1.25 / classes is named; so is one seed of a mean."""
    assert "At chance" not in readme.results_table(METRICS)
    lost = json.loads(json.dumps(METRICS))
    lost["lenet5"]["mnist"]["accuracy"] = 0.11  # 10 classes: chance 10%
    table = readme.results_table(lost)
    assert (
        "At chance (below 1.25 times 1 / classes): lenet5 on MNIST, 11.00% (chance 10.00%)."
        in table
    )
    committed = json.loads((committed_root / "eval" / "metrics.json").read_text())
    seeds = committed["smallnorb-cnn (mean)"]["checkpoints"]
    names = [
        n for n, e in committed.items() if isinstance(e, dict) and e.get("checkpoint") in seeds
    ]
    for name in names:
        committed[name]["smallnorb"]["accuracy"] = 0.6
    assert "smallnorb-cnn" not in readme.at_chance_line(
        parse_results(committed),
        model_picks(parse_results(committed).main_entries(), ["smallnorb"]),
        {},
    )
    committed[names[1]]["smallnorb"]["accuracy"] = 0.21  # 5 classes: chance 20%
    line = readme.results_table(committed)
    assert f"{names[1]} on smallNORB (synth stand-in), 21.00% (chance 20.00%)" in line
