"""FGSM/BIM (capsnet.evaluation.probes.adversarial_images, robustness) and the pose equivariance
diagnostic, checked against answers known in advance."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from capsnet.config.training import TrainConfig
from capsnet.data.datasets import TensorImageDataset
from capsnet.evaluation import probes
from capsnet.models import ModelOutput
from capsnet.training import scoring as evaluate


class Linear(nn.Module):
    """Class scores linear in the pixels: scores = x.flatten() @ weight.T, (B, K)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (K, H*W)

    def forward(self, x: torch.Tensor) -> ModelOutput:
        return ModelOutput(x.flatten(1) @ self.weight.T)  # (B, K)


def two_class_linear(seed: int = 0) -> tuple[Linear, torch.Tensor, torch.Tensor]:
    """A 2-class linear model on 6x6 images, the images (8, 1, 6, 6) with pixels at 0, 1
    and in between, and their labels (8,)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(2, 36, generator=generator)  # (2, 36)
    images = torch.rand(8, 1, 6, 6, generator=generator)  # (8, 1, 6, 6)
    images[:, :, 0] = 0.0  # the first row dark, the last bright: clipping has work to do
    images[:, :, -1] = 1.0
    labels = torch.tensor([0, 1] * 4)  # (8,)
    return Linear(weight), images, labels


def test_fgsm_on_a_linear_model_moves_each_pixel_by_epsilon_toward_the_other_class():
    """For two classes, the cross-entropy gradient is (p_other)(w_other - w_true): its sign
    is known, so the FGSM image is clip(x + eps * sign(w_other - w_true), 0, 1)."""
    model, images, labels = two_class_linear()
    eps = 0.1
    direction = (model.weight[1 - labels] - model.weight[labels]).detach().sign()  # (8, 36)
    expected = (images + eps * direction.view_as(images)).clamp(0, 1)  # (8, 1, 6, 6)
    fgsm = probes.adversarial_images(model, images, labels, eps, steps=1)
    torch.testing.assert_close(fgsm, expected)
    # BIM takes steps of the same sign on a linear two-class model: the same corner
    bim = probes.adversarial_images(model, images, labels, eps, steps=7)
    torch.testing.assert_close(bim, expected)


@pytest.mark.parametrize("steps", [1, 2, 10])
@pytest.mark.parametrize("eps", [0.0, 0.03, 0.3])
def test_attacks_stay_within_epsilon_and_inside_the_unit_range(steps, eps):
    model, images, labels = two_class_linear(seed=steps)
    for step_size in (None, 1.0):  # 1.0: far larger than epsilon, so projection must act
        adv = probes.adversarial_images(model, images, labels, eps, steps, step_size)
        assert adv.shape == images.shape and not adv.requires_grad
        assert (adv - images).abs().max().item() <= eps + 1e-6
        assert adv.min().item() >= 0.0 and adv.max().item() <= 1.0
    assert torch.equal(images[:, :, 0], torch.zeros(8, 1, 6))  # originals untouched


def test_attack_restores_training_mode():
    model, images, labels = two_class_linear()
    model.train()
    probes.adversarial_images(model, images, labels, 0.1, steps=3)
    assert model.training


@pytest.fixture(scope="module")
def trained_lenet5(mnist_root):
    """LeNet5 trained one epoch on 2,000 MNIST images, and 200 test images."""
    from capsnet.training.run import RunSpec, load_test, train_run

    torch.manual_seed(0)
    spec = RunSpec(
        "lenet5", train=TrainConfig(epochs=1, batch_size=64, lr=3e-3), train_size=2000,
        val_size=0, data_root=mnist_root,
    )  # fmt: skip
    return train_run(spec).model, load_test(spec, 200)


def test_bim_is_at_least_as_strong_as_fgsm_on_a_trained_model(trained_lenet5):
    model, test = trained_lenet5
    clean = evaluate.accuracy(model, test, 200, "cpu")["accuracy"]
    assert clean > 0.6  # trained: far above chance (0.1)
    result = probes.robustness(model, test, epsilons=(0.05, 0.1), bim_steps=5)
    assert result["n"] == 200
    for eps in ("0.05", "0.1"):
        assert result["bim"][eps] <= result["fgsm"][eps] < clean
    assert result["fgsm"]["0.1"] <= result["fgsm"]["0.05"]


def test_adversarial_images_of_a_trained_model_stay_in_the_ball(trained_lenet5):
    model, test = trained_lenet5
    images, labels = test.tensors
    images = images[:64].float() / 255  # (64, 1, 28, 28)
    for steps in (1, 5):
        adv = probes.adversarial_images(model, images, labels[:64], 0.1, steps)
        assert (adv - images).abs().max().item() <= 0.1 + 1e-6
        assert adv.min().item() >= 0.0 and adv.max().item() <= 1.0
        assert (adv != images).any()


# --- the equivariance diagnostic -------------------------------------------------------------


def bar_images(orientations: list[float], size: int = 28) -> torch.Tensor:
    """uint8 (N, 1, size, size): a soft bar through the centre at each orientation
    (degrees, counter-clockwise from the x axis, as displayed)."""
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")  # (size, size) each
    x, y = cols, -rows  # y up, as displayed
    out = []
    for degrees in orientations:
        theta = math.radians(degrees)
        along = x * math.cos(theta) + y * math.sin(theta)
        across = -x * math.sin(theta) + y * math.cos(theta)
        bar = torch.exp(-(across**2) / 2) * torch.sigmoid(2 * (9 - along.abs()))
        out.append((255 * bar).round().to(torch.uint8))
    return torch.stack(out).unsqueeze(1)  # (N, 1, size, size)


class OrientationPoses(nn.Module):
    """Poses that are a known linear function of the image's orientation: the principal
    axis angle phi (degrees, from second moments) gives every class the pose
    (phi, 5 - 2 phi, 0.3)."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.classes = classes
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> ModelOutput:
        image = x[:, 0].double()  # (B, H, W)
        size = image.shape[-1]
        coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
        rows, cols = torch.meshgrid(coords, coords, indexing="ij")  # (H, W) each
        px, py = cols, -rows
        mass = image.sum(dim=(1, 2))  # (B,)
        mx = (image * px).sum(dim=(1, 2)) / mass  # (B,)
        my = (image * py).sum(dim=(1, 2)) / mass  # (B,)
        dx, dy = px - mx.view(-1, 1, 1), py - my.view(-1, 1, 1)  # (B, H, W) each
        sxx = (image * dx * dx).sum(dim=(1, 2))  # (B,)
        syy = (image * dy * dy).sum(dim=(1, 2))  # (B,)
        sxy = (image * dx * dy).sum(dim=(1, 2))  # (B,)
        phi = torch.rad2deg(0.5 * torch.atan2(2 * sxy, sxx - syy))  # (B,)
        pose = torch.stack([phi, 5 - 2 * phi, torch.full_like(phi, 0.3)], dim=1)  # (B, 3)
        poses = pose.float().unsqueeze(1).expand(-1, self.classes, -1)  # (B, K, 3)
        return ModelOutput(torch.zeros(x.shape[0], self.classes), poses)


def test_pose_equivariance_recovers_a_known_linear_pose():
    """Rotating a bar by a turns its orientation by a, so the pose (phi, 5 - 2 phi, 0.3)
    moves by a * (1, -2, 0): correlations (1, -1, 0), one direction explaining all of the
    change, and a mean change of sqrt(5) |a|."""
    orientations = [-40.0, -25.0, -10.0, 0.0, 15.0, 30.0, 40.0]
    images = bar_images(orientations)  # (7, 1, 28, 28)
    labels = torch.arange(7)  # (7,)
    model = OrientationPoses()
    with torch.no_grad():
        measured = model(images.float() / 255).poses[:, 0, 0]  # (7,)
    torch.testing.assert_close(measured, torch.tensor(orientations), atol=0.5, rtol=0)
    angles = [-30, -15, 0, 15, 30]
    result = probes.pose_equivariance(
        model, TensorImageDataset(images, labels), angles, batch_size=3, device="cpu"
    )
    assert result["angles"] == [float(a) for a in angles] and result["n"] == 7
    corr = result["dim_correlation"]
    assert corr[0] == pytest.approx(1.0, abs=1e-3)
    assert corr[1] == pytest.approx(-1.0, abs=1e-3)
    assert corr[2] == 0.0  # a constant pose entry
    assert result["first_direction_explained"] == pytest.approx(1.0, abs=1e-3)
    expected_change = [math.sqrt(5) * abs(a) for a in angles]
    assert result["mean_pose_change"] == pytest.approx(expected_change, rel=0.03, abs=1e-6)


def test_pose_equivariance_is_none_without_poses():
    model, images, labels = two_class_linear()
    dataset = TensorImageDataset((images * 255).to(torch.uint8), labels)
    assert probes.pose_equivariance(model, dataset, [0, 15], device="cpu") is None
