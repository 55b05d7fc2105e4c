"""The published numbers (pipeline/paper.py) match on the family a model is registered
with (``capsnet.models.register(..., family=...)``), never on its name."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from torch import nn

from capsnet import models
from capsnet.evaluation.results import ComparisonArm, ComparisonGroup, parse_results
from pipeline import paper
from pipeline.publish import comparison as comparison_text
from pipeline.publish import readme


@dataclass(frozen=True)
class ToyConfig:
    in_channels: int = 1
    input_size: int = 28
    num_classes: int = 10


@pytest.fixture
def toy_models(monkeypatch):
    """Two toy models whose names say nothing of their family: ``glimmer`` registered as
    a dynamic-routing capsule network, ``pebble`` as a LeNet5."""
    models.names()  # the project's own families first
    monkeypatch.setattr(models, "_REGISTRY", dict(models._REGISTRY))

    @models.register("glimmer", ToyConfig, capsules=True, family="capsnet")
    @models.register("pebble", ToyConfig, capsules=False, family="lenet5")
    class Toy(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config

    return Toy


def test_a_toy_model_gets_its_registered_family_s_paper_numbers(toy_models):
    assert paper.model_family("glimmer") == "capsnet" and paper.model_family("pebble") == "lenet5"
    mnist = paper.paper_number("mnist", "glimmer")
    assert (mnist.source, mnist.model, mnist.accuracy) == (paper.SABOUR, "CapsNet", 0.9975)
    rotated = paper.paper_number("rotated-mnist@35", "pebble")
    assert (rotated.source, rotated.model, rotated.accuracy) == (paper.ARTICLE, "LeNet5", 0.7605)
    assert paper.paper_number("smallnorb", "glimmer") is None  # nothing published for it
    assert not paper.is_baseline("glimmer") and paper.is_baseline("pebble")


def test_a_toy_model_s_readme_cell_and_comparison_role_follow_its_family(toy_models):
    results = parse_results(
        {
            "glimmer": {"model": "glimmer", "checkpoint": "g.pt", "mnist": {"accuracy": 0.99}},
            "pebble": {"model": "pebble", "checkpoint": "p.pt", "mnist": {"accuracy": 0.98}},
        }
    )
    assert readme._cell("mnist", "glimmer", results.entries["glimmer"]) == (
        "99.00% (Sabour 2017: 99.75%)"
    )
    assert readme._cell("mnist", "pebble", results.entries["pebble"]) == (
        "98.00% (DZone article: 98.68%)"
    )
    arm = ComparisonArm(
        "equal_augmentation",
        {
            label: ComparisonGroup(label, label, (label,), 1, "shift", 1, None, None, {}, {})
            for label in ("pebble", "glimmer")
        },
    )
    assert comparison_text._reference(arm) == "glimmer"  # the capsule network, by registration


def test_the_project_s_models_keep_their_published_numbers():
    assert paper.paper_number("smallnorb", "em-capsnet-small").source == paper.HINTON
    assert paper.paper_number("affnist", "baseline-cnn").model == "baseline CNN"
    assert paper.paper_number("smallnorb", "smallnorb-cnn").accuracy == 0.948
    assert paper.paper_number("multimnist", "capsnet-small").accuracy == 0.948
    assert paper.paper_number("mnist", "lenet5").source == paper.ARTICLE
    assert [m for m in models.names() if paper.is_baseline(m)] == [
        "baseline-cnn",
        "lenet5",
        "smallnorb-cnn",
    ]


def test_a_name_no_model_is_registered_under_has_no_family():
    assert paper.model_family("capsnet-retired") is None
    assert paper.paper_number("mnist", "capsnet-retired") is None
    assert paper.is_baseline("capsnet-retired") and paper.is_baseline(None)


def test_a_published_number_citing_an_unknown_source_is_a_one_line_error(monkeypatch):
    import dataclasses

    from capsnet.config import dataset_specs
    from capsnet.io.errors import ConfigError
    from pipeline import paper

    mnist = dataset_specs.REGISTRY["mnist"]
    typo = dataset_specs.Published("mnist", "capsnet", 0.99, "SABUOR", "CapsNet", "")
    listed = dataclasses.replace(mnist, published=(*mnist.published, typo))
    monkeypatch.setitem(dataset_specs.REGISTRY, "mnist", listed)
    with pytest.raises(ConfigError, match=r"mnist \(capsnet\) cites source 'SABUOR'") as info:
        paper.paper_numbers()
    assert "\n" not in str(info.value)
