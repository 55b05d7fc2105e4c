"""The seeds' comparison (metrics.json "comparison") as the publish stage shows it: the
sentences (favourable to capsules or not), report.html's tables and folded skips, and the
W&B comparison table."""

from __future__ import annotations

import json
import re

import pytest
from comparisonhelpers import comparison, group, seeded_results

from pipeline.publish import comparison as comparison_text
from pipeline.publish import report


def test_capsules_ahead_by_more_than_the_spread():
    words = comparison_text.sentences(comparison(0.70, 0.60))
    assert words[0] == (
        "At 35°, the capsule model is ahead by more than the seeds' spread in 1 of 1 comparison."
    )
    assert words[1] == (  # the arm's verdict, both angles, in one sentence
        "Equal augmentation (shift, 3 epochs): at 0° (upright MNIST) capsnet-small 97.00% ± "
        "0.10 against lenet5 95.00% ± 0.10, capsnet-small ahead by 2.00 points, more than "
        "the seeds' spread (std sum 0.20); at 35° capsnet-small 70.00% ± 1.00 against "
        "lenet5 60.00% ± 1.00, capsnet-small ahead by 10.00 points, more than the seeds' "
        "spread (std sum 2.00)."
    )
    assert len(words) == 3
    # the rotated-MNIST article's numbers are context, never ours
    assert words[-1].startswith("For context, not our results: the article “Approaching")
    assert (
        "LeNet5 98.68% on upright MNIST and 76.05% at 35°, a CapsNet 99.37% and 84.09%" in words[-1]
    )


def test_capsules_behind_is_said_plainly():
    words = comparison_text.sentences(comparison(0.60, 0.75))
    assert words[0] == (
        "At 35°, the capsule model is behind by more than the seeds' spread in 1 of 1 comparison."
    )
    assert words[1].endswith(
        "capsnet-small 60.00% ± 1.00 against lenet5 75.00% ± 1.00, lenet5 ahead by 15.00 "
        "points, more than the seeds' spread (std sum 2.00)."
    )


def test_a_difference_inside_the_spread_is_no_clear_difference():
    words = comparison_text.sentences(comparison(0.66, 0.65, std35=0.02))
    assert (
        words[0]
        == "At 35°, the capsule model is level within the seeds' spread in 1 of 1 comparison."
    )
    assert words[1].endswith(
        "capsnet-small 66.00% ± 2.00 against lenet5 65.00% ± 2.00, a difference of 1.00 "
        "points, within the seeds' spread (std sum 4.00): no clear difference at 3 seeds."
    )


def test_one_seed_has_no_spread_to_judge_by():
    words = comparison_text.sentences(comparison(0.70, 0.60, std35=0.0, seeds=1))
    assert words[0] == "At 35°, 1 of 1 comparison used one seed, with no spread to judge by."
    assert "one seed, so no spread to judge the 10.00-point difference." in words[1]
    assert "ahead by 10.00" not in " ".join(words)


def test_equal_time_budget_ratio_and_a_missed_tolerance():
    section = comparison(0.70, 0.60)
    caps = section["arms"]["equal_augmentation"]["models"]["capsnet-small"]
    lenet = group("lenet5", {0: 0.98, 35: 0.72}, {0: 0.001, 35: 0.01}, epochs=31.0)
    lenet.update(train_seconds=28.0, time_ratio=1.4, within_tolerance=False)
    section["arms"]["equal_time"] = {
        "reference": "capsnet-small",
        "time_budget_seconds": 20.0,
        "tolerance": 0.25,
        "models": {"capsnet-small": caps, "lenet5": lenet},
    }
    words = comparison_text.sentences(section)
    assert (
        "Equal training time: the budget was 20.0 s, capsnet-small's mean training time; "
        "lenet5 trained 28.0 s (31 epochs), 1.40 of the budget, NOT within the 25% "
        "tolerance: not an equal-time comparison." in words
    )
    assert any(
        w.startswith("Equal training time: at 0° (upright MNIST)") and w.endswith(
            "; at 35° capsnet-small 70.00% ± 1.00 against lenet5 72.00% ± 1.00, lenet5 ahead by "
            "2.00 points, more than the seeds' spread (std sum 2.00).")
        for w in words
    )  # fmt: skip
    assert words[0] == (
        "At 35°, the capsule model is ahead by more than the seeds' spread in 1 of 2 "
        "comparisons and behind by more than the seeds' spread in 1 of 2."
    )
    lenet.update(time_ratio=0.95, within_tolerance=True)
    assert any(
        s.endswith("trained 28.0 s (31 epochs), 0.95 of the budget, within the 25% tolerance.")
        for s in comparison_text.sentences(section)
    )


def test_augmented_baseline_against_the_capsule_model_at_the_nearest_angle():
    section = comparison(0.70, 0.60)
    for row in section["arms"]["equal_augmentation"]["models"].values():
        row["accuracy"] = {"0": row["accuracy"]["0"], "30": row["accuracy"]["35"], "60": 0.2}
        row["std"] = {"0": 0.001, "30": 0.01, "60": 0.01}
    rotate = group("lenet5", {0: 0.97, 30: 0.93, 60: 0.8}, {0: 0.0, 30: 0.005, 60: 0.0})
    rotate["augment"] = "rotate"
    section["arms"]["baseline_augmentation"] = {"models": {"lenet5 (rotate)": rotate}}
    words = comparison_text.sentences(section)
    assert words[0].startswith("At 30° (the evaluated angle nearest 35°), the capsule model is ")
    assert words[0].endswith(" in 1 of 2.")
    assert words[-2] == (
        "Augmented baseline (rotate augmentation, against the equal-augmentation "
        "capsnet-small): at 30° (the evaluated angle nearest 35°) capsnet-small 70.00% ± "
        "1.00 against lenet5 (rotate) 93.00% ± 0.50, lenet5 (rotate) ahead by 23.00 points, "
        "more than the seeds' spread (std sum 1.50)."
    )
    rows = comparison_text.rows(section)
    assert [(r.arm, r.model, r.headline) for r in rows] == [
        ("equal_augmentation", "capsnet-small", (0.70, 0.01)),
        ("equal_augmentation", "lenet5", (0.60, 0.01)),
        ("baseline_augmentation", "lenet5 (rotate)", (0.93, 0.005)),
    ]


def test_no_comparison_says_nothing():
    assert comparison_text.sentences(None) == []
    assert comparison_text.sentences({"arms": {}}) == []
    assert comparison_text.markdown(None) == ""
    assert comparison_text.long_rows({"angles": []}) == []


def test_report_leads_with_one_row_per_model_then_the_comparison_and_folds_skips():
    text = report.render_html(seeded_results())
    table = re.search(r'<table id="results">(.*?)</table>', text).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", table)
    assert [re.search(r"<td>([^<]*)</td>", r).group(1) for r in rows[1:]] == [
        "lenet5",
        "capsnet-small",
    ]
    assert '<td title="lenet5 (mean)">95.50% ± 0.70' in rows[1]  # the equal-augmentation seeds
    assert "97.50%" not in table  # the equal-time mean never fills lenet5's row
    assert text.index('id="results"') < text.index("<h2>Comparison</h2>")
    assert "capsnet-small ahead by 10.00 points" in text
    arm = re.search(
        r'<table class="comparison" id="comparison-equal_augmentation">(.*?)</table>', text
    )
    assert (
        "<tr><td>lenet5</td><td>3</td><td>shift</td><td>3</td><td>–</td><td>20.0 ± 0.5</td>"
        "<td>95.00% ± 0.10</td><td>60.00% ± 1.00</td></tr>" in arm.group(1)
    )
    assert 'id="comparison-equal_time"' in text
    fold = re.search(r'<details id="skipped"><summary>(.*?)</summary>(.*?)</details>', text)
    assert fold.group(1) == "15 model/dataset pairs skipped"  # 5 checkpoints x 3 sets
    assert text.index("</table>", text.index('id="comparison-equal_time"')) < fold.start()
    items = re.findall(r"<li>(.*?)</li>", fold.group(2))
    assert len(items) == 3  # grouped by reason
    assert items[2].startswith("robustness is off (5): lenet5 / robustness, lenet5@seed1 /")
    assert text.count('class="skipped"') == 1


def test_wandb_comparison_table_rows(tmp_path, monkeypatch):
    from pipeline import tracking
    from pipeline.publish import stage as publish

    monkeypatch.setenv("WANDB_MODE", "offline")
    results = seeded_results()
    runs = publish.publish_runs(
        results,
        tmp_path / "figures",
        project="capsnet-test",
        group="exp-1",
        mode="offline",
        wandb_dir=tmp_path / "runs",
    )
    assert [r["name"] for r in runs][-1] == "comparison"
    assert len(runs) == 1 + sum("checkpoint" in e for e in results.values())
    run_dir = tracking.offline_runs(tmp_path / "runs")[runs[-1]["run_id"]]
    info = tracking.read_run_info(run_dir)
    assert info["job_type"] == "comparison" and info["group"] == "exp-1/comparison"
    (row,) = tracking.read_history(run_dir)
    assert row["comparison/_type"] == "table-file"
    table = json.loads((run_dir / "files" / row["comparison/path"]).read_text())
    assert table["columns"] == ["arm", "model", "seeds", "angle", "mean", "std"]
    assert table["data"] == [
        ["equal_augmentation", "capsnet-small", 3, 0.0, 0.97, 0.001],
        ["equal_augmentation", "capsnet-small", 3, 35.0, 0.7, 0.01],
        ["equal_augmentation", "lenet5", 3, 0.0, 0.95, 0.001],
        ["equal_augmentation", "lenet5", 3, 35.0, 0.6, 0.01],
        ["equal_time", "lenet5", 2, 0.0, 0.975, 0.007],
        ["equal_time", "lenet5", 2, 35.0, 0.6, 0.0],
    ]


@pytest.mark.parametrize("seeds", [1, 3])
def test_markdown_table_shows_mean_and_std(seeds):
    text = comparison_text.markdown(comparison(0.70, 0.60, seeds=seeds))
    lines = text.splitlines()
    assert lines[0] == (
        "| comparison arm | model | seeds | budgeted s | train s | MNIST (0°) | 35° |"
    )
    assert lines[2] == (
        f"| equal augmentation | capsnet-small | {seeds} | – | 20.0 ± 0.5 | 97.00% ± 0.10 | "
        "70.00% ± 1.00 |"
    )
    assert lines[-1] == " ".join(comparison_text.sentences(comparison(0.70, 0.60, seeds=seeds)))
