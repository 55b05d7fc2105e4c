"""Mirror order and fallback, verification, atomic writes, resume, safe zip extraction."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import signal
import subprocess
import sys
import time
import urllib.error
import zipfile
from pathlib import Path

import pytest

from capsnet.data import sources
from capsnet.data.sources import RemoteFile, candidate_urls, fetch, safe_extract_zip
from capsnet.io.errors import DataError

CONTENT = bytes(range(256)) * 64
MD5 = hashlib.md5(CONTENT).hexdigest()


def remote(official: Path, name: str = "f.bin.gz") -> RemoteFile:
    return RemoteFile("toy", name, (str(official / name),), MD5)


def put(directory: Path, name: str = "f.bin.gz", content: bytes = CONTENT, level: int = 9):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(gzip.compress(content, compresslevel=level))


def test_mirror_is_tried_first_then_official(tmp_path):
    rf = remote(tmp_path / "official")
    assert candidate_urls(rf, str(tmp_path / "m")) == [
        str(tmp_path / "m" / "toy" / "f.bin.gz"),
        str(tmp_path / "official" / "f.bin.gz"),
    ]
    assert candidate_urls(rf, "https://mirror.example/data/")[0] == (
        "https://mirror.example/data/toy/f.bin.gz"
    )


def test_the_environment_is_read_by_the_cli_not_here(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSNET_MIRROR", str(tmp_path / "env"))
    assert candidate_urls(remote(tmp_path)) == [str(tmp_path / "f.bin.gz")]


def test_fetch_prefers_mirror_and_verifies_raw_content(tmp_path):
    put(tmp_path / "mirror" / "toy", level=1)  # recompressed: .gz differs, raw content same
    out = fetch(
        remote(tmp_path / "nowhere"),
        tmp_path / "raw",
        mirror=str(tmp_path / "mirror"),
        progress=False,
    )
    assert gzip.decompress(out.read_bytes()) == CONTENT


def test_fetch_falls_back_when_mirror_lacks_or_corrupts_file(tmp_path):
    put(tmp_path / "official")
    out = fetch(
        remote(tmp_path / "official"),
        tmp_path / "a",
        mirror=str(tmp_path / "empty"),
        progress=False,
    )
    assert out.is_file()
    put(tmp_path / "bad" / "toy", content=b"not it")
    out = fetch(
        remote(tmp_path / "official"), tmp_path / "b", mirror=str(tmp_path / "bad"), progress=False
    )
    assert gzip.decompress(out.read_bytes()) == CONTENT


def test_md5_mismatch_everywhere_fails_and_leaves_nothing(tmp_path):
    put(tmp_path / "official", content=b"tampered")
    with pytest.raises(DataError) as info:
        fetch(remote(tmp_path / "official"), tmp_path / "raw", mirror="", progress=False)
    message = str(info.value)
    assert "\n" not in message and "MD5 mismatch" in message and "CAPSNET_MIRROR" in message
    assert list((tmp_path / "raw").iterdir()) == []


def test_no_source_error_names_urls_and_mirror_hint(tmp_path):
    with pytest.raises(DataError) as info:
        fetch(
            remote(tmp_path / "official"),
            tmp_path / "raw",
            mirror=str(tmp_path / "m"),
            progress=False,
        )
    message = str(info.value)
    assert str(tmp_path / "m" / "toy" / "f.bin.gz") in message
    assert str(tmp_path / "official" / "f.bin.gz") in message
    assert "Set $CAPSNET_MIRROR" in message


def test_network_errors_are_retried_with_backoff(tmp_path, monkeypatch):
    calls = []

    def flaky(url, timeout):
        calls.append(url)
        if len(calls) < 3:
            raise urllib.error.URLError("connection reset")
        return io.BytesIO(gzip.compress(CONTENT)), None

    monkeypatch.setattr(sources, "_open_source", flaky)
    rf = RemoteFile("toy", "f.bin.gz", ("https://example.invalid/f.bin.gz",), MD5)
    fetch(rf, tmp_path, mirror="", retries=3, backoff=0, progress=False)
    assert len(calls) == 3


def test_interrupted_download_leaves_nothing_and_rerun_completes(tmp_path, monkeypatch):
    put(tmp_path / "official")
    real_open = sources._open_source

    class Dies(io.BytesIO):
        def read(self, size=-1):
            if self.tell() > 0:
                raise KeyboardInterrupt
            return super().read(10)

    monkeypatch.setattr(
        sources, "_open_source", lambda url, timeout: (Dies(Path(url).read_bytes()), None)
    )
    with pytest.raises(KeyboardInterrupt):
        fetch(remote(tmp_path / "official"), tmp_path / "raw", mirror="", progress=False)
    assert list((tmp_path / "raw").iterdir()) == []
    monkeypatch.setattr(sources, "_open_source", real_open)
    out = fetch(remote(tmp_path / "official"), tmp_path / "raw", mirror="", progress=False)
    assert gzip.decompress(out.read_bytes()) == CONTENT


SLOW_FETCH = """
import io, sys, time
from pathlib import Path
from capsnet.data import sources
class Slow(io.BytesIO):
    def read(self, size=-1):
        time.sleep(0.05)
        return super().read(256)
sources._open_source = lambda url, timeout: (Slow(Path(url).read_bytes()), None)
rf = sources.RemoteFile("toy", "f.bin.gz", (sys.argv[1],), sys.argv[2])
sources.fetch(rf, sys.argv[3], mirror="", progress=False)
"""


def test_killed_download_restarts_cleanly(tmp_path):
    """SIGKILL mid-download (no cleanup runs): the restart ignores the partial file."""
    put(tmp_path / "official", level=0)
    raw = tmp_path / "raw"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_FETCH, str(tmp_path / "official" / "f.bin.gz"), MD5, str(raw)]
    )
    try:
        for _ in range(600):
            parts = list(raw.glob(".f.bin.gz.*.tmp")) if raw.exists() else []
            if parts and parts[0].stat().st_size > 0:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the download never started")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert not (raw / "f.bin.gz").exists()  # only a temporary: nothing looks complete
    out = fetch(remote(tmp_path / "official"), raw, mirror="", progress=False)
    assert gzip.decompress(out.read_bytes()) == CONTENT
    assert [p.name for p in raw.iterdir()] == ["f.bin.gz"]


def test_non_atomic_leftover_target_is_replaced(tmp_path):
    put(tmp_path / "official")
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "f.bin.gz").write_bytes(gzip.compress(CONTENT)[:50])  # truncated copy
    out = fetch(remote(tmp_path / "official"), raw, mirror="", progress=False)
    assert gzip.decompress(out.read_bytes()) == CONTENT


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_safe_extract_zip(tmp_path):
    archive = make_zip(tmp_path / "ok.zip", {"d/1.mat": b"a", "d/2.mat": b"b"})
    written = safe_extract_zip(archive, tmp_path / "out")
    assert sorted(p.name for p in written) == ["1.mat", "2.mat"]
    assert (tmp_path / "out" / "d" / "2.mat").read_bytes() == b"b"


@pytest.mark.parametrize("evil", ["../escape.mat", "d/../../escape.mat", "/abs/escape.mat"])
def test_zip_slip_refused_and_nothing_extracted(tmp_path, evil):
    archive = make_zip(tmp_path / "evil.zip", {"d/fine.mat": b"a", evil: b"x"})
    target = tmp_path / "a" / "b"
    with pytest.raises(DataError, match="would be extracted outside"):
        safe_extract_zip(archive, target)
    assert not list(tmp_path.rglob("escape.mat"))
    assert not list(target.rglob("*.mat"))


def test_corrupt_zip_refused(tmp_path):
    archive = make_zip(tmp_path / "c.zip", {"1.mat": b"x" * 1000})
    data = bytearray(archive.read_bytes())
    data[40:45] = b"XXXXX"  # inside the member's data: CRC mismatch
    archive.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"c\.zip: corrupt zip"):
        safe_extract_zip(archive, tmp_path / "out")
    (tmp_path / "t.zip").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError, match=r"t\.zip: corrupt zip"):
        safe_extract_zip(tmp_path / "t.zip", tmp_path / "out")
    assert not list((tmp_path / "out").rglob("*")) if (tmp_path / "out").exists() else True
