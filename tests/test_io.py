"""capsnet.io: atomic files and directories and the DISABLED marker."""

from __future__ import annotations

import json
import os
import stat

import pytest

from capsnet import io


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_write_bytes_text_json_content(tmp_path):
    assert io.atomic_write_bytes(tmp_path / "a.bin", b"\x00\x01") == tmp_path / "a.bin"
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    io.atomic_write_text(tmp_path / "sub" / "b.txt", "grüße\n")
    assert (tmp_path / "sub" / "b.txt").read_bytes() == "grüße\n".encode()
    io.atomic_write_json(tmp_path / "c.json", {"b": 1, "a": [0.5]})
    text = (tmp_path / "c.json").read_text()
    assert text == '{\n  "b": 1,\n  "a": [\n    0.5\n  ]\n}\n'
    assert json.loads(text) == {"b": 1, "a": [0.5]}


def test_overwrite_replaces_content(tmp_path):
    target = tmp_path / "x.txt"
    target.write_text("old content that is longer")
    io.atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.txt"]


def test_file_mode_follows_umask(tmp_path, umask_027):
    io.atomic_write_bytes(tmp_path / "f", b"1")
    assert _mode(tmp_path / "f") == 0o640
    os.umask(0o022)
    io.atomic_write_bytes(tmp_path / "g", b"1")
    assert _mode(tmp_path / "g") == 0o644


def test_directory_mode_follows_umask(tmp_path, umask_027):
    with io.atomic_directory(tmp_path / "d") as tmp:
        (tmp / "x").write_text("1")
    assert _mode(tmp_path / "d") == 0o750


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    target = tmp_path / "keep.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="boom"), io.atomic_open(target) as fh:
        fh.write(b"partial")
        raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_unserialisable_json_leaves_nothing(tmp_path):
    with pytest.raises(TypeError):
        io.atomic_write_json(tmp_path / "bad.json", {"x": object()})
    assert list(tmp_path.iterdir()) == []


def test_temp_file_name_is_recognisable(tmp_path):
    with io.atomic_open(tmp_path / "out.csv") as fh:
        fh.write(b"a")
        names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 1
    assert names[0].startswith(".out.csv.") and names[0].endswith(".tmp")
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_directory_publish_replaces_old_one(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "stale.txt").write_text("stale")
    with io.atomic_directory(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.")
        assert (target / "stale.txt").exists()  # the old one stays until the block succeeds
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_failed_directory_publish_keeps_old_one(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(ValueError), io.atomic_directory(target) as tmp:
        (tmp / "half.txt").write_text("half")
        raise ValueError("stage failed")
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_directory_publish_replaces_a_file(tmp_path):
    target = tmp_path / "out"
    target.write_text("a file where the directory goes")
    with io.atomic_directory(target) as tmp:
        (tmp / "x").write_text("1")
    assert target.is_dir() and (target / "x").read_text() == "1"


def test_disabled_marker_round_trip(tmp_path):
    out = tmp_path / "stage"
    out.mkdir()
    (out / "result.csv").write_text("old result")
    assert io.read_disabled(out) is None and not io.is_disabled(out)
    io.write_disabled(out, "data.smallnorb.enabled is false\n\n")
    assert sorted(p.name for p in out.iterdir()) == [io.DISABLED_MARKER]
    assert (out / "DISABLED.txt").read_text() == "data.smallnorb.enabled is false\n"
    assert io.is_disabled(out)
    assert io.read_disabled(out) == "data.smallnorb.enabled is false"
    io.clear_disabled(out)
    assert io.read_disabled(out) is None
    io.clear_disabled(out)  # nothing to remove is fine


def test_write_marker_keeps_other_files(tmp_path):
    (tmp_path / "best.json").write_text("{}")
    path = io.write_marker(tmp_path, "switched off")
    assert path == tmp_path / "DISABLED.txt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DISABLED.txt", "best.json"]
    assert io.read_disabled(tmp_path) == "switched off"
