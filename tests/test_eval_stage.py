"""The evaluation stage: schema, agreement with training, MultiMNIST scoring, the CLI."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json

import pytest
import torch
from click.testing import CliRunner
from clihelpers import assert_one_line_error, invoke_cli, run_cli

from capsnet import evaluation, models
from capsnet.cli import main
from capsnet.config import EvaluateParams
from capsnet.evaluation.results import parse_results
from capsnet.models import checkpoint
from capsnet.training.scoring import multimnist_scores


def request(data_root, robustness=None, equivariance=None, **fields) -> evaluation.EvalRequest:
    """An EvalRequest with robustness and equivariance off unless their fields are given."""
    base = EvaluateParams(**fields)
    params = dataclasses.replace(
        base,
        robustness=dataclasses.replace(base.robustness, **{"enabled": False, **(robustness or {})}),
        equivariance=dataclasses.replace(
            base.equivariance, **{"enabled": False, **(equivariance or {})}
        ),
    )
    return evaluation.EvalRequest(params, data_root=data_root)


def mnist_test_set(root, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` MNIST test images (n, 1, 28, 28) uint8 and labels (n,), read straight
    from the raw IDX files."""
    raw = root / "raw" / "mnist"
    with gzip.open(raw / "t10k-images-idx3-ubyte.gz") as fh:
        images = bytearray(fh.read())[16 : 16 + n * 28 * 28]
    with gzip.open(raw / "t10k-labels-idx1-ubyte.gz") as fh:
        labels = bytearray(fh.read())[8 : 8 + n]
    images = torch.frombuffer(images, dtype=torch.uint8).reshape(n, 1, 28, 28)  # (n, 1, 28, 28)
    return images, torch.frombuffer(labels, dtype=torch.uint8).long()  # (n,)


@torch.no_grad()
def direct_accuracy(path, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Accuracy of the checkpoint at ``path`` on uint8 images, computed in one batch under
    the precision policy evaluation runs in (bf16 autocast on a CPU with native bf16)."""
    from capsnet.training.device import autocast

    model, _ = checkpoint.load(path)
    with torch.no_grad(), autocast(torch.device("cpu")):
        scores = model(images.float() / 255).scores.float()  # (n, classes)
    return (scores.argmax(dim=1) == labels).float().mean().item()


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """{name: checkpoint path}: untrained 28x28 lenet5 and capsnet-small, a 36x36
    capsnet-small (MultiMNIST) and a 40x40 lenet5 (affNIST, expanded MNIST)."""
    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    specs = {
        "lenet5": ("lenet5", {}),
        "capsnet-small": ("capsnet-small", {}),
        "caps36": ("capsnet-small", {"input_size": 36}),
        "lenet40": ("lenet5", {"input_size": 40}),
    }
    return {
        name: checkpoint.save(root / f"{name}.pt", models.build(model, **overrides))
        for name, (model, overrides) in specs.items()
    }


def test_multimnist_scoring_hand_built_cases():
    scores = torch.tensor(
        [
            [0.9, 0.8, 0.1, 0.0],  # true {0, 1}: both are the two highest
            [0.9, 0.1, 0.8, 0.0],  # true {0, 1}: one of them
            [0.1, 0.2, 0.9, 0.8],  # true {0, 1}: none
        ]
    )
    targets = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.float32)
    result = multimnist_scores(scores, targets)
    assert result["n"] == 3
    assert result["strict_accuracy"] == pytest.approx(1 / 3)
    assert result["at_least_one"] == pytest.approx(2 / 3)
    assert result["half_credit"] == pytest.approx((1 + 0.5 + 0) / 3)
    alone = {
        k: multimnist_scores(scores[i : i + 1], targets[i : i + 1])
        for k, i in (("both", 0), ("one", 1), ("none", 2))
    }
    assert [alone[k]["strict_accuracy"] for k in ("both", "one", "none")] == [1.0, 0.0, 0.0]
    assert [alone[k]["half_credit"] for k in ("both", "one", "none")] == [1.0, 0.5, 0.0]


def test_training_checkpoint_reproduces_training_accuracy(tmp_path, mnist_root):
    from capsnet.cli import main

    out = tmp_path / "run"
    result = CliRunner().invoke(
        main,
        [
            "train",
            "--model",
            "lenet5",
            "--train-limit",
            "300",
            "--val-size",
            "100",
            "--test-limit",
            "200",
            "--epochs",
            "4",
            "--batch-size",
            "25",
            "--data-root",
            str(mnist_root),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    trained = json.loads((out / "metrics.json").read_text())["mnist"]
    assert trained["n"] == 200
    asked = request(mnist_root, datasets=("mnist",), angles=(0, 35), limit=200)
    results = evaluation.evaluate_checkpoints([out / "model.pt"], asked).to_dict()
    assert set(results) == {"run"}
    assert results["run"]["mnist"] == trained
    assert trained["accuracy"] > 0.2  # it learned something in a few short epochs


def test_rotated_mnist_at_zero_equals_mnist(untrained, mnist_root):
    asked = request(mnist_root, datasets=("mnist", "rotated-mnist"), angles=(0, 90), limit=64)
    paths = [untrained["lenet5"], untrained["capsnet-small"]]
    results = evaluation.evaluate_checkpoints(paths, asked).to_dict()
    for entry in results.values():
        assert entry["rotated-mnist"]["accuracy"]["0"] == entry["mnist"]["accuracy"]
        assert entry["rotated-mnist"]["n"] == entry["mnist"]["n"] == 64


def test_json_schema_skips_and_outputs(untrained, mnist_root, tmp_path):
    # smallnorb is left out: asked for by name without data it is an error
    # (tests/faults/test_fault_files.py::test_a_dataset_asked_for_without_data_is_an_error)
    datasets = ["mnist", "rotated-mnist", "affnist", "expanded-mnist", "multimnist"]
    asked = request(
        mnist_root,
        robustness={"enabled": True, "epsilons": (0.1,), "bim_steps": 2, "limit": 8},
        equivariance={"enabled": True, "angles": (-30, 0, 30), "limit": 4},
        datasets=tuple(datasets),
        angles=(0, 35),
        limit=16,
        figure_examples=3,
    )
    drawer = evaluation.FigureDrawer(tmp_path / "eval" / "figures")
    typed = evaluation.evaluate_checkpoints(list(untrained.values()), asked, figures=drawer)
    results = typed.to_dict()  # as metrics.json holds it
    assert set(results) == set(untrained)
    for name, entry in results.items():
        assert entry["checkpoint"] == str(untrained[name])
        assert set(entry) == {"model", "checkpoint", *datasets, "robustness", "equivariance"}

    small = results["capsnet-small"]
    assert small["mnist"]["n"] == 16 and 0 <= small["mnist"]["accuracy"] <= 1
    assert set(small["rotated-mnist"]["accuracy"]) == {"0", "35"}
    assert small["affnist"] == {"skipped": "images are 40x40, the model takes 28x28"}
    assert "36x36" in small["multimnist"]["skipped"]
    assert set(small["robustness"]["fgsm"]) == {"0.1"} and small["robustness"]["n"] == 8
    assert len(small["equivariance"]["dim_correlation"]) == 16
    assert "no capsule poses" in results["lenet5"]["equivariance"]["skipped"]

    multi = results["caps36"]["multimnist"]
    assert set(multi) == {"strict_accuracy", "at_least_one", "half_credit", "n"}
    assert multi["n"] == 16
    assert multi["strict_accuracy"] <= multi["half_credit"] <= multi["at_least_one"]
    assert "28x28" in results["caps36"]["mnist"]["skipped"]

    wide = results["lenet40"]
    assert wide["affnist"]["source"] == "affnist-synth"  # no real affNIST under mnist_root
    assert wide["affnist"]["n"] == 16 and wide["expanded-mnist"]["n"] == 16

    written = evaluation.write_outputs(typed, tmp_path / "eval")
    assert set(written) == {"metrics", "rotation_csv", "summary"}
    figures = {p.name for p in (tmp_path / "eval" / "figures").glob("*.png")}
    assert {
        "rotation.png",
        "reconstructions.png",
        "equivariance.png",
        "confusion-lenet5.png",
        "confusion-capsnet-small.png",
        "multimnist-caps36.png",
    } <= figures
    assert {p.name for p in drawer.written.values()} == figures
    # the perturbation grid exists exactly when some pose dimension visibly changes
    from capsnet.evaluation import plots as draw

    model, _ = checkpoint.load(untrained["capsnet-small"])
    images, labels = mnist_test_set(mnist_root, 1)
    with torch.no_grad():
        rows = draw.perturbation_rows(model, images[0].float() / 255, int(labels[0]))
    shown = "perturbation-capsnet-small.png" in figures
    assert shown == bool(draw.visible_rows(rows)), draw.visible_rows(rows)
    for name in figures:
        assert (tmp_path / "eval" / "figures" / name).read_bytes()[:4] == b"\x89PNG"
    assert not list((tmp_path / "eval").rglob(".*"))  # no temporary files left behind


def test_written_metrics_match_accuracy_computed_from_the_models(untrained, mnist_root, tmp_path):
    """metrics.json and rotation.csv hold the accuracy of each model on the same images,
    computed here directly from the raw IDX files and the models."""
    from capsnet.data.datasets import rotate_images

    paths = [untrained["lenet5"], untrained["capsnet-small"]]
    asked = request(mnist_root, datasets=("mnist", "rotated-mnist"), angles=(0, 35), limit=50)
    evaluation.write_outputs(evaluation.evaluate_checkpoints(paths, asked), tmp_path)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    with open(tmp_path / "rotation.csv", newline="") as fh:
        rows = {(r["model"], r["angle"]): float(r["accuracy"]) for r in csv.DictReader(fh)}
    images, labels = mnist_test_set(mnist_root, 50)
    tilted = rotate_images(images, 35.0)  # (50, 1, 28, 28)
    assert set(rows) == {(m, a) for m in ("lenet5", "capsnet-small") for a in ("0", "35")}
    for name, path in zip(("lenet5", "capsnet-small"), paths):
        upright_acc = direct_accuracy(path, images, labels)
        tilted_acc = direct_accuracy(path, tilted, labels)
        assert metrics[name]["model"] == name
        assert metrics[name]["mnist"] == {"accuracy": pytest.approx(upright_acc), "n": 50}
        sweep = metrics[name]["rotated-mnist"]
        assert sweep["n"] == 50
        assert sweep["accuracy"] == {
            "0": pytest.approx(upright_acc),
            "35": pytest.approx(tilted_acc),
        }
        assert rows[(name, "0")] == pytest.approx(upright_acc, abs=1e-6)
        assert rows[(name, "35")] == pytest.approx(tilted_acc, abs=1e-6)


def test_metrics_json_writes_nan_as_null(tmp_path):
    results = {"m": {"model": "lenet5", "checkpoint": "m.pt",
                     "mnist": {"accuracy": float("nan"), "n": 0}}}  # fmt: skip
    evaluation.write_outputs(results, tmp_path)
    assert json.loads((tmp_path / "metrics.json").read_text())["m"]["mnist"] == {
        "accuracy": None,
        "n": 0,
    }
    assert (tmp_path / "rotation.csv").read_text() == "angle,model,accuracy,std,group,kind\n"


def test_seed_checkpoints_are_reported_with_mean_and_std():
    def entry(path, acc, rot):
        return {
            "model": "capsnet-small",
            "checkpoint": path,
            "mnist": {"accuracy": acc, "n": 100},
            "rotated-mnist": {"n": 100, "accuracy": {"0": acc, "35": rot}},
            "affnist": {"skipped": "images are 40x40, the model takes 28x28"},
        }

    results = {"s0": entry("s0/model.pt", 0.9, 0.6), "s1": entry("s1/model.pt", 0.8, 0.4)}
    results = parse_results(results).entries
    agg = evaluation.aggregate_seeds(results)["capsnet-small"].to_dict()
    assert agg["seeds"] == 2 and agg["checkpoints"] == ["s0/model.pt", "s1/model.pt"]
    assert agg["mnist"] == {"accuracy": pytest.approx(0.85), "n": 100}
    assert agg["rotated-mnist"]["accuracy"]["35"] == pytest.approx(0.5)
    assert agg["std"]["mnist"]["accuracy"] == pytest.approx(0.0707107, rel=1e-4)
    assert agg["affnist"] == {"skipped": "images are 40x40, the model takes 28x28"}
    assert agg["names"] == ["s0", "s1"]
    assert evaluation.aggregate_seeds({"s0": results["s0"]}) == {}


def test_seed_means_are_named_after_their_first_checkpoint_when_the_model_name_is_taken():
    def entry(name, acc):
        return {"model": "lenet5", "checkpoint": f"{name}.pt", "mnist": {"accuracy": acc}}

    runs = {  # name: (experiment, seed, accuracy), in the order the stage lists the files
        "lenet5": ("equal", 0, 0.9),
        "lenet5@equal-time-seed1": ("time", 1, 0.7),
        "lenet5@equal-time": ("time", 0, 0.8),
        "lenet5@seed1": ("equal", 1, 0.6),
    }
    results = parse_results({name: entry(name, acc) for name, (_, _, acc) in runs.items()}).entries
    experiments = {name: key for name, (key, _, _) in runs.items()}
    seeds = {name: seed for name, (_, seed, _) in runs.items()}
    means = {
        n: e.to_dict() for n, e in evaluation.aggregate_seeds(results, experiments, seeds).items()
    }
    assert list(means) == ["lenet5 (mean)", "lenet5@equal-time (mean)"]
    assert means["lenet5 (mean)"]["names"] == ["lenet5", "lenet5@seed1"]
    timed = means["lenet5@equal-time (mean)"]
    assert timed["names"] == ["lenet5@equal-time", "lenet5@equal-time-seed1"]
    assert timed["checkpoints"] == ["lenet5@equal-time.pt", "lenet5@equal-time-seed1.pt"]
    assert timed["mnist"]["accuracy"] == pytest.approx(0.75)
    assert timed["std"]["mnist"]["accuracy"] == pytest.approx(0.0707107, rel=1e-4)


def test_a_seed_at_chance_on_its_own_set_is_a_failed_run_left_out_of_the_mean():
    def entry(name, own, other):  # smallNORB: 5 classes, chance 20%; mnist: 10%
        return {"model": "smallnorb-cnn", "checkpoint": f"{name}.pt",
                "smallnorb": {"accuracy": own}, "mnist": {"accuracy": other}}  # fmt: skip

    runs = {"cnn": (0.6, 0.5), "cnn@seed1": (0.2015, 0.5), "cnn@seed2": (0.7, 0.05)}
    results = parse_results({n: entry(n, *acc) for n, acc in runs.items()}).entries
    seeds = {"cnn": 0, "cnn@seed1": 1, "cnn@seed2": 2}
    own = dict.fromkeys(runs, "smallnorb")
    mean = evaluation.aggregate_seeds(results, None, seeds, own)["smallnorb-cnn"].to_dict()
    assert mean["failed"] == ["cnn@seed1"] and mean["names"] == ["cnn", "cnn@seed2"]
    assert mean["seeds"] == 2 and mean["smallnorb"]["accuracy"] == pytest.approx(0.65)
    assert mean["std"]["smallnorb"]["accuracy"] == pytest.approx(0.0707107, rel=1e-4)
    back = parse_results({**{n: entry(n, *acc) for n, acc in runs.items()}, "m": mean})
    assert back.entries["m"].failed == ("cnn@seed1",)  # read back from metrics.json
    # judged on the own set: on mnist (chance 10%) seed2 failed while the others learned
    kept = evaluation.aggregate_seeds(results, None, seeds, dict.fromkeys(runs, "mnist"))
    assert kept["smallnorb-cnn"].failed == ("cnn@seed2",)
    everyone = evaluation.aggregate_seeds(results, None, seeds)  # no own set known
    assert everyone["smallnorb-cnn"].seeds == 3 and not everyone["smallnorb-cnn"].failed
    # no seed learned (all below 2x chance): none is singled out, all stay in the mean
    weak = {n: entry(n, 0.22 + i / 100, 0.5) for i, n in enumerate(runs)}
    weak_mean = evaluation.aggregate_seeds(parse_results(weak).entries, None, seeds, own)
    assert weak_mean["smallnorb-cnn"].seeds == 3 and not weak_mean["smallnorb-cnn"].failed


def test_own_set_is_the_recorded_dataset_else_the_run_default():
    from capsnet.evaluation.seeds import own_set

    assert own_set({"extra": {"dataset": "smallnorb"}}) == "smallnorb"
    assert own_set({"metrics": {"dataset": "multimnist"}, "extra": {}}) == "multimnist"
    assert own_set({"metrics": {}}) == "mnist"  # the default training set


def trained_meta(seed: int, epochs: int, **data) -> dict:
    """Checkpoint metadata of a lenet5 run: its TrainConfig and training data."""
    from capsnet.config.training import TrainConfig

    return {
        "model_name": "lenet5",
        "model_config": dataclasses.asdict(models.build("lenet5").config),
        "train_config": TrainConfig(epochs=epochs, seed=seed).to_dict(),
        "metrics": {"dataset": "mnist", "augment": "shift", "train_images": 100, **data},
    }


def test_experiment_key_ignores_only_the_seed():
    from capsnet.evaluation.seeds import experiment_key

    base = experiment_key(trained_meta(seed=0, epochs=6))
    assert experiment_key(trained_meta(seed=1, epochs=6)) == base
    progress = trained_meta(seed=2, epochs=6)
    progress["train_config"]["progress"] = True
    assert experiment_key(progress) == base
    assert experiment_key(trained_meta(seed=0, epochs=60)) != base
    assert experiment_key(trained_meta(seed=1, epochs=6, augment="none")) != base
    assert experiment_key(trained_meta(seed=1, epochs=6, train_images=200)) != base
    wider = trained_meta(seed=1, epochs=6)
    wider["model_config"]["input_size"] = 40
    assert experiment_key(wider) != base
    arms = []
    for seed, arm in ((0, "equal_augmentation"), (1, "equal_augmentation"), (0, "equal_time")):
        compared = trained_meta(seed=seed, epochs=6)
        compared["extra"] = {"comparison": {"arm": arm, "label": "lenet5", "reference": "c"}}
        arms.append(experiment_key(compared))
    assert arms[0] == arms[1] != arms[2] and base not in arms


def test_eval_groups_checkpoints_differing_only_in_seed(mnist_root, tmp_path):
    runs = {"a": (0, 6), "b": (1, 6), "long": (2, 60)}
    paths = []
    for name, (seed, epochs) in runs.items():
        meta = trained_meta(seed, epochs)
        torch.manual_seed(seed)
        paths.append(
            checkpoint.save(
                tmp_path / f"{name}.pt",
                models.build("lenet5"),
                train_config=meta["train_config"],
                metrics=meta["metrics"],
            )
        )
    asked = request(mnist_root, datasets=("mnist",), limit=20)
    results = evaluation.evaluate_checkpoints(paths, asked, names=list(runs)).to_dict()
    means = {k: v for k, v in results.items() if "checkpoint" not in v}
    assert list(means) == ["lenet5"]
    grouped = means["lenet5"]
    assert grouped["seeds"] == 2 and grouped["names"] == ["a", "b"]
    assert grouped["checkpoints"] == [str(paths[0]), str(paths[1])]
    accuracies = [results[n]["mnist"]["accuracy"] for n in ("a", "b")]
    assert grouped["mnist"]["accuracy"] == pytest.approx(sum(accuracies) / 2)


def test_cli_missing_truncated_and_foreign_checkpoints(tmp_path):
    assert_one_line_error(run_cli("eval", str(tmp_path / "none.pt")), "none.pt", "not found")
    path = checkpoint.save(tmp_path / "t.pt", models.build("lenet5"))
    path.write_bytes(path.read_bytes()[:100])
    assert_one_line_error(invoke_cli("eval", str(path)), "t.pt", "truncated")
    foreign = tmp_path / "notes.pt"
    foreign.write_text("hello")
    assert_one_line_error(invoke_cli("eval", str(foreign)), "notes.pt")
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    assert_one_line_error(invoke_cli("eval", str(other)), "other.pt", "not a capsnet checkpoint")


def test_cli_bad_options(untrained, tmp_path):
    path = str(untrained["lenet5"])
    assert_one_line_error(run_cli("eval", path, "--dataset", "cifar"), "--dataset")
    assert_one_line_error(invoke_cli("eval", path, "--epsilons", "0.1,2"), "--epsilons")
    assert_one_line_error(invoke_cli("eval", path, "--out", str(tmp_path)), "--out")


def test_evaluate_stage_from_params(untrained, mnist_root, tmp_path):
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    (models_dir / "lenet5.pt").write_bytes(untrained["lenet5"].read_bytes())
    params = tmp_path / "params.yaml"
    params.write_text(
        "evaluate:\n"
        f"  models_dir: {models_dir}\n"
        f"  out_dir: {tmp_path / 'eval'}\n"
        "  datasets: [mnist, rotated-mnist]\n"
        "  angles: [0, 35]\n"
        "  limit: 30\n"
        "  robustness: {enabled: false}\n"
        "  equivariance: {enabled: false}\n"
    )
    result = CliRunner().invoke(
        main, ["evaluate-stage", "--params", str(params), "--data-root", str(mnist_root)]
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["lenet5"]["mnist"]["n"] == 30
    assert (
        (tmp_path / "eval" / "rotation.csv")
        .read_text()
        .startswith("angle,model,accuracy,std,group,kind\n")
    )
    assert (tmp_path / "eval" / "figures" / "confusion-lenet5.png").is_file()

    params.write_text("evaluate:\n  datasets: [mnist, cifar]\n")
    assert_one_line_error(
        run_cli("evaluate-stage", "--params", str(params)), "evaluate.datasets", "cifar"
    )


def test_device_auto_is_the_default_and_picks_what_training_would(untrained, tmp_path):
    from capsnet.io.errors import ConfigError
    from capsnet.training.device import select_device

    assert EvaluateParams().device == "auto"
    assert evaluation.EvalRequest(EvaluateParams(device="auto")).device == select_device("auto")
    assert evaluation.EvalRequest(EvaluateParams(device="cpu")).device == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^evaluate\.device cuda: CUDA is not available"):
            _ = evaluation.EvalRequest(EvaluateParams(device="cuda")).device
        models_dir = tmp_path / "models"
        models_dir.mkdir()
        (models_dir / "lenet5.pt").write_bytes(untrained["lenet5"].read_bytes())
        params = tmp_path / "params.yaml"
        params.write_text(f"evaluate:\n  models_dir: {models_dir}\n  device: cuda\n"
                          f"  out_dir: {tmp_path / 'eval'}\n")  # fmt: skip
        assert_one_line_error(
            run_cli("evaluate-stage", "--params", str(params)), "evaluate.device", "CUDA"
        )
    from capsnet.config import from_dict

    with pytest.raises(ConfigError, match=r"^params: evaluate\.device: must name a device"):
        from_dict(EvaluateParams, {"device": ""}, prefix="evaluate")


def test_cli_defaults_come_from_the_evaluate_section(untrained, mnist_root, tmp_path):
    """`capsnet eval` reads its limits from params.yaml's evaluate section, as the evaluate
    stage does, so its numbers match eval/metrics.json; a flag still overrides; the
    summary says why a cell is skipped."""
    params = tmp_path / "params.yaml"
    params.write_text("evaluate:\n  limit: 24\n  angles: [0, 35]\n")
    path = str(untrained["lenet5"])
    common = ["eval", path, "--dataset", "rotated-mnist", "--dataset", "affnist-synth"]
    args = [*common, "--data-root", str(mnist_root), "--params", str(params)]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a.json")])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "a.json").read_text())["lenet5"]
    assert written["rotated-mnist"]["n"] == 24
    assert set(written["rotated-mnist"]["accuracy"]) == {"0", "35"}
    assert "skipped: images are 40x40, the model takes 28x28 (lenet5/affnist-synth)" in (
        result.output
    )
    again = CliRunner().invoke(main, [*args, "--limit", "12", "--out", str(tmp_path / "b.json")])
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "b.json").read_text())["lenet5"]["rotated-mnist"]["n"] == 12


def test_cli_says_how_many_images_it_scored_and_which_set_is_a_stand_in(
    untrained, mnist_root, tmp_path
):
    """No real affNIST under the data root: `capsnet eval --dataset affnist` scores the
    stand-in and says so, with the number of images behind each set's numbers."""
    args = ["eval", str(untrained["lenet40"]), str(untrained["lenet5"]), "--dataset", "affnist",
            "--dataset", "mnist", "--limit", "8", "--data-root", str(mnist_root)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("scored on: ")]
    assert "affnist 8 images (affnist-synth: the synthetic stand-in for affnist)" in line
    assert "mnist 8 images" in line


def test_cli_counts_each_checkpoint_once_and_replaces_the_figures_folder(
    untrained, mnist_root, tmp_path
):
    path = untrained["lenet5"]
    same = path.parent / ".." / path.parent.name / path.name  # another spelling of one file
    assert_one_line_error(
        run_cli("eval", str(path), str(same)), str(same), "each checkpoint counts once"
    )
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "confusion-old.png").write_bytes(b"an earlier run's figure")
    args = ["eval", str(path), "--data-root", str(mnist_root), "--limit", "16"]
    result = CliRunner().invoke(main, [*args, "--figures", str(figures)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in figures.iterdir()) == ["confusion-lenet5.png"]
    (figures / "notes.txt").write_text("mine")
    assert_one_line_error(
        invoke_cli(*args, "--figures", str(figures)), "--figures", "does not write (notes.txt)"
    )
    assert (figures / "notes.txt").read_text() == "mine"


def test_cli_scores_smallnorb_as_the_params_file_says(tmp_path, monkeypatch):
    """`capsnet eval --params` takes data.smallnorb's crop and standardisation, as the
    evaluate stage does, so a smallNORB model is scored on the images it was trained on."""
    seen = {}

    def capture(paths, request, figures=None):
        seen["smallnorb"] = request.settings("smallnorb")
        return {}

    monkeypatch.setattr(evaluation, "evaluate_checkpoints", capture)
    params = tmp_path / "params.yaml"
    params.write_text("data:\n  smallnorb:\n    crop: 40\n    standardize: false\n")
    path = tmp_path / "m.pt"
    path.write_bytes(b"")
    args = ["eval", str(path), "--dataset", "smallnorb", "--params", str(params)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert (seen["smallnorb"].crop, seen["smallnorb"].standardize) == (40, False)


def test_place_compiles_the_em_routing_only_when_asked():
    """evaluate.compile compiles an EM model's routing (EMCapsNet.compile_routing) and
    leaves every other model eager."""
    em, capsules = models.build("em-capsnet-small"), models.build("capsnet-small")
    assert EvaluateParams().compile is False
    for asked in (True, False):
        placing = evaluation.EvalRequest(EvaluateParams(device="cpu", compile=asked))
        assert placing.place(em) is em and placing.place(capsules) is capsules
        assert (em.caps1.compiled, em.caps2.compiled) == (asked, asked)
        assert capsules._compiled_call_impl is None  # CapsNet's compile wraps the forward


@pytest.mark.parametrize(
    ("flag", "section", "expected"),
    [(None, "true", True), (None, "false", False), ("--no-compile", "true", False),
     ("--compile", "false", True)],
)  # fmt: skip
def test_cli_compiles_em_checkpoints_as_flag_or_section_says(
    flag, section, expected, mnist_root, tmp_path, monkeypatch
):
    """`capsnet eval` asks each EM checkpoint for compiled routing as --compile/--no-compile
    says, else as evaluate.compile of the params file (the switch itself is recorded, not
    compiled: compiled and eager routing agree in tests/test_em.py)."""
    from capsnet.models.em import EMCapsNet

    asked = []
    monkeypatch.setattr(EMCapsNet, "compile_routing", lambda self, on=True: asked.append(on))
    path = checkpoint.save(tmp_path / "em.pt", models.build("em-capsnet-small"))
    params = tmp_path / "params.yaml"
    params.write_text(f"evaluate:\n  compile: {section}\n")
    args = ["eval", path, "--data-root", mnist_root, "--limit", "4", "--params", params]
    result = invoke_cli(*args, *([flag] if flag else []))
    assert result.returncode == 0, result.stderr
    assert asked == [expected]


def test_a_non_boolean_compile_setting_is_one_line_naming_it_and_writes_nothing(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("evaluate:\n  compile: maybe\n")
    out = tmp_path / "out.json"
    result = invoke_cli("eval", tmp_path / "none.pt", "--params", params, "--out", out)
    assert_one_line_error(result, "evaluate.compile", "expected true or false, got 'maybe'")
    assert not out.exists()


def test_the_stage_log_shows_the_headline_angles_within_its_width():
    from capsnet.evaluation.outputs import LOG_WIDTH, fit_width, summary_lines

    sweep = {str(a): 0.5 for a in range(-90, 181, 15)}  # 19 angles
    results = {"m": {"model": "lenet5", "checkpoint": "m.pt", "mnist": {"accuracy": 0.9},
                     "rotated-mnist": {"accuracy": sweep, "n": 10}}}  # fmt: skip
    full, compact = summary_lines(results), summary_lines(results, ("35", "0"))
    assert "-90°" in full[0] and full[0].split()[3:] == [f"{a}°" for a in sweep]
    assert compact[0].split() == ["checkpoint", "model", "mnist", "0°"]  # 35 not evaluated
    long = "word " * 60
    wrapped = fit_width(["short", long.strip()])
    assert wrapped[0] == "short" and all(len(line) <= LOG_WIDTH for line in wrapped)
    assert " ".join(w.strip() for w in wrapped[1:]) == long.strip()
