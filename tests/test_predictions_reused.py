"""The evaluation stage scores a test set and draws its confusion matrix from one forward
pass per checkpoint (``capsnet.training.scoring.remembering_predictions``)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from capsnet import config, models
from capsnet.config.evaluate import EquivarianceParams, EvaluateParams, RobustnessParams
from capsnet.data import stages
from capsnet.data.tensors import TensorImageDataset
from capsnet.evaluation.checkpoints import evaluate_checkpoints
from capsnet.evaluation.figures import FigureDrawer
from capsnet.evaluation.request import EvalRequest
from capsnet.models import checkpoint
from capsnet.training import scoring

sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
from datahelpers import write_smallnorb_raw


class Counted(nn.Module):
    """A linear classifier on (B, 1, 4, 4) images that counts its forward calls."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 3)
        self.calls = 0

    def forward(self, images):
        self.calls += 1
        return models.ModelOutput(scores=self.linear(images.flatten(1)))  # (B, 3)


def _dataset(n: int, seed: int) -> TensorImageDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, 4, 4), dtype=torch.uint8, generator=generator)
    return TensorImageDataset(images, torch.arange(n) % 3)


def test_a_repeated_prediction_inside_the_block_is_computed_once():
    model, data, other = Counted().train(), _dataset(10, 0), _dataset(10, 0)
    first = scoring.predict(model, data, batch_size=4)
    assert model.calls == 3 and model.training  # 3 batches; the training flag restored
    with scoring.remembering_predictions():
        inside = scoring.predict(model, data, batch_size=4)
        again = scoring.predict(model, data, batch_size=4)
        assert model.calls == 6 and again is inside
        scoring.predict(model, other, batch_size=4)  # another dataset object: computed
        scoring.predict(model, data, batch_size=5)  # another batch size: computed
        assert model.calls == 11
    assert all(torch.equal(a, b) for a, b in zip(first, inside))
    scoring.predict(model, data, batch_size=4)  # outside the block: computed again
    assert model.calls == 14


def test_the_stage_draws_the_smallnorb_confusion_from_the_scoring_pass(tmp_path):
    root = tmp_path / "data"
    write_smallnorb_raw(root / "raw" / "smallnorb", n=12, side=48)
    params = config.Params(data=config.DataParams(smallnorb=config.SmallnorbParams(enabled=True)))
    stages.prepare("smallnorb", params, root)  # 12 test images
    model = models.build("smallnorb-cnn", in_channels=2, input_size=32, num_classes=5, hidden=8)
    path = tmp_path / "cnn.pt"
    checkpoint.save(path, model)
    calls = []
    forward = type(model).forward

    def counting(self, images):
        calls.append(images.shape[0])
        return forward(self, images)

    settings = EvaluateParams(
        datasets=["smallnorb"], limit=12, batch_size=5,
        robustness=RobustnessParams(enabled=False), equivariance=EquivarianceParams(enabled=False),
    )  # fmt: skip
    request = EvalRequest(settings, data=params.data, data_root=root)
    drawer = FigureDrawer(tmp_path / "figures")
    type(model).forward = counting
    try:
        results = evaluate_checkpoints([path], request, figures=drawer)
    finally:
        type(model).forward = forward
    assert calls == [5, 5, 2]  # the 12 test images once, for the score and the figure
    assert results.entries["cnn"].block("smallnorb")["n"] == 12
    assert (tmp_path / "figures" / "confusion-cnn-smallnorb.png").is_file()
