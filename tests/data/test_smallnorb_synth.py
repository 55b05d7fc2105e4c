"""smallnorb-synth: the rendered stand-in, in the official format, through the smallNORB stages."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch

from capsnet.config import DataParams, Params, SmallnorbParams, SmallnorbSynthParams
from capsnet.data import load, smallnorb, smallnorb_synth, stages
from capsnet.io.errors import ConfigError, DataError

SIDE = 16  # a small render for the fast tests; the recorded checksums are of side 96


def synth_params(side: int = SIDE, **norb) -> Params:
    section = SmallnorbParams(source="synth", synth=SmallnorbSynthParams(side=side), **norb)
    return Params(data=DataParams(smallnorb=section))


def test_render_has_the_official_grid_and_split():
    dat, cat, info = smallnorb_synth.render_split("test", side=SIDE)
    assert dat.shape == (24300, 2, SIDE, SIDE) and dat.dtype == torch.uint8
    assert torch.bincount(cat.long()).tolist() == [4860] * 5
    assert sorted(set(info[:, 0].tolist())) == [0, 1, 2, 3, 5]  # official test instances
    assert sorted(set(info[:, 1].tolist())) == list(range(9))
    assert sorted(set(info[:, 2].tolist())) == list(range(0, 36, 2))
    assert sorted(set(info[:, 3].tolist())) == list(range(6))
    # every (class, instance, elevation, azimuth, lighting) exactly once
    keys = cat.long() * 10**6 + info[:, 0] * 10**5 + info[:, 1] * 10**4 + info[:, 2] * 10
    keys = keys + info[:, 3]
    assert keys.unique().numel() == 24300
    assert set(smallnorb_synth.INSTANCES["train"]) == {4, 6, 7, 8, 9}
    # the tail held out for validation covers every class
    assert torch.bincount(cat[-2000:].long(), minlength=5).min() > 300


def test_views_differ_and_stereo_pairs_differ():
    parts, albedo, yaw = smallnorb_synth._instance(2, 4, 0)
    views = smallnorb_synth._render_elevation(parts, albedo, yaw, 0, 32)  # (6, 18, 2, 32, 32)
    assert not torch.equal(views[0, 0, 0], views[0, 0, 1])  # left and right cameras
    assert not torch.equal(views[0, 0, 0], views[0, 4, 0])  # another azimuth
    assert not torch.equal(views[0, 0, 0], views[3, 0, 0])  # another lighting
    other = smallnorb_synth._instance(2, 6, 0)
    assert not torch.equal(views, smallnorb_synth._render_elevation(*other, 0, 32))


def test_fewer_lightings_render_the_first_lighting_indices_only():
    """``data.smallnorb.synth.lightings`` (tests' small pipelines): the same images as the
    full render at those lighting indices (tests/test_dvc_repro.py renders a split so)."""
    parts, albedo, yaw = smallnorb_synth._instance(1, 0, 0)
    full = smallnorb_synth._render_elevation(parts, albedo, yaw, 3, 8)  # (6, 18, 2, 8, 8)
    two = smallnorb_synth._render_elevation(parts, albedo, yaw, 3, 8, lightings=2)
    assert torch.equal(two, full[:2])
    with pytest.raises(ConfigError, match="lightings"):
        SmallnorbSynthParams(lightings=7)


def test_small_render_bytes_are_recorded():
    """The same bytes on any CPU (elementwise float64 only); a full-size check is slow."""
    dat, _cat, _info = smallnorb_synth.render_split("train", side=SIDE)
    digest = hashlib.md5(dat.numpy().tobytes()).hexdigest()
    assert digest == "ab1a641506fab68cccd1d692d420adf8"


def test_stages_run_unchanged_on_the_stand_in(tmp_path):
    root = tmp_path / "data"
    params = synth_params()
    raw = stages.download("smallnorb", params, root, mirror=None)
    assert (raw / "SOURCE.txt").read_text().strip() == "smallnorb-synth"
    manifest = (raw / smallnorb_synth.MANIFEST).read_text()
    assert manifest.count(".mat.gz") == 6
    before = {p.name: p.stat().st_mtime_ns for p in raw.glob("*.mat.gz")}
    stages.download("smallnorb", params, root, mirror=None)  # verified by the manifest: kept
    assert {p.name: p.stat().st_mtime_ns for p in raw.glob("*.mat.gz")} == before
    images, _labels, _info = smallnorb.read_split(raw, "train")  # the official reader
    assert images.shape == (24300, 2, SIDE, SIDE)
    stages.prepare("smallnorb", synth_params(size=SIDE, crop=12), root)
    test = load("smallnorb", "test", root, crop=12)
    assert test.source == "smallnorb-synth" and len(test) == 24300
    image, label = test[0]
    assert image.shape == (2, 12, 12) and 0 <= label < 5
    assert abs(float(image.mean())) < 1e-5 and abs(float(image.std()) - 1) < 1e-4  # standardised


def test_auto_is_synth_without_the_official_files_in_the_mirror(tmp_path):
    section = SmallnorbParams(source="auto", synth=SmallnorbSynthParams(side=SIDE))
    raw = tmp_path / "raw"
    used = smallnorb.obtain(raw, section, str(tmp_path / "empty-mirror"), False,
                            smallnorb_synth.obtain)  # fmt: skip
    assert used == "smallnorb-synth"


def test_changed_rendering_is_an_error(tmp_path, monkeypatch):
    recorded = dict(smallnorb_synth.RECORDED_MD5)
    recorded[("test", "cat")] = "0" * 32
    monkeypatch.setattr(smallnorb_synth, "RECORDED_MD5", recorded)
    monkeypatch.setattr(smallnorb_synth, "SIDE", SIDE)  # check a small render as if full size
    with pytest.raises(DataError, match="renders smallnorb-synth differently"):
        smallnorb_synth.obtain(tmp_path, 0, SIDE)


def test_source_setting_is_validated():
    from capsnet.config import ConfigError, from_dict

    with pytest.raises(ConfigError, match="source"):
        from_dict(Params, {"data": {"smallnorb": {"source": "fake"}}})
    assert dataclasses.replace(SmallnorbParams()).source == "auto"
    assert SmallnorbParams().standardize is True


# The full-size files against RECORDED_MD5: the full build of
# tests/data/test_reproducible.py renders them through `obtain`, which raises on a mismatch.
