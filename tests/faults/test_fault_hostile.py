"""Hostile inputs, each run in this process with a deadline (``invoke_bounded``): params and
JSON files that expand or nest without end, smallNORB files whose header lies about their
content, mirrors that never end or trickle, a zip-bomb checkpoint, malformed best.json
values, outputs that are device nodes, FIFOs or kernel file systems, and a planted ``.old``
directory. Each ends within its deadline as one line naming the file or setting, and no
output appears."""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from faulthelpers import invoke_bounded, judge, snapshot

from capsnet.config.yamlfile import MAX_DEPTH, MAX_VALUES
from capsnet.data import mnist, smallnorb
from capsnet.data.formats import NORB_MAGIC, write_norb
from capsnet.io.files import MAX_JSON_DEPTH

NO_MIRROR = {"CAPSNET_MIRROR": ""}


def billion_laughs() -> str:
    """A params file of about 400 bytes whose aliases stand for 9**9 values."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


#: name -> (params.yaml text, what the error says)
HOSTILE_PARAMS = {
    "billion-laughs": (billion_laughs(), f"expand to more than {MAX_VALUES} values"),
    "deep-lists": ("train: " + "[" * 5000 + "]" * 5000 + "\n", f"deeper than {MAX_DEPTH}"),
    "deep-mappings": ("train:\n" + "".join(f"{' ' * i}k{i}:\n" for i in range(1, 60)), "deeper"),
    "flow-mappings": ("train: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", "deeper"),
    "self-alias": ("a: &x\n  b: *x\n", "alias"),
}

#: Commands that read params.yaml, with the arguments they need besides it.
PARAMS_COMMANDS = {
    "train": ["train", "--model", "lenet5", "--out", "{tmp}/run"],
    "data prepare": ["data", "prepare", "multimnist", "--data-root", "{tmp}/data"],
    "evaluate-stage": ["evaluate-stage", "--params", "params.yaml"],
    "sweep": ["sweep", "--params", "params.yaml"],
    "train-final": ["train-final", "--params", "params.yaml"],
    "viewpoints": ["viewpoints", "--params", "params.yaml"],
}


@pytest.mark.parametrize("command", sorted(PARAMS_COMMANDS))
@pytest.mark.parametrize("case", sorted(HOSTILE_PARAMS))
def test_hostile_params_fail_fast_in_one_line(tmp_path, monkeypatch, tally, command, case):
    if command in ("sweep", "train-final"):
        pytest.importorskip("ray")
    text, says = HOSTILE_PARAMS[case]
    (tmp_path / "params.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    args = [a.format(tmp=tmp_path) for a in PARAMS_COMMANDS[command]]
    before = snapshot(tmp_path)
    done = invoke_bounded(*args, timeout=30)
    judge(tally, done, before=before, after=snapshot(tmp_path), names=("params.yaml", says))


#: name -> best.json content: nesting and config values train-final cannot take.
HOSTILE_BEST = {
    "deep": "[" * 100_000 + "]" * 100_000,
    "just-deep-enough": '{"config": ' + "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH + "}",
    "lr-text": json.dumps({"config": {"model": "capsnet-small", "lr": "abc"}}),
    "lr-list": json.dumps({"config": {"model": "capsnet-small", "lr": [0.1]}}),
    "lr-nan": '{"config": {"model": "capsnet-small", "lr": NaN}}',
    "lr-overflow": '{"config": {"model": "capsnet-small", "lr": 1e999}}',
    "lr-bool": json.dumps({"config": {"model": "capsnet-small", "lr": True}}),
    "routing-fraction": json.dumps({"config": {"model": "capsnet", "routing_iterations": 2.5}}),
    "model-list": json.dumps({"config": {"model": ["capsnet"]}}),
    "config-list": json.dumps({"config": [1, 2]}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_BEST))
def test_hostile_best_json_fails_train_final_in_one_line(
    tmp_path, monkeypatch, tally, prepared_root, case
):
    pytest.importorskip("ray")
    best = tmp_path / "best.json"
    best.write_text(HOSTILE_BEST[case])
    (tmp_path / "params.yaml").write_text("train:\n  out_dir: models\n")
    monkeypatch.chdir(tmp_path)
    args = ["train-final", "--best", best, "--data-root", prepared_root]
    before = snapshot(tmp_path)
    done = invoke_bounded(*args, timeout=60, env=NO_MIRROR)
    judge(tally, done, before=before, after=snapshot(tmp_path), names=("best.json",))
    assert not (tmp_path / "models").exists()


def _norb_root(tmp_path: Path, n: int = 10) -> Path:
    """A data root holding raw smallNORB files of ``n`` items per split."""
    raw = tmp_path / "data" / "raw" / "smallnorb"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        images = rng.integers(0, 255, (n, 2, 96, 96)).astype(np.uint8)  # (N, 2, 96, 96)
        index = np.arange(n)
        info = np.stack([index % 10, index % 9, index % 18 * 2, index % 6], 1)  # (N, 4)
        write_norb(raw / smallnorb.filename(split, "dat"), images)
        write_norb(raw / smallnorb.filename(split, "cat"), (index % 5).astype(np.int32))
        write_norb(raw / smallnorb.filename(split, "info"), info.astype(np.int32))
    (raw / smallnorb.SOURCE_FILE).write_text(f"{smallnorb.SYNTH}\n")  # not the official files
    return tmp_path / "data"


def _header_edit(magic: int | None = None, dims: list[int] | None = None, ndim: int | None = None):
    def edit(data: bytes) -> bytes:
        header = np.frombuffer(data[:20], "<i4").copy()
        if magic is not None:
            header[0] = magic
        if ndim is not None:
            header[1] = ndim
        if dims is not None:
            header[2 : 2 + len(dims)] = dims
        return header.tobytes() + data[20:]

    return edit


#: (part, what is done to it, what the error says)
NORB_LIES = {
    "cat-as-float32": ("cat", _header_edit(magic=NORB_MAGIC["float32"]), "float32"),
    "cat-as-uint8": ("cat", _header_edit(magic=NORB_MAGIC["uint8"]), "uint8"),
    "info-as-float64": ("info", _header_edit(magic=NORB_MAGIC["float64"]), "float64"),
    "dat-as-int32": ("dat", _header_edit(magic=NORB_MAGIC["int32"]), "int32"),
    "cat-dims-wrap": ("cat", _header_edit(dims=[2**16, 2**16, 2**16]), "dims"),
    "cat-ndim-3-wrap": ("cat", _header_edit(ndim=3, dims=[2**20, 2**20, 2**12]), "dims"),
    "cat-negative": ("cat", _header_edit(dims=[-10]), "negative"),
    "info-dims-product-zero": ("info", _header_edit(dims=[0, 4]), "dims"),
}


@pytest.mark.parametrize("case", sorted(NORB_LIES))
def test_smallnorb_headers_that_lie_are_refused(tmp_path, monkeypatch, tally, case):
    import gzip

    part, edit, says = NORB_LIES[case]
    root = _norb_root(tmp_path)
    path = root / "raw" / "smallnorb" / smallnorb.filename("train", part)
    path.write_bytes(gzip.compress(edit(gzip.decompress(path.read_bytes())), mtime=0))
    (tmp_path / "params.yaml").write_text("data:\n  smallnorb:\n    enabled: true\n")
    monkeypatch.chdir(tmp_path)
    prepared = root / "prepared"
    done = invoke_bounded("data", "prepare", "smallnorb", "--data-root", root, timeout=120)
    judge(tally, done, before={}, after=snapshot(prepared), names=(path.name, says))


def _trickle_server(content_length: int, interval: float):
    """An HTTP server on localhost that sends one byte every ``interval`` seconds."""

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.server.paths.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(content_length))
            self.end_headers()
            try:
                for _ in range(content_length):
                    self.wfile.write(b"\x1f")
                    self.wfile.flush()
                    time.sleep(interval)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    server.paths = []  # every path asked for, in order
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _header_trickle_server(interval: float):
    """An HTTP server on localhost that answers with a status line, then one byte of an
    endless header every ``interval`` seconds: each byte comes well within any timeout."""

    class Trickle(socketserver.BaseRequestHandler):
        def handle(self):
            try:
                self.request.recv(65536)
                self.request.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while True:
                    self.request.sendall(b"a")
                    time.sleep(interval)
            except OSError:
                pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_mirror_trickling_its_headers_fails_at_the_total_deadline(tmp_path, monkeypatch, tally):
    """The deadline covers the status line and headers, not only the body."""
    monkeypatch.setattr(mnist, "OFFICIAL_BASES", ())  # the mirror alone: no offline retries
    monkeypatch.chdir(tmp_path)
    server = _header_trickle_server(0.2)
    try:
        mirror = f"http://127.0.0.1:{server.server_address[1]}"
        env = {"CAPSNET_DOWNLOAD_DEADLINE": "2", "CAPSNET_MIRROR": None}
        root = tmp_path / "data"
        args = ["data", "download", "mnist", "--data-root", root, "--mirror", mirror]
        done = invoke_bounded(*args, timeout=90, env=env)
    finally:
        server.shutdown()
    judge(tally, done, before={}, after=snapshot(root / "raw"), names=("deadline",))


def test_a_trickling_mirror_fails_at_the_total_deadline(tmp_path, monkeypatch, tally):
    monkeypatch.setattr(mnist, "OFFICIAL_BASES", ())  # the mirror alone: no offline retries
    monkeypatch.chdir(tmp_path)
    server = _trickle_server(1000, 0.5)
    try:
        mirror = f"http://127.0.0.1:{server.server_port}"
        env = {"CAPSNET_DOWNLOAD_DEADLINE": "2", "CAPSNET_MIRROR": None}
        root = tmp_path / "data"
        started = time.monotonic()
        args = ["data", "download", "mnist", "--data-root", root, "--mirror", mirror]
        done = invoke_bounded(*args, timeout=90, env=env)
        took = time.monotonic() - started
    finally:
        server.shutdown()
    judge(tally, done, before={}, after=snapshot(root / "raw"), names=("deadline",))
    assert took < 60, took


def test_a_mirror_slower_than_the_speed_floor_fails_naming_the_url(tmp_path, monkeypatch, tally):
    """A byte every 0.2 s is far below a floor of 1 KiB/s over 1 s (the default window is
    30 s): the transfer is given up after a window or two, once, naming the URL."""
    from capsnet.data import sources

    monkeypatch.setattr(sources, "SPEED_FLOOR", sources.SpeedFloor(1024, 1.0))
    monkeypatch.setattr(mnist, "OFFICIAL_BASES", ())  # the mirror alone: no offline retries
    monkeypatch.chdir(tmp_path)
    server = _trickle_server(100_000, 0.2)
    try:
        mirror = f"http://127.0.0.1:{server.server_port}"
        root = tmp_path / "data"
        done = invoke_bounded(
            "data", "download", "mnist", "--data-root", root, "--mirror", mirror, timeout=90
        )
    finally:
        server.shutdown()
    url = f"{mirror}/mnist/{server.paths[0].rsplit('/', 1)[-1]}"
    judge(tally, done, before={}, after=snapshot(root / "raw"), names=(url, "slower than"))
    assert len(server.paths) == 1, server.paths  # given up, not retried


@pytest.mark.parametrize("endless", ["/dev/zero", "/dev/urandom", "fifo", "directory"])
def test_a_mirror_entry_that_is_no_regular_file_is_refused_unopened(
    tmp_path, monkeypatch, tally, mnist_mirror, endless
):
    monkeypatch.setattr(mnist, "OFFICIAL_BASES", ())  # the mirror alone: no offline retries
    monkeypatch.chdir(tmp_path)
    mirror = tmp_path / "mirror" / "mnist"
    mirror.mkdir(parents=True)
    for gz in (mnist_mirror / "mnist").glob("*.gz"):
        (mirror / gz.name).symlink_to(gz)
    bad = mirror / "train-labels-idx1-ubyte.gz"
    bad.unlink()
    if endless == "fifo":
        os.mkfifo(bad)  # opening it would wait for a writer forever
    elif endless == "directory":
        bad.mkdir()
    else:
        bad.symlink_to(endless)  # a device: a blocking one would hang any read
    root = tmp_path / "data"
    done = invoke_bounded(
        "data", "download", "mnist", "--data-root", root, "--mirror", mirror.parent, timeout=120
    )
    says = "a directory" if endless == "directory" else "not a regular file"
    judge(tally, done, names=("train-labels-idx1-ubyte.gz", says))
    assert not (root / "raw" / "mnist" / bad.name).exists()
    assert [p.name for p in (root / "raw" / "mnist").iterdir() if p.name.startswith(".")] == []


def test_a_zip_bomb_checkpoint_is_refused_before_it_inflates(tmp_path, tally, prepared_root):
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        with archive.open("archive/data/0", "w", force_zip64=True) as member:
            block = bytes(1 << 20)
            for _ in range(256):  # 256 MiB of zeros, about 256 KB on disk: 1000x its size
                member.write(block)
    out = tmp_path / "out.json"
    done = invoke_bounded(
        "eval", bomb, "--limit", "8", "--data-root", prepared_root, "--out", out, timeout=60
    )
    judge(tally, done, names=("bomb.pt", "inflate"))
    assert not out.exists()


def _special_outputs(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"fifo": fifo, "char-device": Path("/dev/null"), "proc": Path("/proc/capsnet-x")}


@pytest.mark.parametrize("target", ["fifo", "char-device", "proc"])
@pytest.mark.parametrize("command", ["train", "eval", "data show"])
def test_special_outputs_are_refused_before_work(
    tmp_path, monkeypatch, tally, prepared_root, lenet_checkpoint, target, command
):
    out = _special_outputs(tmp_path)[target]
    before = os.stat(out) if out.exists() else None
    args = {
        "train": ["train", "--model", "lenet5", "--epochs", "1", "--data-root", prepared_root],
        "eval": ["eval", lenet_checkpoint, "--limit", "8", "--data-root", prepared_root],
        "data show": ["data", "show", "mnist", "--data-root", prepared_root],
    }[command]
    monkeypatch.chdir(tmp_path)
    done = invoke_bounded(*args, "--out", out, timeout=120)
    judge(tally, done, names=(str(out),))
    assert "--out" in done.lines[0]
    if before is not None:
        after = os.stat(out)
        assert (after.st_mode, after.st_ino, after.st_rdev) == (
            before.st_mode,
            before.st_ino,
            before.st_rdev,
        )


def test_a_kernel_storage_path_is_blamed_on_its_setting(
    tmp_path, monkeypatch, tally, prepared_root
):
    pytest.importorskip("ray")
    (tmp_path / "params.yaml").write_text("sweep:\n  storage_path: /proc/ray\n")
    monkeypatch.chdir(tmp_path)
    done = invoke_bounded("sweep", "--data-root", prepared_root, timeout=120)
    judge(tally, done, names=("sweep.storage_path", "/proc/ray"))
    assert "--out" not in done.lines[0]


def test_a_planted_old_copy_never_becomes_the_output(tmp_path, tally, mnist_mirror):
    """A ``.old`` directory beside a missing output, left by a writer whose pid is gone,
    stays debris: the next writer fails here (a corrupt raw file), and no output appears."""
    from capsnet.io.files import _HOST

    root = tmp_path / "data"
    raw = root / "raw" / "mnist"
    raw.mkdir(parents=True)
    for gz in (mnist_mirror / "mnist").glob("*.gz"):
        (raw / gz.name).write_bytes(gz.read_bytes())
    (raw / "train-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b not gzip")
    planted = root / "prepared" / f".mnist.{_HOST}-999999999-0badf00d.old"
    planted.mkdir(parents=True)
    (planted / "train.pt").write_text("planted")
    done = invoke_bounded("data", "prepare", "mnist", "--data-root", root, env=NO_MIRROR)
    judge(tally, done, names=("train-labels-idx1-ubyte.gz",))
    assert not (root / "prepared" / "mnist").exists()


@pytest.mark.parametrize("label", ["no SOURCE.txt", "smallnorb"])
def test_smallnorb_files_that_are_not_the_official_ones_are_not_prepared_as_real(
    tmp_path, monkeypatch, tally, label
):
    """Raw files that fail the official MD5s are refused unless SOURCE.txt labels them the
    stand-in: neither a missing label nor one saying smallnorb makes them real."""
    root = _norb_root(tmp_path)
    marker = root / "raw" / "smallnorb" / smallnorb.SOURCE_FILE
    if label == "no SOURCE.txt":
        marker.unlink()
    else:
        marker.write_text(f"{label}\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("data:\n  smallnorb:\n    enabled: true\n")
    done = invoke_bounded("data", "prepare", "smallnorb", "--data-root", root)
    first = smallnorb.filename("train", "dat")
    judge(
        tally, done, before={}, after=snapshot(root / "prepared"), names=(first, "not the official")
    )


def test_auto_says_which_mirror_file_failed_before_using_the_stand_in(
    tmp_path, monkeypatch, tally, capsys
):
    """One corrupt file in a mirror that holds all six (their MD5s taken as the official
    ones here): ``source: auto`` renders the stand-in, and says why in one line."""
    import gzip
    import hashlib

    from capsnet.config import SmallnorbParams

    mirror = _norb_root(tmp_path / "mirror") / "raw"  # <mirror>/smallnorb/<file>
    files = {key: mirror / "smallnorb" / smallnorb.filename(*key) for key in smallnorb.RAW_MD5}
    digests = {
        k: hashlib.md5(gzip.decompress(p.read_bytes())).hexdigest() for k, p in files.items()
    }
    monkeypatch.setattr(smallnorb, "RAW_MD5", digests)
    monkeypatch.setattr(smallnorb, "RAW_SIZE", {"dat": 1 << 20, "cat": 1 << 20, "info": 1 << 20})
    bad = files[("test", "info")]
    bad.write_bytes(gzip.compress(b"not the file"))
    rendered = []
    used = smallnorb.obtain(
        tmp_path / "raw", SmallnorbParams(), str(mirror), stand_in=lambda *a: rendered.append(a)
    )
    tally.inputs += 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert used == smallnorb.SYNTH and rendered
    assert len(lines) == 1 and bad.name in lines[0] and "MD5 mismatch" in lines[0], lines
    assert smallnorb.raw_source(tmp_path / "raw") == smallnorb.SYNTH
