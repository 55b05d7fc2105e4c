"""smallNORB: official binary files, 48x48 preparation, crops, viewpoint subsets."""

from __future__ import annotations

import pytest
import torch
from datahelpers import write_smallnorb_raw

from capsnet.config import DataParams, Params, SmallnorbParams
from capsnet.data import load, smallnorb, stages
from capsnet.io.errors import DataError

ON = Params(data=DataParams(smallnorb=SmallnorbParams(enabled=True)))


@pytest.fixture
def norb_root(tmp_path):
    write_smallnorb_raw(tmp_path / "data" / "raw" / "smallnorb")
    return tmp_path / "data"


def test_read_split_with_info_fields(norb_root):
    images, labels, info = smallnorb.read_split(norb_root / "raw" / "smallnorb", "train")
    assert images.shape == (24, 2, 96, 96) and images.dtype == torch.uint8
    assert labels.tolist() == [i % 5 for i in range(24)]
    assert info.shape == (24, 4) and info[:, 2].max() <= 34


def test_prepare_and_load_crops(norb_root):
    stages.prepare("smallnorb", ON, norb_root)
    train = load("smallnorb", "train", norb_root, seed=0, standardize=False)
    image, _ = train[0]
    assert image.shape == (2, 32, 32) and 0 <= float(image.min()) <= float(image.max()) <= 1
    assert torch.equal(train[0][0], image)  # seeded per item
    train.set_epoch(1)
    assert not torch.equal(train[0][0], image)  # a new crop / jitter each epoch
    standardized = load("smallnorb", "test", norb_root)[0][0]  # the default: per image
    assert abs(float(standardized.mean())) < 1e-5 and abs(float(standardized.std()) - 1) < 1e-4
    test = load("smallnorb", "test", norb_root, standardize=False)
    full = smallnorb.downsample(smallnorb.read_split(norb_root / "raw" / "smallnorb", "test")[0])
    assert torch.equal(test.tensors[0], full[:, :, 8:40, 8:40])  # centre 32x32 of 48x48
    left = load("smallnorb", "test", norb_root, channels=(0,))
    assert left[0][0].shape == (1, 32, 32)


def test_downsample_is_torch_antialiased_bilinear_within_rounding():
    from torchvision.transforms.v2 import functional as TF

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5, 2, 96, 96), generator=generator).to(torch.uint8)
    for size in (48, 32, 50):
        ours = smallnorb.downsample(images, size)  # (5, 2, size, size)
        reference = TF.resize(images.float(), [size, size], antialias=True)
        assert ours.shape == (5, 2, size, size) and ours.dtype == torch.uint8
        assert (ours.double() - reference.double()).abs().max() <= 0.5 + 1e-3
    flat = torch.full((1, 1, 96, 96), 77, dtype=torch.uint8)
    assert torch.equal(smallnorb.downsample(flat, 37), torch.full((1, 1, 37, 37), 77).byte())


def test_viewpoint_subsets(norb_root):
    stages.prepare("smallnorb", ON, norb_root)
    info = torch.tensor([[0, e, a, 0] for e in range(9) for a in range(0, 36, 2)])
    familiar = smallnorb.subset_mask(info, "azimuth-familiar")
    assert set(info[familiar, 2].tolist()) == {30, 32, 34, 0, 2, 4}
    assert set(info[~familiar, 2].tolist()) == set(range(6, 29, 2))  # 60..280 degrees
    assert torch.equal(smallnorb.subset_mask(info, "azimuth-novel"), ~familiar)
    low = smallnorb.subset_mask(info, "elevation-familiar")
    assert set(info[low, 1].tolist()) == {0, 1, 2}
    assert set(info[smallnorb.subset_mask(info, "elevation-novel"), 1].tolist()) == set(range(3, 9))
    novel = load("smallnorb", "test", norb_root, subset="azimuth-novel")
    assert all(int(a) not in (30, 32, 34, 0, 2, 4) for a in novel.info[:, 2])
    with pytest.raises(DataError, match="subset 'azimuth' unknown"):
        smallnorb.subset_mask(info, "azimuth")


def test_header_dims_disagreeing_with_size(norb_root):
    path = norb_root / "raw" / "smallnorb" / smallnorb.filename("test", "cat")
    import numpy as np

    from capsnet.data.formats import write_norb

    write_norb(path, np.zeros(23, np.int32))  # 23 labels for 24 images
    with pytest.raises(DataError, match=r"testing-cat\.mat\.gz: 23 rows but 24 images"):
        stages.prepare("smallnorb", ON, norb_root)
    assert not (norb_root / "prepared" / "smallnorb").exists()


def test_switched_off_writes_marker(tmp_path):
    assert Params().data.smallnorb.enabled  # on by default (the stand-in offline)
    off = Params(data=DataParams(smallnorb=SmallnorbParams(enabled=False)))
    out = stages.download("smallnorb", off, tmp_path)
    assert [p.name for p in out.iterdir()] == ["DISABLED.txt"]
    stages.prepare("smallnorb", off, tmp_path)
    with pytest.raises(DataError, match="smallnorb is switched off"):
        load("smallnorb", "test", tmp_path)


def test_download_verifies_official_md5(tmp_path, monkeypatch):
    """With source real, files that are not the official ones fail the raw-MD5 check
    (nothing is kept); auto would render the stand-in instead."""
    write_smallnorb_raw(tmp_path / "mirror" / "smallnorb", n=2, side=8)
    monkeypatch.setattr(smallnorb, "OFFICIAL_BASE", str(tmp_path / "none") + "/")
    real = Params(data=DataParams(smallnorb=SmallnorbParams(enabled=True, source="real")))
    with pytest.raises(DataError, match="MD5 mismatch"):
        stages.download("smallnorb", real, tmp_path / "data", mirror=str(tmp_path / "mirror"))
    assert not list((tmp_path / "data" / "raw" / "smallnorb").glob("*.gz"))
