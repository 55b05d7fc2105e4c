"""Round trips through the official formats, and their bad-input errors."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from capsnet.data import formats
from capsnet.io.errors import DataError


def test_idx_round_trip(tmp_path):
    images = torch.randint(0, 256, (5, 28, 28), dtype=torch.uint8)
    labels = torch.tensor([0, 9, 3, 3, 1])
    formats.write_idx(tmp_path / "img.gz", images)
    formats.write_idx(tmp_path / "lab", labels)
    assert torch.equal(formats.read_idx_images(tmp_path / "img.gz"), images)
    assert torch.equal(formats.read_idx_labels(tmp_path / "lab"), labels)
    raw = gzip.decompress((tmp_path / "img.gz").read_bytes())
    assert raw[:4] == (2051).to_bytes(4, "big") and raw[4:8] == (5).to_bytes(4, "big")


def test_idx_truncated_gzip(tmp_path):
    formats.write_idx(tmp_path / "img.gz", torch.zeros(4, 28, 28, dtype=torch.uint8))
    data = (tmp_path / "img.gz").read_bytes()
    (tmp_path / "img.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"img\.gz: truncated or corrupt gzip"):
        formats.read_idx_images(tmp_path / "img.gz")


def test_idx_wrong_magic(tmp_path):
    formats.write_idx(tmp_path / "lab", torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(DataError, match="lab: IDX magic 2049, expected 2051"):
        formats.read_idx_images(tmp_path / "lab")


def test_idx_label_out_of_range(tmp_path):
    formats.write_idx(tmp_path / "lab", torch.tensor([1, 10], dtype=torch.uint8))
    with pytest.raises(DataError, match=r"label 10 out of range 0\.\.9"):
        formats.read_idx_labels(tmp_path / "lab")


def test_norb_round_trip_all_dtypes(tmp_path):
    for dtype in ("uint8", "int32", "float32", "float64", "int16"):
        array = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
        formats.write_norb(tmp_path / f"{dtype}.mat", array)
        back = formats.read_norb(tmp_path / f"{dtype}.mat")
        assert back.dtype == array.dtype and np.array_equal(back, array)


def test_norb_header_layout_matches_the_official_format(tmp_path):
    cat = np.array([0, 4, 2], dtype=np.int32)
    formats.write_norb(tmp_path / "cat.mat.gz", cat)
    raw = gzip.decompress((tmp_path / "cat.mat.gz").read_bytes())
    header = np.frombuffer(raw[:20], "<i4")
    # int32 matrix magic, ndim 1, then max(3, ndim) = 3 dims: 3, 1, 1
    assert header.tolist() == [0x1E3D4C54, 1, 3, 1, 1]
    assert np.array_equal(formats.read_norb(tmp_path / "cat.mat.gz"), cat)


def test_norb_dims_disagree_with_file_size(tmp_path):
    formats.write_norb(tmp_path / "dat.mat", np.zeros((3, 2, 4, 4), np.uint8))
    data = bytearray((tmp_path / "dat.mat").read_bytes())
    data[8:12] = (4).to_bytes(4, "little")  # header now claims 4 images
    (tmp_path / "dat.mat").write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"dat\.mat: header dims \[4, 2, 4, 4\]"):
        formats.read_norb(tmp_path / "dat.mat")


def test_norb_unknown_magic(tmp_path):
    (tmp_path / "x.mat").write_bytes(np.array([123, 1, 1, 1, 1], "<i4").tobytes())
    with pytest.raises(DataError, match="magic 0x7b unknown"):
        formats.read_norb(tmp_path / "x.mat")


def test_affnist_mat_round_trip(tmp_path):
    pytest.importorskip("scipy")
    images = torch.randint(0, 256, (7, 40, 40), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 9, 4, 5, 6])
    formats.write_affnist_mat(tmp_path / "1.mat", images, labels)
    got_images, got_labels = formats.read_affnist_mat(tmp_path / "1.mat")
    assert torch.equal(got_images, images) and torch.equal(got_labels, labels)


def test_affnist_mat_file_layout(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    images = torch.zeros(3, 40, 40, dtype=torch.uint8)
    images[1, 0, 5] = 200  # row 0, column 5 -> element 5 of the row-major column
    formats.write_affnist_mat(tmp_path / "t.mat", images, torch.tensor([3, 1, 2]))
    struct = scipy_io.loadmat(tmp_path / "t.mat")["affNISTdata"][0, 0]
    assert struct["image"].shape == (1600, 3) and struct["image"][5, 1] == 200
    assert struct["label_one_of_n"].shape == (10, 3) and struct["label_one_of_n"][3, 0] == 1
    assert set(struct.dtype.names) == set(formats.AFFNIST_FIELDS)


def test_affnist_mat_without_fields(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    scipy_io.savemat(tmp_path / "bad.mat", {"affNISTdata": {"pixels": np.zeros((1600, 2))}})
    with pytest.raises(DataError, match=r"bad\.mat: affNISTdata lacks field\(s\) image, label_int"):
        formats.read_affnist_mat(tmp_path / "bad.mat")
    scipy_io.savemat(tmp_path / "other.mat", {"x": np.zeros(3)})
    with pytest.raises(DataError, match="no affNISTdata struct"):
        formats.read_affnist_mat(tmp_path / "other.mat")
