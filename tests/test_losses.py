import math

import pytest
import torch

from capsnet.nn.losses import cross_entropy, margin_loss, reconstruction_loss


def test_margin_loss_against_hand_computed_values():
    lengths = torch.tensor([[0.95, 0.3, 0.05], [0.5, 0.2, 0.8]])
    target = torch.tensor([0, 2])
    # example 0: present 0 (0.95 > 0.9); absent: 0.5*(0.3-0.1)^2 = 0.02; 0.05 < 0.1 -> 0
    # example 1: present (0.9-0.8)^2 = 0.01; absent 0.5*(0.4^2 + 0.1^2) = 0.085
    expected = (0.02 + 0.01 + 0.085) / 2
    assert math.isclose(margin_loss(lengths, target).item(), expected, rel_tol=1e-5)


def test_margin_loss_parameters_and_multi_hot_targets():
    lengths = torch.tensor([[0.7, 0.6, 0.3]])
    multi_hot = torch.tensor([[1.0, 1.0, 0.0]])
    # present: (0.8-0.7)^2 + (0.8-0.6)^2 = 0.05; absent: 0.25 * (0.3 - 0.2)^2 = 0.0025
    value = margin_loss(lengths, multi_hot, m_plus=0.8, m_minus=0.2, lam=0.25)
    assert math.isclose(value.item(), 0.0525, rel_tol=1e-5)


def test_reconstruction_loss_is_scaled_sum_of_squares():
    recon = torch.zeros(2, 1, 2, 2)
    images = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]], [[[1.0, 1.0], [1.0, 1.0]]]])
    # per image sums: 1 and 4; mean 2.5; scaled by 0.0005
    assert math.isclose(reconstruction_loss(recon, images).item(), 2.5 * 0.0005, rel_tol=1e-6)
    assert math.isclose(reconstruction_loss(recon, images, weight=1.0).item(), 2.5, rel_tol=1e-6)


def test_cross_entropy_matches_log_softmax():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    expected = -torch.log_softmax(logits, dim=1)[0, 0]
    torch.testing.assert_close(cross_entropy(logits, torch.tensor([0])), expected)


def test_reconstruction_loss_sums_the_errors_of_several_images_per_example():
    recon = torch.zeros(2, 2, 1, 2, 2)  # (B, n, C, H, W)
    images = torch.ones(2, 2, 1, 2, 2)
    images[1, 1] = 0.0
    # example 0: 4 + 4 = 8; example 1: 4 + 0 = 4; mean 6
    assert math.isclose(reconstruction_loss(recon, images, weight=1.0).item(), 6.0)
    with pytest.raises(ValueError, match=r"reconstruction \(2, 2, 1, 2, 2\) and images"):
        reconstruction_loss(recon, images[:, 0])
