"""The probes table (capsnet/evaluation/probes.py): a metric is its function and its entry
there, its field in the evaluate settings, its name in the probe set's dataset spec and its
test. A toy probe, registered here and
named by no other file, reaches metrics.json and the report."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from capsnet import evaluation, models
from capsnet.config import EvaluateParams
from capsnet.evaluation import probes
from capsnet.evaluation.outputs import summary_lines
from capsnet.models import checkpoint
from pipeline.publish import report

ROOT = Path(__file__).resolve().parents[1]
TOY = "toy-confidence"


@dataclass(frozen=True)
class ToyParams:
    """The toy probe's settings, as its evaluate field would declare them."""

    enabled: bool = True
    limit: int | None = 12


@dataclass(frozen=True)
class ToyEvaluateParams(EvaluateParams):
    """The evaluate section with the toy probe's field (config/evaluate.py's one edit)."""

    toy_confidence: ToyParams = field(default_factory=ToyParams)


def toy_confidence(model, dataset, settings, request) -> dict:
    """The mean top class score of the model on the probe images."""
    images = dataset.tensors[0].float().div(255).to(request.device)  # (N, 1, 28, 28)
    with torch.no_grad():
        scores = model.eval()(images).scores  # (N, K)
    return {"confidence": scores.max(dim=1).values.mean().item(), "n": int(images.shape[0])}


def toy_table(results) -> probes.ProbeTable | None:
    rows = tuple(
        (name, (e.block("toy_confidence").get("confidence"),))
        for name, e in results.checkpoints().items()
        if "confidence" in e.block("toy_confidence")
    )
    return probes.ProbeTable("toy", "Toy confidence", "Mean top score.", ("top score",), rows)


@pytest.fixture
def toy_probe(monkeypatch):
    """The toy's entry in the table, and its name in MNIST's spec (dataset_specs.py's one
    edit: the set it runs on)."""
    from capsnet.config import dataset_specs

    monkeypatch.setitem(probes.PROBES, "toy_confidence", probes.Probe(toy_confidence, toy_table))
    mnist = dataset_specs.REGISTRY["mnist"]
    listed = dataclasses.replace(mnist, probes=(*mnist.probes, "toy_confidence"))
    monkeypatch.setitem(dataset_specs.REGISTRY, "mnist", listed)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """An untrained lenet5 for 28x28 images and one for 40x40 (the probe set does not fit)."""
    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    return [
        checkpoint.save(root / "lenet5.pt", models.build("lenet5")),
        checkpoint.save(root / "lenet40.pt", models.build("lenet5", input_size=40)),
    ]


def _request(mnist_root, params_cls=ToyEvaluateParams, **probes_on) -> evaluation.EvalRequest:
    base = params_cls(datasets=("mnist",), limit=16, device="cpu")
    params = dataclasses.replace(
        base,
        robustness=dataclasses.replace(base.robustness, enabled=probes_on.get("robustness", False)),
        equivariance=dataclasses.replace(base.equivariance, enabled=False),
    )
    return evaluation.EvalRequest(params, data_root=mnist_root)


def test_a_toy_probe_reaches_metrics_json_and_the_report(
    toy_probe, checkpoints, mnist_root, tmp_path
):
    results = evaluation.evaluate_checkpoints(checkpoints, _request(mnist_root))
    evaluation.write_outputs(results, tmp_path)
    written = json.loads((tmp_path / "metrics.json").read_text())

    model, _ = checkpoint.load(checkpoints[0])
    from capsnet.evaluation.datasets import TestSets

    images, _ = TestSets(_request(mnist_root)).get("mnist")[0].subset(12).tensors
    with torch.no_grad():
        expected = model.eval()(images.float() / 255).scores.max(dim=1).values.mean().item()
    block = written["lenet5"]["toy_confidence"]
    assert block["n"] == 12 and block["confidence"] == pytest.approx(expected, abs=1e-6)
    assert list(written["lenet5"]) == ["model", "checkpoint", "mnist", "toy_confidence"]
    assert written["lenet40"]["toy_confidence"] == {
        "skipped": "MNIST does not fit: images are 28x28, the model takes 40x40"
    }

    page = report.render_html(written)
    assert '<h2>Toy confidence</h2><p>Mean top score.</p><table id="toy">' in page
    assert f"<tr><td>lenet5</td><td>{100 * block['confidence']:.2f}%</td></tr>" in page
    assert "toy_confidence" not in summary_lines(results)[0]  # a probe is no results column

    named = [
        p.relative_to(ROOT).as_posix()
        for package in ("capsnet", "pipeline")
        for p in (ROOT / package).rglob("*.py")
        if "toy_confidence" in p.read_text() or TOY in p.read_text()
    ]
    assert named == []  # this test is the only file that knows the toy


def test_a_probe_switched_off_writes_no_block(toy_probe, checkpoints, mnist_root):
    request = _request(mnist_root)
    off = dataclasses.replace(request.params, toy_confidence=ToyParams(enabled=False))
    results = evaluation.evaluate_checkpoints(
        checkpoints[:1], dataclasses.replace(request, params=off)
    )
    assert "toy_confidence" not in results.to_dict()["lenet5"]


def test_a_probe_without_its_evaluate_field_is_an_error(toy_probe, checkpoints, mnist_root):
    with pytest.raises(AttributeError, match="toy_confidence"):
        evaluation.evaluate_checkpoints(checkpoints[:1], _request(mnist_root, EvaluateParams))


def test_each_probe_runs_on_the_set_whose_spec_lists_it(monkeypatch):
    import dataclasses as dc

    from capsnet.config import dataset_specs

    assert probes.probe_set("robustness") == probes.probe_set("equivariance") == "mnist"
    assert probes.probe_set("toy_confidence") is None  # no dataset lists it
    toyed = dc.replace(dataset_specs.REGISTRY["multimnist"], probes=("toy_confidence",))
    monkeypatch.setitem(dataset_specs.REGISTRY, "multimnist", toyed)
    assert probes.probe_set("toy_confidence") == "multimnist"
    assert list(probes.PROBES) == ["robustness", "equivariance"]
    fields = {f.name for f in dataclasses.fields(EvaluateParams)}
    assert set(probes.PROBES) <= fields  # each probe's settings: its evaluate field


def test_the_robustness_table_renders_each_attack_and_epsilon():
    from capsnet.evaluation.results import parse_results

    results = parse_results(
        {
            "a": {"model": "lenet5", "checkpoint": "a.pt", "robustness": {
                "attack": "untargeted L-inf", "fgsm": {"0.1": 0.5, "0.05": 0.75},
                "bim": {"0.1": 0.25, "0.05": 0.5}, "n": 4}},
            "b": {"model": "lenet5", "checkpoint": "b.pt", "robustness": {"skipped": "off"}},
        }
    )  # fmt: skip
    table = probes.robustness_table(results)
    assert table.columns == ("FGSM ε=0.05", "FGSM ε=0.1", "BIM ε=0.05", "BIM ε=0.1")
    assert table.rows == (("a", (0.75, 0.5, 0.5, 0.25)),)
    assert "MNIST test images" in table.note
    assert probes.robustness_table(parse_results({"b": results.entries["b"]})) is None
