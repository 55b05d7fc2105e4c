"""capsnet.io.files and capsnet.io.outputset: atomic files and directories, stale temporaries, the
lock, the DISABLED marker."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capsnet.io import files as io
from capsnet.io import outputset
from capsnet.io.errors import CapsnetError

#: Patterns that own every file: for the tests of the swap itself.
ANY = ("*",)


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
    with outputset.atomic_directory(tmp_path / "d", ANY) as tmp:
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
    with outputset.atomic_directory(target, ANY) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.")
        assert (target / "stale.txt").exists()  # the old one stays until the block succeeds
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_failed_directory_publish_keeps_old_one(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(ValueError), outputset.atomic_directory(target, ANY) as tmp:
        (tmp / "half.txt").write_text("half")
        raise ValueError("stage failed")
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_directory_publish_replaces_a_file(tmp_path):
    target = tmp_path / "out"
    target.write_text("a file where the directory goes")
    with outputset.atomic_directory(target, ANY) as tmp:
        (tmp / "x").write_text("1")
    assert target.is_dir() and (target / "x").read_text() == "1"


def test_disabled_marker_round_trip(tmp_path):
    out = tmp_path / "stage"
    out.mkdir()
    (out / "result.csv").write_text("old result")
    assert io.read_disabled(out) is None
    outputset.write_disabled(out, "data.smallnorb.enabled is false\n\n", own=("*.csv",))
    assert sorted(p.name for p in out.iterdir()) == [io.DISABLED_MARKER]
    assert (out / "DISABLED.txt").read_text() == "data.smallnorb.enabled is false\n"
    assert io.read_disabled(out) == "data.smallnorb.enabled is false"
    io.clear_disabled(out)
    assert io.read_disabled(out) is None
    io.clear_disabled(out)  # nothing to remove is fine


def test_write_disabled_in_place_keeps_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("kept")
    outputset.write_disabled(tmp_path, "switched off", [tmp_path / "best.json"], replace=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DISABLED.txt", "best.json", "notes.txt"]
    assert io.read_disabled(tmp_path) == "switched off"
    assert json.loads((tmp_path / "best.json").read_text()) == {"disabled": "switched off"}


def test_write_disabled_publishes_files_inside_and_beside_as_one_unit(tmp_path):
    out, beside = tmp_path / "out", tmp_path / "out.csv"
    outputset.write_disabled(out, "off", [out / "r.json", tmp_path / "m.json"], {beside: "h\n"})
    assert sorted(p.name for p in out.iterdir()) == ["DISABLED.txt", "r.json"]
    assert (tmp_path / "m.json").read_text() == '{\n  "disabled": "off"\n}\n'
    assert beside.read_text() == "h\n"


def test_write_disabled_changes_nothing_when_one_target_cannot_be_replaced(tmp_path):
    """A target refused (a directory where a file goes) leaves every output as it was: no
    DISABLED directory beside an old CSV that would look current."""
    out = tmp_path / "out"
    (out / "model.pt").parent.mkdir()
    (out / "model.pt").write_text("weights")
    (tmp_path / "out.csv").mkdir()
    with pytest.raises(CapsnetError, match=r"out\.csv: is a directory"):
        outputset.write_disabled(out, "off", files={tmp_path / "out.csv": "h\n"}, own=("*.pt",))
    assert sorted(p.name for p in out.iterdir()) == ["model.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.csv"]


def _dead_pid() -> int:
    """The pid of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _temp_of(target, pid: int, suffix: str = ".tmp"):
    return target.with_name(f".{target.name}.{io._HOST}-{pid}-0badf00d{suffix}")


@pytest.mark.parametrize(
    "umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775)]
)
def test_modes_under_common_umasks(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        io.atomic_write_text(tmp_path / "a.txt", "x")
        with outputset.atomic_directory(tmp_path / "d", ANY) as tmp:
            io.atomic_write_text(tmp / "inner.txt", "y")
            (tmp / "sub").mkdir()
        with io.locked(tmp_path / "root") as lock_path:
            lock_mode = _mode(lock_path)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a.txt") == file_mode
    assert _mode(tmp_path / "d" / "inner.txt") == file_mode
    assert _mode(tmp_path / "d") == _mode(tmp_path / "d" / "sub") == dir_mode
    assert _mode(tmp_path / "root") == dir_mode and lock_mode == file_mode


def test_stale_temporaries_of_dead_writers_removed_live_ones_kept(tmp_path):
    target = tmp_path / "metrics.json"
    dead = _temp_of(target, _dead_pid())
    dead.write_text("half")
    legacy = tmp_path / ".metrics.json.0123abcd.tmp"  # the older form, host and pid unknown
    legacy.mkdir()
    live = _temp_of(target, os.getppid())  # a running process: its write is in progress
    live.write_text("being written")
    foreign = target.with_name(".metrics.json.ffffff-1-0badf00d.tmp")  # another host, new
    foreign.write_text("x")
    user = [tmp_path / ".metrics.json.notes.tmp", tmp_path / "metrics.json.bak"]
    for path in user:
        path.write_text("user file")
    io.atomic_write_json(target, {"a": 1})
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["metrics.json", live.name, foreign.name, *(p.name for p in user)])
    old = time.time() - io.FOREIGN_STALE_SECONDS - 60
    os.utime(foreign, (old, old))
    assert io.remove_stale(target) == [foreign]


def test_an_old_copy_beside_a_missing_output_is_removed_never_renamed_in(tmp_path):
    """A ``.old`` directory (a dead writer's or a planted one) never becomes the output."""
    target = tmp_path / "out"
    pid = _dead_pid()
    old, staging = _temp_of(target, pid, ".old"), _temp_of(target, pid)
    old.mkdir()
    (old / "model.pt").write_text("planted")
    staging.mkdir()
    (staging / "model.pt").write_text("new, maybe incomplete")
    assert io.remove_stale(target) == [old, staging]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_failed_writer_leaves_no_planted_old_copy_as_the_output(tmp_path):
    target = tmp_path / "out"
    planted = _temp_of(target, _dead_pid(), ".old")
    planted.mkdir()
    (planted / "model.pt").write_text("planted")
    with pytest.raises(RuntimeError), outputset.atomic_directory(target, ANY) as tmp:
        (tmp / "model.pt").write_text("half")
        raise RuntimeError("the writer fails")
    assert not target.exists() and sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make", ["fifo", "device"])
def test_a_special_file_is_refused_not_replaced(tmp_path, make):
    if make == "fifo":
        target = tmp_path / "fifo"
        os.mkfifo(target)
    else:
        target = Path("/dev/null")
    before = os.stat(target)
    with pytest.raises(CapsnetError, match="not a regular file"):
        io.atomic_write_text(target, "x")
    with pytest.raises(CapsnetError, match="not a regular file"):
        with outputset.atomic_directory(target, ANY):
            pass
    after = os.stat(target)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (
        before.st_mode,
        before.st_ino,
        before.st_rdev,
    )
    assert [p.name for p in tmp_path.iterdir()] == (["fifo"] if make == "fifo" else [])


def test_read_json_bounds_nesting(tmp_path):
    deep = tmp_path / "best.json"
    for depth in (io.MAX_JSON_DEPTH + 1, 100_000):
        deep.write_text("[" * depth + "]" * depth)
        with pytest.raises(CapsnetError, match=f"nested deeper than {io.MAX_JSON_DEPTH}"):
            io.read_json(deep)
    deep.write_text("[" * io.MAX_JSON_DEPTH + "]" * io.MAX_JSON_DEPTH)
    assert io.json_depth(io.read_json(deep)) == io.MAX_JSON_DEPTH
    assert io.json_depth({"a": [1, {"b": 2}]}) == 3 and io.json_depth(7) == 0


def test_old_copy_beside_a_new_directory_is_removed(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "new.txt").write_text("new")
    old = _temp_of(target, _dead_pid(), ".old")
    old.mkdir()
    (old / "old.txt").write_text("old")
    with outputset.atomic_directory(target, ANY) as tmp:
        (tmp / "newer.txt").write_text("newer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in target.iterdir()) == ["newer.txt"]


def test_remove_stale_in_cleans_every_target(tmp_path):
    pid = _dead_pid()
    for name in ("a.pt", "b"):
        _temp_of(tmp_path / name, pid).write_text("x")
    (tmp_path / "keep.txt").write_text("k")
    removed = io.remove_stale_in(tmp_path)
    assert sorted(p.name.split(".")[1] for p in removed) == ["a", "b"]
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("can_exchange", [True, False])
def test_directory_swap_with_and_without_exchange(tmp_path, monkeypatch, can_exchange):
    if not can_exchange:
        monkeypatch.setattr(io, "exchange", lambda a, b: False)
    target = tmp_path / "out"
    for content in ("first", "second", "third"):
        with outputset.atomic_directory(target, ANY) as tmp:
            (tmp / "f").write_text(content)
        assert (target / "f").read_text() == content
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_exchange_swaps_two_paths(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.write_text("file")
    if not io.exchange(a, b):
        pytest.skip("no renameat2 exchange on this system")
    assert a.read_text() == "file" and b.is_dir()


LOCK_HOLDER = """
import sys, time
from capsnet.io import files as io, outputset
with io.locked(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _hold_lock(directory, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(directory), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_lock_waits_for_the_holder_and_says_so(tmp_path, capsys):
    holder = _hold_lock(tmp_path, 1.0)
    start = time.monotonic()
    try:
        with io.locked(tmp_path) as lock_path:
            waited = time.monotonic() - start
            assert lock_path == tmp_path / ".capsnet.lock"
            assert lock_path.read_text() == f"{os.getpid()}\n"
    finally:
        holder.wait()
    assert waited > 0.5
    err = capsys.readouterr().err
    assert f"waiting for {tmp_path / '.capsnet.lock'}" in err and f"pid {holder.pid}" in err
    assert list(tmp_path.iterdir()) == []  # the lock file goes with its holder


def test_lock_timeout_is_one_clear_error(tmp_path, monkeypatch):
    holder = _hold_lock(tmp_path, 5.0)
    try:
        with pytest.raises(CapsnetError, match=r"still writing to .* after 0\.3 s"):
            with io.locked(tmp_path, timeout=0.3):
                pass
        monkeypatch.setenv(io.LOCK_TIMEOUT_ENV, "0")
        with pytest.raises(CapsnetError, match=r"after 0 s"), io.locked(tmp_path):
            pass
        monkeypatch.setenv(io.LOCK_TIMEOUT_ENV, "nan")
        with pytest.raises(CapsnetError, match=r"CAPSNET_LOCK_TIMEOUT='nan'"), io.locked(tmp_path):
            pass
    finally:
        holder.kill()
        holder.wait()
    with io.locked(tmp_path, timeout=5):  # released by the killed holder's death
        pass


def test_lock_is_reentrant_and_serialises_swaps(tmp_path):
    with io.locked(tmp_path), io.locked(tmp_path):
        with outputset.atomic_directory(tmp_path / "out", ANY) as tmp:  # locks tmp_path again
            (tmp / "x").write_text("1")
        assert (tmp_path / ".capsnet.lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_directory_holding_foreign_files_is_never_replaced(tmp_path):
    """The one output-directory rule: only what the writer makes (its patterns, at any
    depth, DISABLED.txt and debris) may be replaced; anything else refuses the swap."""
    target = tmp_path / "out"
    (target / "azimuth").mkdir(parents=True)
    (target / "azimuth" / "old.pt").write_text("old")
    (target / "azimuth" / "notes.txt").write_text("mine")
    (target / "DISABLED.txt").write_text("off")
    own = ("results.json", "azimuth/*.pt")
    assert outputset.foreign_files(target, own) == ["azimuth/notes.txt"]
    for publish in (
        lambda: outputset.atomic_directory(target, own).__enter__(),
        lambda: outputset.write_disabled(target, "off", own=own),
    ):
        with pytest.raises(CapsnetError, match=r"out holds files .*azimuth/notes\.txt"):
            publish()
        assert (target / "azimuth" / "notes.txt").read_text() == "mine"
    (target / "azimuth" / "notes.txt").unlink()
    with outputset.atomic_directory(target, own) as tmp:
        (tmp / "results.json").write_text("{}")
    assert sorted(p.name for p in target.iterdir()) == ["results.json"]


def test_a_foreign_file_dropped_in_while_the_writer_works_is_kept(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(CapsnetError, match=r"notes\.txt"):
        with outputset.atomic_directory(target, ("*.pt",)) as tmp:
            (tmp / "model.pt").write_text("new")
            target.mkdir()
            (target / "notes.txt").write_text("mine")
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_read_only_file_is_never_replaced_by_an_atomic_write(tmp_path):
    target = tmp_path / "results.csv"
    target.write_text("kept")
    target.chmod(0o444)
    with pytest.raises(CapsnetError, match=r"results\.csv: read-only"):
        io.atomic_write_text(target, "new")
    assert target.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EDQUOT])
def test_a_write_error_without_a_path_names_the_output(tmp_path, monkeypatch, code):
    def failing(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError) as raised:
        io.atomic_write_text(tmp_path / "out.csv", "x")
    assert raised.value.errno == code and raised.value.filename == str(tmp_path / "out.csv")


@pytest.mark.parametrize(
    "make, kind, problem",
    [
        ("fifo", "file", "a FIFO (named pipe), not a regular file"),
        ("fifo", "directory", "a FIFO (named pipe), not a directory"),
        ("file", "directory", "is a file, not a directory"),
        ("dir", "file", "is a directory, not a file"),
        ("nul", "file", "holds a NUL byte"),
    ],
)
def test_the_one_input_check(tmp_path, make, kind, problem):
    path = tmp_path / "input"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "file":
        path.write_text("x")
    elif make == "dir":
        path.mkdir()
    else:
        path = tmp_path / "in\x00put"
    assert problem in io.input_problem(path, kind)
    with pytest.raises(CapsnetError, match="input"):
        io.check_input(path, kind=kind)
