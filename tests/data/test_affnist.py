"""affNIST: official .mat archives through a mirror, expanded MNIST, affnist-synth."""

from __future__ import annotations

import pytest
import torch
from datahelpers import tiny_mnist, write_affnist_mirror

from capsnet.config import AffnistParams, DataParams, Params
from capsnet.data import affnist, load, mnist, stages
from capsnet.io.errors import DataError

pytest.importorskip("scipy")


def real_params() -> Params:
    return Params(data=DataParams(affnist=AffnistParams(source="real")))


@pytest.fixture
def offline_official(monkeypatch, tmp_path):
    """Point the official URLs at a missing local folder: tests never touch the network."""
    monkeypatch.setattr(affnist, "OFFICIAL_BASE", str(tmp_path / "no-official") + "/")


def test_download_extract_prepare_load_real(tmp_path, tiny_root, offline_official):
    mirror = write_affnist_mirror(tmp_path / "mirror")
    stages.download("affnist", real_params(), tiny_root, mirror=str(mirror))
    raw = tiny_root / "raw" / "affnist"
    assert len(list((raw / "test_batches").rglob("*.mat"))) == 32
    stages.prepare("affnist", real_params(), tiny_root)
    test = load("affnist", "test", tiny_root)
    assert len(test) == 64 and test[0][0].shape == (1, 40, 40)
    assert len(load("affnist", "test-centered", tiny_root)) == 3
    data, name = affnist.evaluation_set(tiny_root)
    assert name == "affnist" and len(data) == 64


def test_batches_are_read_in_numeric_order(tmp_path):
    mirror = write_affnist_mirror(tmp_path / "m", per_batch=1, batches=12)
    from capsnet.data.sources import safe_extract_zip

    safe_extract_zip(mirror / "affnist" / "test_batches.zip", tmp_path / "x")
    names = [p.stem for p in affnist._mat_files(tmp_path / "x")]
    assert names == [str(k) for k in range(1, 13)]


def test_corrupt_zip_from_mirror_is_refused(tmp_path, tiny_root, offline_official):
    mirror = write_affnist_mirror(tmp_path / "mirror")
    archive = mirror / "affnist" / "test_batches.zip"
    archive.write_bytes(archive.read_bytes()[:-200])
    with pytest.raises(DataError, match=r"test_batches\.zip: no source worked.*corrupt zip"):
        stages.download("affnist", real_params(), tiny_root, mirror=str(mirror))
    assert not (tiny_root / "raw" / "affnist" / "test_batches.zip").exists()


def test_auto_source_falls_back_to_synth(tmp_path, tiny_root, offline_official):
    params = Params(data=DataParams(affnist=AffnistParams(source="auto")))
    out = stages.download("affnist", params, tiny_root, mirror=str(tmp_path / "empty"))
    assert "affnist-synth" in (out / "DISABLED.txt").read_text()


def test_evaluation_falls_back_to_synth_and_says_so(tiny_root):
    mnist.prepare(tiny_root / "raw" / "mnist", tiny_root / "prepared" / "mnist")
    stages.prepare("affnist-synth", Params(), tiny_root)
    data, name = affnist.evaluation_set(tiny_root)
    assert name == "affnist-synth" and data.name == "affnist-synth-test"
    from capsnet.data.store import load_prepared

    _, meta = load_prepared(tiny_root / "prepared" / "affnist-synth" / "test.pt")
    assert meta["synthetic"] is True and "synthetic stand-in" in meta["note"]


def test_expanded_mnist_places_whole_digit_at_random_shift():
    images, _ = tiny_mnist(50)
    expanded = affnist.expand(images, seed=3)
    assert expanded.shape == (50, 40, 40)
    assert torch.equal(expanded.flatten(1).sum(1), images.flatten(1).sum(1))  # nothing lost
    assert torch.equal(expanded, affnist.expand(images, seed=3))
    corners = [tuple((e > 0).nonzero().min(0).values.tolist()) for e in expanded]
    assert len(set(corners)) > 10


def test_affnist_synth_ranges_determinism_and_ink_kept():
    images, _ = tiny_mnist(60)
    out, params = affnist.synthesize(images, seed=1)
    again, _ = affnist.synthesize(images, seed=1)
    assert out.shape == (60, 40, 40) and torch.equal(out, again)
    assert params[:, 0].abs().max() <= 20 and params[:, 1].abs().max() <= 0.2
    assert params[:, 2:4].min() >= 0.8 and params[:, 2:4].max() <= 1.2
    assert params[:, 4:].abs().max() > 0  # translations are drawn
    # the map scales area by sx * sy (rotation and shear preserve it): no ink clipped
    ratio = out.flatten(1).float().sum(1) / (
        images.flatten(1).float().sum(1) * params[:, 2] * params[:, 3]
    )
    assert ratio.min() > 0.9 and ratio.max() < 1.1


def test_affnist_synth_matches_torch_affine_warp_within_rounding():
    """The exact float64 warp against torch's own affine_grid + grid_sample (float32) with
    the recorded parameters: the same map, at most 1 apart after rounding."""
    import torch.nn.functional as F

    images, _ = tiny_mnist(40)
    out, params = affnist.synthesize(images, seed=2)
    degrees, shear, sx, sy, tx, ty = params.double().unbind(1)  # (N,) each
    cos, sin = torch.cos(torch.deg2rad(degrees)), torch.sin(torch.deg2rad(degrees))
    rot = torch.stack([torch.stack([cos, -sin], 1), torch.stack([sin, cos], 1)], 1)  # (N,2,2)
    shear_map = torch.eye(2, dtype=torch.float64).repeat(len(params), 1, 1)
    shear_map[:, 0, 1] = shear
    forward = rot @ shear_map @ torch.diag_embed(torch.stack([sx, sy], 1))  # (N, 2, 2)
    inverse = torch.linalg.inv(forward).float()  # (N, 2, 2)
    shift = torch.stack([tx, ty], 1).float()[..., None] * 2 / 40  # (N, 2, 1) normalised
    theta = torch.cat([inverse, -(inverse @ shift)], 2)  # (N, 2, 3)
    canvas = F.pad(images, (6, 6, 6, 6))[:, None].float()  # (N, 1, 40, 40)
    grid = F.affine_grid(theta, list(canvas.shape), align_corners=False)
    reference = F.grid_sample(canvas, grid, align_corners=False)[:, 0]  # (N, 40, 40)
    assert (out.double() - reference.double()).abs().max() <= 0.5 + 1e-3


def test_real_affnist_missing_names_the_way_out(tiny_root):
    with pytest.raises(DataError, match="use affnist-synth"):
        load("affnist", "test", tiny_root)
