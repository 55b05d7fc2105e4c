"""The novel-viewpoint experiment: the matching rule, its params, an end-to-end run on
smallNORB-format files written here, the evaluate stage's viewpoints section."""

from __future__ import annotations

import copy
import csv
import json
import shutil
import sys
import typing
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from clihelpers import assert_one_line_error, invoke_cli, run_cli

from capsnet import config, evaluation, models
from capsnet.cli import main
from capsnet.config.training import TrainConfig
from capsnet.config.viewpoints import KINDS, MatchRule
from capsnet.evaluation import viewpoint_matching as viewpoints
from capsnet.io.errors import ConfigError
from capsnet.models import checkpoint
from capsnet.training import scoring
from pipeline.viewpoints import stage

sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
from datahelpers import write_smallnorb_raw

TINY = {
    "capsules": {"A": 8, "B": 4, "C": 4, "D": 4},
    "cnn": {"channels": [4, 8], "hidden": 16},
}


def hist(*familiar, novel=None):
    novel = novel or [0.5] * len(familiar)
    return [
        {"epoch": i + 1, "familiar_error": f, "novel_error": n}
        for i, (f, n) in enumerate(zip(familiar, novel))
    ]


# --- the matching rule --------------------------------------------------------------------------


def test_target_is_the_larger_best_error_and_first_epoch_at_or_below_it():
    caps = hist(0.5, 0.3, 0.1, 0.05, novel=[0.6, 0.4, 0.2, 0.15])
    cnn = hist(0.4, 0.2, 0.12, 0.15, novel=[0.5, 0.35, 0.3, 0.32])
    result = viewpoints.select_matched({"capsules": caps, "cnn": cnn}, tolerance=0.03)
    assert result["target_familiar_error"] == 0.12  # the CNN's best: the level both reach
    assert result["models"]["cnn"] == {
        "epoch": 3,
        "familiar_error": 0.12,
        "novel_error": 0.3,
        "best_familiar_error": 0.12,
    }
    assert result["models"]["capsules"]["epoch"] == 3  # first <= 0.12, not the best (0.05)
    assert result["models"]["capsules"]["novel_error"] == 0.2
    assert result["gap"] == pytest.approx(0.02)
    assert result["matched"] is True
    strict = viewpoints.select_matched({"capsules": caps, "cnn": cnn}, tolerance=0.01)
    assert strict["matched"] is False and strict["tolerance"] == 0.01


def test_checks_within_an_epoch_take_the_first_fractional_check_at_or_below_the_target():
    capsules = hist(0.5, 0.3, 0.2)
    cnn = [
        {"epoch": e, "familiar_error": f, "novel_error": n}
        for e, f, n in [(0.5, 0.4, 0.6), (1, 0.25, 0.55), (1.5, 0.21, 0.5), (2, 0.19, 0.45),
                        (2.5, 0.1, 0.4), (3, 0.05, 0.3)]
    ]  # fmt: skip
    chosen = viewpoints.select_matched({"capsules": capsules, "cnn": cnn}, tolerance=0.02)
    assert chosen["target_familiar_error"] == 0.2
    assert chosen["models"]["cnn"]["epoch"] == 2 and chosen["models"]["capsules"]["epoch"] == 3
    assert chosen["matched"] and chosen["gap"] == pytest.approx(0.01)
    cnn[3]["familiar_error"] = 0.15  # the first check at or below 0.2 is now 0.15: no match
    chosen = viewpoints.select_matched({"capsules": capsules, "cnn": cnn}, tolerance=0.02)
    assert chosen["models"]["cnn"]["epoch"] == 2 and not chosen["matched"]
    cnn[2]["familiar_error"] = 0.195  # ... unless a check inside the epoch lands closer
    chosen = viewpoints.select_matched({"capsules": capsules, "cnn": cnn}, tolerance=0.02)
    assert chosen["models"]["cnn"]["epoch"] == 1.5 and chosen["matched"]


def test_nearest_takes_the_lowest_error_before_the_crossing_when_that_is_nearer():
    """A CNN checked every few steps whose familiar error jumps from just above the target
    to far below it (the profile's azimuths with seed 2: 9.1% then 6.3% against the
    capsules' 8.5%): "first" takes 6.3% (not matched), "nearest" 9.1%."""
    capsules = hist(0.2, 0.12, 0.085)
    cnn = [
        {"epoch": e, "familiar_error": f, "novel_error": n}
        for e, f, n in [(0.25, 0.3, 0.6), (0.5, 0.096, 0.45), (0.75, 0.198, 0.5),
                        (1, 0.091, 0.39), (1.25, 0.063, 0.33), (1.5, 0.08, 0.3)]
    ]  # fmt: skip
    histories = {"capsules": capsules, "cnn": cnn}
    first = viewpoints.select_matched(histories, 0.01)
    assert first["models"]["cnn"]["epoch"] == 1.25 and first["gap"] == pytest.approx(0.022)
    assert not first["matched"]
    near = viewpoints.select_matched(histories, 0.01, "nearest")
    assert near["target_familiar_error"] == 0.085
    assert near["models"]["cnn"] == {
        "epoch": 1, "familiar_error": 0.091, "novel_error": 0.39, "best_familiar_error": 0.063,
    }  # fmt: skip
    assert near["models"]["capsules"]["epoch"] == 3  # its best sets the target: taken there
    assert near["gap"] == pytest.approx(0.006) and near["matched"]
    cnn[4]["familiar_error"] = 0.084  # the crossing is nearer: both rules take it
    assert viewpoints.select_matched(histories, 0.01, "nearest")["models"]["cnn"]["epoch"] == 1.25
    tie = {"capsules": hist(0.5, 0.25), "cnn": hist(0.375, 0.125)}  # 0.125 either side
    assert viewpoints.select_matched(tie, 0, "nearest")["models"]["cnn"]["epoch"] == 2  # later
    with pytest.raises(ValueError, match="unknown matching rule 'closest'"):
        viewpoints.select_matched(histories, 0.01, "closest")


def test_lowest_takes_the_lowest_level_both_reach_within_the_tolerance():
    """The default run's azimuth pattern: the CNN jumps past the capsules' best (27.9%)
    from 29.8% to 26%, 1.9 points either way; one capsule check earlier (28.8%) it was
    within a point of the CNN's 29.8%, so the pair is matched there."""
    caps = [0.606, 0.432, 0.340, 0.311, 0.308, 0.288, 0.279, 0.295]
    cnn = [0.50, 0.40, 0.35, 0.318, 0.298, 0.26, 0.24, 0.25, 0.21]
    histories = {
        "capsules": hist(*caps),
        "cnn": [{"epoch": k / 4, "familiar_error": e, "novel_error": 0.5} for k, e in
                enumerate(cnn, start=1)],
    }  # fmt: skip
    nearest = viewpoints.select_matched(histories, 0.01, "nearest")
    assert not nearest["matched"] and nearest["gap"] == pytest.approx(0.019)
    lowest = viewpoints.select_matched(histories, 0.01, "lowest")
    assert lowest["matched"] and lowest["target_familiar_error"] == pytest.approx(0.298)
    assert lowest["gap"] == pytest.approx(0.01)
    assert lowest["models"]["capsules"]["epoch"] == 6 and lowest["models"]["cnn"]["epoch"] == 1.25
    # an independent search: every kept pair within the tolerance, the lowest higher error
    kept = {k: viewpoints.candidate_epochs([r["familiar_error"] for r in h])
            for k, h in histories.items()}  # fmt: skip
    levels = [max(caps[i - 1], cnn[j - 1]) for i in kept["capsules"] for j in kept["cnn"]
              if abs(caps[i - 1] - cnn[j - 1]) <= 0.01 + 1e-12]  # fmt: skip
    assert lowest["target_familiar_error"] == min(levels)
    far = viewpoints.select_matched(  # no pair within the tolerance: the nearest rule's pair
        {"capsules": hist(0.5, 0.4), "cnn": hist(0.2, 0.1)}, 0.01, "lowest"
    )
    assert far == viewpoints.select_matched(
        {"capsules": hist(0.5, 0.4), "cnn": hist(0.2, 0.1)}, 0.01, "nearest"
    )
    assert not far["matched"]
    with pytest.raises(ValueError, match="pairs two models"):
        viewpoints.select_matched({"a": hist(0.5)}, 0.01, "lowest")


def test_nearest_only_ever_takes_a_check_whose_weights_are_kept():
    history = [0.5, 0.6, 0.4, 0.45, 0.41, 0.1, 0.3, 0.05]
    kept = viewpoints.candidate_epochs(history)
    for other in (0.03, 0.05, 0.07, 0.1, 0.2, 0.35, 0.4, 0.42, 0.5, 0.55, 0.9):
        for rule in viewpoints.RULES:
            chosen = viewpoints.select_matched({"a": hist(*history), "b": hist(other)}, 0, rule)
            assert chosen["models"]["a"]["epoch"] in kept, (other, rule)


def test_epoch_labels_are_whole_at_an_epochs_end_and_rounded_within():
    assert stage.epoch_label(2.0) == 2 and isinstance(stage.epoch_label(2.0), int)
    assert stage.epoch_label(1 + 1 / 3) == 1.3333
    assert stage.epoch_label(0.125) == 0.125


def test_ties_take_the_first_epoch():
    caps = hist(0.3, 0.2, 0.2, 0.2)
    cnn = hist(0.25, 0.2, 0.2)
    result = viewpoints.select_matched({"capsules": caps, "cnn": cnn})
    assert result["target_familiar_error"] == 0.2
    assert result["models"]["capsules"]["epoch"] == 2
    assert result["models"]["cnn"]["epoch"] == 2
    assert result["gap"] == 0 and result["matched"] is True


def test_a_model_that_never_improves():
    flat = hist(0.8, 0.8, 0.8)
    learner = hist(0.7, 0.3, 0.1)
    result = viewpoints.select_matched({"capsules": learner, "cnn": flat}, tolerance=0.05)
    assert result["target_familiar_error"] == 0.8  # only the flat model's level is shared
    assert result["models"]["cnn"]["epoch"] == 1
    assert result["models"]["capsules"]["epoch"] == 1  # 0.7 <= 0.8 already
    assert result["gap"] == pytest.approx(0.1) and result["matched"] is False
    worse = hist(0.9, 0.95, 0.99)  # gets worse: its best is its first epoch
    result = viewpoints.select_matched({"capsules": learner, "cnn": worse})
    assert result["models"]["cnn"]["epoch"] == 1
    assert result["models"]["capsules"]["epoch"] == 1


def test_selection_errors_and_candidate_epochs():
    with pytest.raises(ValueError, match="at least one"):
        viewpoints.select_matched({})
    with pytest.raises(ValueError, match="cnn: empty history"):
        viewpoints.select_matched({"capsules": hist(0.1), "cnn": []})
    with pytest.raises(ValueError, match="NaN"):
        viewpoints.select_matched({"capsules": hist(float("nan"))})
    assert viewpoints.candidate_epochs([0.5, 0.6, 0.4, 0.4, 0.1]) == [1, 3, 5]
    # every epoch the rule can choose is a candidate, whatever the other model did
    history = [0.5, 0.6, 0.4, 0.4, 0.1, 0.3]
    for other in (0.05, 0.1, 0.35, 0.4, 0.45, 0.55, 0.9):
        chosen = viewpoints.select_matched({"a": hist(*history), "b": hist(other)})
        assert chosen["models"]["a"]["epoch"] in viewpoints.candidate_epochs(history)


# --- params ---------------------------------------------------------------------------------


def write_params(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_params_defaults_and_errors(tmp_path):
    defaults = config.Params().viewpoints
    assert defaults.kinds == ("azimuth", "elevation")
    assert (defaults.capsules, defaults.cnn) == ("em-capsnet-small", "smallnorb-cnn")
    assert defaults.weight_decay.capsules == 2e-7 and defaults.weight_decay.cnn == 0
    assert defaults.batch_size == 64 and defaults.out_dir == "models-viewpoints"
    assert defaults.match == "first"
    assert set(viewpoints.RULES) == set(typing.get_args(MatchRule))  # one rule text each
    repo = config.load(Path(__file__).resolve().parents[1] / "params.yaml")
    assert repo.viewpoints.out_dir == "models-viewpoints"
    cases = {
        "viewpoints:\n  kindz: [azimuth]\n": "viewpoints.kindz: unknown key",
        "viewpoints:\n  kinds: [azimuth, roll]\n": "viewpoints.kinds[1]: 'roll' unknown",
        "viewpoints:\n  kinds: []\n": "viewpoints.kinds",
        "viewpoints:\n  kinds: [azimuth, azimuth]\n": "viewpoints.kinds: repeats",
        "viewpoints:\n  channels: 3\n": "viewpoints.channels: must be 1 or 2",
        "viewpoints:\n  channels: two\n": "viewpoints.channels: expected an integer",
        "viewpoints:\n  epochs: 0\n": "viewpoints.epochs: must be >= 1",
        "viewpoints:\n  lr: -1\n": "viewpoints.lr: must be > 0",
        "viewpoints:\n  tolerance: 2\n": "viewpoints.tolerance",
        "viewpoints:\n  test_limit: 0\n": "viewpoints.test_limit",
        "viewpoints:\n  cnn: em-capsnet-small\n": "viewpoints.cnn: must differ",
        "viewpoints:\n  weight_decay: {capsules: -1}\n": "viewpoints.weight_decay.capsules",
        "viewpoints:\n  weight_decay: {rnn: 0}\n": "viewpoints.weight_decay.rnn: unknown key",
        "viewpoints:\n  overrides: {cnn: {num_classes: 3}}\n": "viewpoints.overrides.cnn",
        "viewpoints:\n  amp: fp16\n": "viewpoints.amp: 'fp16' unknown",
        "viewpoints:\n  seeds: 0\n": "viewpoints.seeds: must be >= 1",
        "viewpoints:\n  lr: {capsules: 0.003, cnn: 0}\n": "viewpoints.lr.cnn: must be > 0",
        "viewpoints:\n  lr: {rnn: 0.1}\n": "viewpoints.lr.rnn: unknown key",
        "viewpoints:\n  lr: {cnn: -1}\n": "viewpoints.lr.cnn: must be >= 0",
        "viewpoints:\n  lr: fast\n": "viewpoints.lr: expected float or {capsules, cnn}",
        "viewpoints:\n  lr_decay: 1.5\n": "viewpoints.lr_decay: must be in (0, 1]",
        "viewpoints:\n  lr_decay_steps: 0\n": "viewpoints.lr_decay_steps: must be >= 1",
        "viewpoints:\n  checks_per_epoch: {cnn: 0}\n": "checks_per_epoch.cnn: must be >= 1",
        "viewpoints:\n  checks_per_epoch: {cnn: 2.5}\n": "checks_per_epoch.cnn: expected",
        "viewpoints:\n  checks_per_epoch: 4\n": "viewpoints.checks_per_epoch",
        "viewpoints:\n  epochs: {capsules: 2, cnn: 0}\n": "viewpoints.epochs.cnn: must be >= 1",
        "viewpoints:\n  epochs: {rnn: 2}\n": "viewpoints.epochs.rnn: unknown key",
        "viewpoints:\n  epochs: many\n": "viewpoints.epochs: expected",
        "viewpoints:\n  epochs: {cnn: 2}\n": "viewpoints.epochs.capsules: missing: name both",
        "viewpoints:\n  match: closest\n": "viewpoints.match: 'closest' unknown",
        "viewpoints:\n  test_limit: 300\n  tolerance: 0.003\n": (
            "viewpoints.tolerance: 0.003 is less than one of test_limit's 300 images"
        ),
    }
    for text, fragment in cases.items():
        with pytest.raises(ConfigError) as info:
            config.load(write_params(tmp_path / "p.yaml", text))
        message = str(info.value)
        assert fragment in message and "\n" not in message, (text, message)
    one_image = "viewpoints:\n  test_limit: 300\n  tolerance: 0.0034\n"  # just above 1/300
    assert config.load(write_params(tmp_path / "p.yaml", one_image)).viewpoints.tolerance == 0.0034


def test_default_run_trains_the_capsules_as_measured_to_learn(tmp_path):
    """params.yaml's viewpoint capsules: 2 routing iterations and at least 96 steps (96
    steps measured at 28.8% familiar azimuth and 42-43% elevation error, far from chance's
    80%; docs/em.md, "Learning on the stand-in"); 3 iterations for 32 steps stayed near
    chance."""
    repo = config.load(Path(__file__).resolve().parents[1] / "params.yaml")
    spec = stage.kind_spec(repo, tmp_path, "azimuth", "capsules")
    built = models.build(spec.model, **spec.overrides)
    assert built.config.routing_iterations == 2
    steps = spec.train.epochs * -(-spec.train_size // spec.train.batch_size)
    assert steps >= 96, steps


def test_each_run_takes_its_seed_and_the_sections_schedule(tmp_path):
    text = "viewpoints:\n  seed: 5\n  seeds: 3\n  lr_decay: 0.5\n  lr_decay_steps: 100\n"
    params = config.load(write_params(tmp_path / "p.yaml", text))
    assert params.viewpoints.seed_list() == [5, 6, 7]
    for role in ("capsules", "cnn"):
        first, third = (stage.kind_spec(params, tmp_path, "azimuth", role, s) for s in (None, 7))
        assert (first.train.seed, third.train.seed) == (5, 7)
        assert (first.train.lr_decay, first.train.lr_decay_steps) == (0.5, 100)
    per_model = "viewpoints:\n  lr: {capsules: 0.003, cnn: 0.001}\n"
    params = config.load(write_params(tmp_path / "p.yaml", per_model))
    lrs = {
        r: stage.kind_spec(params, tmp_path, "elevation", r).train.lr for r in ("capsules", "cnn")
    }
    assert lrs == {"capsules": 0.003, "cnn": 0.001}
    unset = stage.kind_spec(config.Params(), tmp_path, "azimuth", "cnn").train
    assert unset.lr == config.Params().viewpoints.lr == 3e-3  # one number: both models
    assert (unset.lr_decay, unset.lr_decay_steps) == (
        TrainConfig.lr_decay,
        TrainConfig.lr_decay_steps,
    )


def test_epochs_are_one_number_for_both_models_or_one_each(tmp_path, repo_root):
    """``viewpoints.epochs`` as one number trains both models that long; as {capsules, cnn}
    each its own, also when a profile lays the mapping over params.yaml's number."""
    from pipeline import profile

    each = config.load(
        write_params(tmp_path / "p.yaml", "viewpoints:\n  epochs: {capsules: 3, cnn: 1}\n")
    )
    both = config.load(write_params(tmp_path / "q.yaml", "viewpoints:\n  epochs: 4\n"))
    for params, expected in ((each, {"capsules": 3, "cnn": 1}), (both, {"capsules": 4, "cnn": 4})):
        for role, epochs in expected.items():
            assert stage.kind_spec(params, tmp_path, "azimuth", role).train.epochs == epochs
            assert params.viewpoints.epochs_of(role) == epochs
    laid = tmp_path / "cnn-short.yaml"
    laid.write_text("viewpoints:\n  epochs: {capsules: 6, cnn: 2}\n")
    _path, changes, merged = profile.load(repo_root / "params.yaml", laid)
    assert changes == {"viewpoints.epochs.capsules": 6, "viewpoints.epochs.cnn": 2}
    assert (merged.viewpoints.epochs_of("capsules"), merged.viewpoints.epochs_of("cnn")) == (6, 2)


def test_the_smallnorb_cpu_profile_trains_three_seeds_on_every_familiar_image(repo_root):
    """profiles/smallnorb-cpu.yaml validates, trains 3 seeds on all 8,100 familiar images
    of each kind, multiplies the learning rate by 0.7 once per epoch of them, trains the
    capsules 6 epochs and the CNN 2, measuring it every 5 or 6 steps (docs/em.md)."""
    from pipeline import profile

    _path, changes, merged = profile.load(repo_root / "params.yaml", "smallnorb-cpu")
    settings = merged.viewpoints
    assert set(changes) >= {"viewpoints.seeds", "viewpoints.train_limit", "viewpoints.epochs.cnn"}
    assert settings.seed_list() == [0, 1, 2] and settings.train_limit is None
    steps_per_epoch = -(-8100 // settings.batch_size)
    assert (settings.lr_decay, settings.lr_decay_steps) == (0.7, steps_per_epoch)
    checks = settings.checks_per_epoch
    assert (checks.capsules, checks.cnn) == (1, 48)
    assert steps_per_epoch // checks.cnn == 5  # 48 checks: after every 5 or 6 steps
    assert (settings.epochs_of("capsules"), settings.epochs_of("cnn")) == (6, 2)
    assert merged.viewpoints.kinds == ("azimuth", "elevation")
    assert (settings.lr_of("capsules"), settings.lr_of("cnn")) == (0.003, 0.001)
    assert settings.match == "nearest" and changes["viewpoints.match"] == "nearest"


def test_both_models_train_at_the_sections_precision(tmp_path):
    fp32 = config.load(write_params(tmp_path / "p.yaml", "viewpoints:\n  amp: fp32\n"))
    for params, amp in ((config.Params(), TrainConfig.amp), (fp32, "fp32")):
        for role in ("capsules", "cnn"):
            assert stage.kind_spec(params, tmp_path, "azimuth", role).train.amp == amp


def test_unknown_model_or_override_fails_before_any_data(tmp_path):
    on = "data:\n  smallnorb: {enabled: true}\n"
    params = write_params(tmp_path / "p.yaml", on + "viewpoints:\n  capsules: em-capsnet-huge\n")
    assert_one_line_error(
        run_cli("viewpoints", "--params", str(params), "--data-root", str(tmp_path)),
        "viewpoints.capsules",
        "em-capsnet-huge",
    )
    params.write_text(on + "viewpoints:\n  overrides: {cnn: {widht: 3}}\n")
    assert_one_line_error(  # the same boundary: in this process
        invoke_cli("viewpoints", "--params", str(params), "--data-root", str(tmp_path)),
        "viewpoints.overrides.cnn",
        "widht",
    )


def test_a_model_in_the_other_role_fails_before_any_data(tmp_path):
    """The registry says which models are capsule networks: a CNN named as the capsules
    role (or capsules as the CNN) is refused, naming the params key and the model."""
    on = "data:\n  smallnorb: {enabled: true}\n"
    swapped = "viewpoints:\n  capsules: smallnorb-cnn\n  cnn: em-capsnet-small\n"
    params = write_params(tmp_path / "p.yaml", on + swapped)
    assert_one_line_error(
        invoke_cli("viewpoints", "--params", str(params), "--data-root", str(tmp_path)),
        "viewpoints.capsules",
        "smallnorb-cnn",
    )


def test_swapped_viewpoint_checkpoints_are_refused_naming_file_and_role(tmp_path):
    """The evaluate stage scores each checkpoint in the role viewpoints.json gives it only
    when its model fits that role: swapped files fail in one line naming file and role."""
    from capsnet.io.errors import CheckpointError

    out = tmp_path / "models-viewpoints"
    caps = models.build("em-capsnet-small", in_channels=1, input_size=32, num_classes=5,
                        **TINY["capsules"])  # fmt: skip
    cnn = models.build("smallnorb-cnn", in_channels=1, input_size=32, num_classes=5,
                       **TINY["cnn"])  # fmt: skip
    checkpoint.save(out / "azimuth" / "em-capsnet-small.pt", caps)
    checkpoint.save(out / "azimuth" / "smallnorb-cnn.pt", cnn)
    selection = {"target_familiar_error": 0.1, "tolerance": 0.5, "models": {}}
    swapped = {  # each role names the other model's file
        "capsules": {"checkpoint": "azimuth/smallnorb-cnn.pt"},
        "cnn": {"checkpoint": "azimuth/em-capsnet-small.pt"},
    }
    payload = {"kinds": {"azimuth": {"kind": "azimuth", "selection": selection,
                                     "models": swapped}}}  # fmt: skip
    (out / "viewpoints.json").write_text(json.dumps(payload))
    with pytest.raises(CheckpointError) as raised:
        evaluation.evaluate_viewpoints(out, evaluation.EvalRequest())
    message = str(raised.value)
    assert "\n" not in message
    assert str(out / "azimuth" / "smallnorb-cnn.pt") in message and "capsules role" in message


# --- switched off ------------------------------------------------------------------------------


def test_disabled_writes_a_marked_output_and_eval_skips_it(tmp_path):
    out = tmp_path / "vp"
    text = f"data:\n  smallnorb:\n    enabled: false\nviewpoints:\n  out_dir: {out}\n"
    params = write_params(tmp_path / "p.yaml", text)
    result = CliRunner().invoke(
        main, ["viewpoints", "--params", str(params), "--data-root", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "switched off" in (out / "DISABLED.txt").read_text()
    payload = json.loads((out / "viewpoints.json").read_text())
    assert set(payload) == {"disabled"} and "data.smallnorb.enabled" in payload["disabled"]
    header = "kind,seed,model,epoch,familiar_error,novel_error\n"
    assert viewpoints.csv_path(out) == tmp_path / "vp.csv"
    assert viewpoints.csv_path(out).read_text() == header
    assert sorted(p.name for p in out.iterdir()) == ["DISABLED.txt", "viewpoints.json"]
    section = evaluation.evaluate_viewpoints(out, evaluation.EvalRequest())
    assert "switched off" in section.skipped
    missing = evaluation.evaluate_viewpoints(tmp_path / "none", evaluation.EvalRequest())
    assert "not found" in missing.skipped
    lines = evaluation.summary_lines({"viewpoints": section})
    assert any("novel viewpoints: skipped" in line for line in lines)


# --- end to end on tiny smallNORB-format files ---------------------------------------------------


@pytest.fixture(scope="module")
def norb_root(tmp_path_factory):
    """A data root with prepared smallNORB: 72 examples per split, info rows cycling
    through every azimuth and elevation (24 familiar and 48 novel for each kind)."""
    from capsnet.data import stages

    root = tmp_path_factory.mktemp("norb") / "data"
    write_smallnorb_raw(root / "raw" / "smallnorb", n=72, side=48)
    on = config.Params(
        data=config.DataParams(smallnorb=config.SmallnorbParams(enabled=True)),
    )
    stages.prepare("smallnorb", on, root)
    return root


def tiny_params(tmp_path: Path, out: Path, extra: str = "", epochs: str = "2") -> Path:
    return write_params(
        tmp_path / "params.yaml",
        "data:\n  smallnorb: {enabled: true}\n"
        f"smallnorb_sweep:\n  name: norb\n  wandb: {{mode: offline, dir: {tmp_path / 'runs'}}}\n"
        "viewpoints:\n"
        f"  out_dir: {out}\n"
        "  channels: 1\n"
        f"  epochs: {epochs}\n"
        "  batch_size: 12\n"
        "  tolerance: 0.5\n"
        "  device: cpu\n"
        f"  overrides: {json.dumps(TINY)}\n" + extra,
    )


@pytest.fixture(scope="module")
def experiment(norb_root, tmp_path_factory):
    """`capsnet viewpoints` run once on the tiny data with two seeds: (params, out_dir, CLI
    result)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny routing ops: one thread is faster
    work = tmp_path_factory.mktemp("vp")
    out = work / "models-viewpoints"
    params = tiny_params(work, out, "  seed: 3\n  seeds: 2\n")
    try:
        result = CliRunner().invoke(
            main, ["viewpoints", "--params", str(params), "--data-root", str(norb_root)]
        )
    finally:
        torch.set_num_threads(threads)
    return params, out, result


def test_checks_within_epochs_are_recorded_selected_and_saved(norb_root, tmp_path):
    """The CNN trained 2 epochs and measured twice an epoch (24 images, batches of 12: after
    each step), the capsules 1 epoch: the CNN's history has the half epochs, the CSV too,
    and the saved checkpoint holds the weights of the check selected (its familiar error
    recomputed from the file)."""
    out = tmp_path / "vp"
    extra = "  kinds: [azimuth]\n  checks_per_epoch: {capsules: 1, cnn: 2}\n  match: nearest\n"
    params = tiny_params(tmp_path, out, extra, epochs="{capsules: 1, cnn: 2}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = invoke_cli("viewpoints", "--params", params, "--data-root", norb_root)
    finally:
        torch.set_num_threads(threads)
    assert result.returncode == 0, (result.stdout, result.stderr)
    payload = json.loads((out / "viewpoints.json").read_text())
    assert payload["rule"] == viewpoints.RULES["nearest"]
    assert payload["settings"]["match"] == "nearest"
    entry = payload["kinds"]["azimuth"]
    cnn, capsules = entry["models"]["cnn"], entry["models"]["capsules"]
    assert [r["epoch"] for r in cnn["history"]] == [0.5, 1, 1.5, 2]
    assert [r["epoch"] for r in capsules["history"]] == [1]  # epochs of its own
    assert (cnn["checks_per_epoch"], capsules["checks_per_epoch"]) == (2, 1)
    assert (cnn["epochs"], capsules["epochs"]) == (2, 1)
    assert "train_loss" not in cnn["history"][0] and "train_loss" in cnn["history"][1]
    histories = {role: m["history"] for role, m in entry["models"].items()}
    assert entry["selection"] == viewpoints.select_matched(histories, 0.5, "nearest")
    with open(viewpoints.csv_path(out), newline="") as fh:
        epochs = [r["epoch"] for r in csv.DictReader(fh) if r["model"] == "smallnorb-cnn"]
    assert epochs == ["0.5", "1", "1.5", "2"]
    spec = stage.kind_spec(config.load(params), norb_root, "azimuth", "cnn")
    familiar = stage.load_tests(spec, "azimuth", None)["familiar"]
    for role, model in entry["models"].items():
        loaded, meta = checkpoint.load(out / model["checkpoint"])
        chosen = entry["selection"]["models"][role]
        assert meta["metrics"]["epoch"] == chosen["epoch"]
        scored = scoring.accuracy(loaded, familiar, spec.train.eval_batch_size, "cpu")
        recomputed = 1 - scored["accuracy"]
        assert recomputed == pytest.approx(chosen["familiar_error"], abs=1e-9)


def test_experiment_outputs(experiment):
    _, out, result = experiment
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "[azimuth] em-capsnet-small epoch 2/2" in result.stderr
    assert "[azimuth@seed4] smallnorb-cnn epoch 2/2" in result.stderr
    verdicts = [line for line in result.stdout.splitlines() if "% familiar error (gap " in line]
    assert {v.split(":")[0] for v in verdicts} == {
        "azimuth", "azimuth@seed4", "elevation", "elevation@seed4"
    }  # fmt: skip
    logged = [line for line in result.stderr.splitlines() if "% (gap " in line]
    assert len(logged) == 4 and all("matched at" in line for line in logged)
    wide = [line for line in [*result.stdout.splitlines(), *logged] if len(line) > 120]
    assert not wide, wide
    payload = json.loads((out / "viewpoints.json").read_text())
    keys = {"azimuth": 3, "azimuth@seed4": 4, "elevation": 3, "elevation@seed4": 4}
    assert {k: e["seed"] for k, e in payload["kinds"].items()} == keys
    assert payload["paper"]["novel_error"]["azimuth"] == {"cnn": 0.20, "capsules": 0.135}
    for key, entry in payload["kinds"].items():
        kind, seed = entry["kind"], entry["seed"]
        assert key.partition("@")[0] == kind and entry["novel_subset"] == f"{kind}-novel"
        assert entry["train_size"] == 24
        assert (entry["familiar_test_size"], entry["novel_test_size"]) == (24, 48)
        assert set(entry["models"]) == {"capsules", "cnn"}
        histories = {}
        for role, model in entry["models"].items():
            assert model["epochs"] == 2 and len(model["history"]) == 2
            assert model["config"]["in_channels"] == 1 and model["config"]["num_classes"] == 5
            suffix = "" if seed == 3 else "@seed4"  # the first seed's name has none
            assert model["checkpoint"] == f"{kind}/{model['model']}{suffix}.pt"
            assert model["train_config"]["seed"] == seed
            for record in model["history"]:
                assert 0 <= record["familiar_error"] <= 1 and 0 <= record["novel_error"] <= 1
            histories[role] = model["history"]
        assert entry["selection"] == viewpoints.select_matched(histories, 0.5)
        assert entry["models"]["capsules"]["train_config"]["weight_decay"] == 2e-7
        assert entry["models"]["cnn"]["train_config"]["weight_decay"] == 0.0
        for role, model in entry["models"].items():
            loaded, meta = checkpoint.load(out / model["checkpoint"])
            chosen = entry["selection"]["models"][role]
            assert meta["model_name"] == model["model"]
            assert meta["metrics"]["epoch"] == chosen["epoch"]
            assert meta["metrics"]["history"] == model["history"]
            assert meta["extra"]["data"] == {"standardize": True}  # data.smallnorb
            assert loaded.config.in_channels == 1
    with open(viewpoints.csv_path(out), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 2 * 2 * 2  # kinds x seeds x models x epochs
    assert set(rows[0]) == {"kind", "seed", "model", "epoch", "familiar_error", "novel_error"}
    assert {r["model"] for r in rows} == {"em-capsnet-small", "smallnorb-cnn"}
    assert {(r["kind"], r["seed"]) for r in rows} == {(k, s) for k in KINDS for s in "34"}
    weights = [  # the seeds train different models
        checkpoint.load(out / "azimuth" / f"em-capsnet-small{s}.pt")[0].state_dict()
        for s in ("", "@seed4")
    ]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not list(out.rglob(".*"))  # no temporary files left behind
    from pipeline import tracking

    runs = tracking.offline_runs(out.parent / "runs").values()
    infos = {tracking.read_run_info(d)["name"]: d for d in runs}
    assert len(infos) == 2 * 2 * 2  # kinds x seeds x models
    one = infos["viewpoints-azimuth@seed4-smallnorb-cnn"]
    assert tracking.read_run_info(one)["group"] == "norb/viewpoints"
    history = payload["kinds"]["azimuth@seed4"]["models"]["cnn"]["history"]
    logged = tracking.read_history(one)
    assert [r["novel_error"] for r in logged] == [r["novel_error"] for r in history]
    assert "viewpoints: 8 W&B run(s)" in result.stderr


def test_each_model_and_kind_gets_a_wandb_run_with_its_history_and_verdict(tmp_path):
    """``track`` on a made-up result: one run per kind and model, job_type "viewpoints",
    the per-check history as rows and the selection with the match verdict in its summary."""
    from capsnet.config.sweep import WandbConfig
    from pipeline import tracking

    history = {
        "capsules": [{"epoch": 1, "familiar_error": 0.3, "novel_error": 0.4},
                     {"epoch": 2, "familiar_error": 0.2, "novel_error": 0.3}],
        "cnn": [{"epoch": 0.5, "familiar_error": 0.25, "novel_error": 0.5},
                {"epoch": 1, "familiar_error": 0.15, "novel_error": 0.45}],
    }  # fmt: skip
    selection = viewpoints.select_matched(history, 0.1)
    models = {
        role: {"model": f"m-{role}", "checkpoint": f"azimuth/m-{role}.pt", "epochs": 2,
               "checks_per_epoch": 1, "history": h}
        for role, h in history.items()
    }  # fmt: skip
    kinds = {"azimuth": {"kind": "azimuth", "seed": 0, "models": models, "selection": selection,
                         "paper_novel_error": {"capsules": 0.135, "cnn": 0.2}}}  # fmt: skip
    wandb = WandbConfig(project="p", mode="offline", dir=str(tmp_path / "runs"))
    ids = stage.track(kinds, "rule", wandb, "exp")
    found = tracking.offline_runs(tmp_path / "runs")
    assert len(ids) == 2 and set(found) == set(ids)
    for run_dir in found.values():
        info = tracking.read_run_info(run_dir)
        role = info["config"]["role"]
        assert (info["group"], info["job_type"]) == ("exp/viewpoints", "viewpoints")
        assert info["name"] == f"viewpoints-azimuth-m-{role}"
        assert [r["familiar_error"] for r in tracking.read_history(run_dir)] == [
            r["familiar_error"] for r in history[role]
        ]
        summary = tracking.read_summary(run_dir)
        assert summary["matched"] is selection["matched"]
        assert summary["selected_epoch"] == selection["models"][role]["epoch"]
        assert summary["paper_novel_error"] == kinds["azimuth"]["paper_novel_error"][role]
    assert stage.track(kinds, "rule", WandbConfig(mode="disabled"), "exp") == []


def test_eval_stage_reports_viewpoints_and_smallnorb_checkpoints(
    experiment, norb_root, tmp_path, mnist_root, monkeypatch
):
    from capsnet import models
    from capsnet.evaluation import stage
    from capsnet.evaluation.metrics import load_results

    built = []  # what the stage's writers built, as it is handed to write_outputs
    write = stage.write_outputs
    monkeypatch.setattr(stage, "write_outputs", lambda r, *a: built.append(r) or write(r, *a))

    _, trained_out, result = experiment
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "models-viewpoints"  # a copy that says it matched by the other rule
    shutil.copytree(trained_out, out)
    payload = json.loads((out / "viewpoints.json").read_text())
    assert payload["rule"] == viewpoints.RULES["first"]  # params.yaml's default
    payload["rule"] = viewpoints.RULES["nearest"]
    (out / "viewpoints.json").write_text(json.dumps(payload))
    data_root = tmp_path / "data"  # MNIST from the mirror copy, the tiny smallNORB
    for sub, source in (("raw/mnist", mnist_root), ("prepared/smallnorb", norb_root)):
        (data_root / sub).parent.mkdir(parents=True, exist_ok=True)
        (data_root / sub).symlink_to(source / sub, target_is_directory=True)
    models_dir, extra = tmp_path / "models", tmp_path / "models-smallnorb"
    off = tmp_path / "off"
    off.mkdir()
    (off / "DISABLED.txt").write_text("smallnorb is switched off\n")
    checkpoint.save(models_dir / "lenet5.pt", models.build("lenet5"))
    checkpoint.save(
        extra / "smallnorb-cnn.pt",
        models.build("smallnorb-cnn", in_channels=2, input_size=32, num_classes=5, hidden=16),
    )
    checkpoint.save(  # the same stem as a models/ checkpoint: named after its folder
        extra / "lenet5.pt", models.build("lenet5", input_size=32, num_classes=5)
    )
    params = write_params(
        tmp_path / "params.yaml",
        "data:\n  smallnorb: {enabled: true}\n"
        "evaluate:\n"
        f"  models_dir: {models_dir}\n"
        f"  extra_models_dirs: [{extra}, {tmp_path / 'absent'}, {off}]\n"
        f"  viewpoints_dir: {out}\n"
        f"  out_dir: {tmp_path / 'eval'}\n"
        "  datasets: [mnist, smallnorb]\n"
        "  limit: 30\n"
        "  robustness: {enabled: false}\n"
        "  equivariance: {enabled: false}\n",
    )
    cli = CliRunner().invoke(
        main, ["evaluate-stage", "--params", str(params), "--data-root", str(data_root)]
    )
    assert cli.exit_code == 0, (cli.stdout, cli.stderr)
    assert "absent: not found" in cli.stderr
    assert "off: smallnorb is switched off" in cli.stderr
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert set(metrics) == {"lenet5", "smallnorb-cnn", "models-smallnorb/lenet5", "viewpoints"}
    cnn = metrics["smallnorb-cnn"]
    assert cnn["smallnorb"]["n"] == 30 and cnn["smallnorb"]["subset"] == "all"
    assert "28x28" in cnn["mnist"]["skipped"] and "32x32" in cnn["mnist"]["skipped"]
    assert "32x32" in metrics["lenet5"]["smallnorb"]["skipped"]  # an MNIST model: skipped
    assert metrics["models-smallnorb/lenet5"]["smallnorb"]["n"] == 30  # one channel
    assert load_results(tmp_path / "eval" / "metrics.json") == built[0]  # one contract
    section = metrics["viewpoints"]
    payload = json.loads((out / "viewpoints.json").read_text())
    assert section["rule"] == viewpoints.RULES["nearest"]  # as the stage's output says
    assert set(section["kinds"]) == set(payload["kinds"])  # every seed scored
    for key, trained in payload["kinds"].items():
        entry, kind = section["kinds"][key], trained["kind"]
        assert entry["seed"] == trained["seed"]
        assert entry["target_familiar_error"] == trained["selection"]["target_familiar_error"]
        assert entry["paper_novel_error"] == viewpoints.PAPER_NOVEL_ERROR[kind]
        for role in ("capsules", "cnn"):
            m = entry["models"][role]
            # the stage's test images (all of them here), not evaluate.limit's 30
            sizes = (trained["familiar_test_size"], trained["novel_test_size"])
            assert (m["familiar_n"], m["novel_n"]) == sizes and sizes[1] > 30
            assert m["paper_novel_error"] == viewpoints.PAPER_NOVEL_ERROR[kind][role]
            chosen = trained["selection"]["models"][role]
            assert m["epoch"] == chosen["epoch"]
            assert m["familiar_error"] == pytest.approx(chosen["familiar_error"])
            assert m["novel_error"] == pytest.approx(chosen["novel_error"])
        # one verdict: the stage's gap, tolerance and match; the re-score agrees with it
        selection = trained["selection"]
        assert (entry["gap"], entry["tolerance"]) == (selection["gap"], selection["tolerance"])
        assert entry["matched"] is selection["matched"]
        errors = [entry["models"][r]["familiar_error"] for r in ("capsules", "cnn")]
        assert entry["rescored_gap"] == pytest.approx(abs(errors[0] - errors[1]))
        assert entry["rescored_gap"] == pytest.approx(selection["gap"])
    assert all(len(line) <= 120 for line in cli.stdout.splitlines())  # the stage's log
    assert "novel viewpoints (smallNORB)" in cli.stdout
    assert "azimuth" in cli.stdout and "elevation" in cli.stdout
    assert "Azimuth, over 2 seeds (mean ± std of test error): em-capsnet-small" in cli.stdout
    drawn = {p.name for p in (tmp_path / "eval" / "figures").glob("*.png")}
    assert {"viewpoints.png", "confusion-smallnorb-cnn-smallnorb.png"} <= drawn, drawn
    assert "confusion-models-smallnorb_lenet5-smallnorb.png" in drawn


def test_report_has_a_novel_viewpoint_table():
    from pipeline.publish import readme, report

    section = {
        "rule": viewpoints.RULE,
        "kinds": {
            "azimuth": {
                "models": {
                    "capsules": {
                        "model": "em-capsnet-small",
                        "epoch": 7,
                        "familiar_error": 0.04,
                        "novel_error": 0.15,
                        "paper_novel_error": 0.135,
                    },
                    "cnn": {
                        "model": "smallnorb-cnn",
                        "epoch": 3,
                        "familiar_error": 0.042,
                        "novel_error": 0.21,
                        "paper_novel_error": 0.20,
                    },
                },
                "target_familiar_error": 0.042,
                "gap": 0.002,
                "matched": True,
            },
            "elevation": {"skipped": "smallnorb is switched off"},
        },
    }
    one_seed = copy.deepcopy(section)
    later = copy.deepcopy(section["kinds"]["azimuth"])  # a second seed: other errors
    later |= {"seed": 1, "matched": False, "gap": 0.03}
    later["models"]["capsules"] |= {"familiar_error": 0.06, "novel_error": 0.17}
    later["models"]["cnn"] |= {"familiar_error": 0.03, "novel_error": 0.25}
    section["kinds"]["azimuth@seed1"] = later
    entry = {"model": "lenet5", "checkpoint": "models/lenet5.pt", "mnist": {"accuracy": 0.9}}
    results = {"lenet5": entry, "viewpoints": section}
    seeds_line = (  # means and sample standard deviations over the two seeds, in points
        "Azimuth, over 2 seeds (mean ± std of test error): em-capsnet-small 5.00% ± 1.41 "
        "familiar, 16.00% ± 1.41 novel; smallnorb-cnn 3.60% ± 0.85 familiar, 23.00% ± 2.83 "
        "novel; familiar errors matched in 1 of 2 seeds."
    )
    assert seeds_line in readme.results_table(results).splitlines()
    assert f"<p>{seeds_line}</p>" in report.render_html(results)
    assert "over 2 seeds" not in readme.results_table({"lenet5": entry, "viewpoints": one_seed})
    assert "At chance" not in readme.results_table(results)
    later["models"]["cnn"]["familiar_error"] = 0.7995  # a CNN that learned nothing
    chance_line = (
        "At chance (familiar accuracy below 1.25 times 1 / classes, error above 75.00%): "
        "smallnorb-cnn on azimuth@seed1, familiar error 79.95%. That run learned nothing, so "
        "no conclusion follows from its comparison or from a mean that includes it."
    )
    assert chance_line in readme.results_table(results).splitlines()
    assert f"<p>{chance_line}</p>" in report.render_html(results)
    page = report.render_html(results)
    table = page[page.index('<table id="viewpoints">') :]
    assert "15.00%" in table and "paper 13.50%" in table and "paper 20.00%" in table
    assert ": matched</td>" in table and "elevation: smallnorb is switched off" in page
    results_table = page[page.index('<table id="results">') : page.index("</table>")]
    assert "viewpoints" not in results_table  # the section is not a checkpoint row
    assert "| viewpoints |" not in readme.results_table(results)  # not a model row
    skipped = report.render_html({"lenet5": entry, "viewpoints": {"skipped": "not found"}})
    assert "Not run: not found" in skipped and '<table id="viewpoints">' not in skipped
    assert "Novel viewpoints" not in report.render_html({"lenet5": entry})
    lines = evaluation.summary_lines(results)
    assert lines[0].split() == ["checkpoint", "model", "mnist"] and len(lines[1].split()) == 3
    assert any("azimuth" in line and "(0.135)" in line for line in lines)
    assert any(line.split()[:2] == ["azimuth@seed1", "capsules"] for line in lines)
    assert any("Azimuth, over 2 seeds" in ln and "0.0500 ± 0.0141 familiar" in ln for ln in lines)
    assert any("elevation: skipped" in line for line in lines)


@pytest.mark.slow
def test_dvc_repro_viewpoints_with_smallnorb_off(tmp_path, repo_root):
    """The `viewpoints` stage of dvc.yaml (with its smallNORB data stages) succeeds with
    smallNORB switched off, writes the marked output, and is then up to date."""
    import os
    import shutil
    import subprocess

    import yaml

    bin_dir = Path(sys.executable).parent
    dvc = shutil.which("dvc", path=str(bin_dir))
    if dvc is None or shutil.which("capsnet", path=str(bin_dir)) is None:
        pytest.skip("dvc or the capsnet command is not installed")
    work = tmp_path / "repo"
    for package in ("capsnet", "pipeline"):  # the command lives in pipeline/
        shutil.copytree(
            repo_root / package, work / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    pipeline = yaml.safe_load((repo_root / "dvc.yaml").read_text())
    wanted = ("download_smallnorb", "prepare_smallnorb", "viewpoints")
    stages = {name: pipeline["stages"][name] for name in wanted}
    (work / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    values = yaml.safe_load((repo_root / "params.yaml").read_text())
    values["data"]["smallnorb"]["enabled"] = False  # on in params.yaml: switched off here
    (work / "params.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    env = {
        **os.environ,
        "DVC_NO_ANALYTICS": "1",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }

    def run(*args):
        result = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    run(dvc, "init", "--no-scm", "-q")
    first = run(dvc, "repro", "viewpoints")
    assert "Running stage 'viewpoints'" in first
    out = work / "models-viewpoints"
    assert "switched off" in json.loads((out / "viewpoints.json").read_text())["disabled"]
    assert (out / "DISABLED.txt").is_file() and (work / "models-viewpoints.csv").is_file()
    assert "up to date" in run(dvc, "repro", "viewpoints")
