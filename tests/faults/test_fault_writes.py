"""Faults while writing: outputs under a regular file, a full disk, a read-only file system,
a write that fails and a process killed at chosen points of publishing its outputs. A failed
run leaves no output that looks complete (only recognisable temporaries, which the next run
removes), an earlier output stays as it was, and the error is one line."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from faulthelpers import (
    debris,
    file_size_limit,
    invoke,
    judge,
    run_injected,
    run_injected_each,
    snapshot,
    tmpfs,
)

from capsnet.models import checkpoint

#: A few batches of lenet5: the smallest training that writes a real run directory.
TINY_TRAIN = [
    "train", "--model", "lenet5", "--train-limit", "32", "--val-size", "0", "--test-limit",
    "32", "--batch-size", "16", "--augment", "none",
]  # fmt: skip


def train_args(root: Path, out: Path) -> list:
    return [*TINY_TRAIN, "--data-root", root, "--out", out]


@pytest.mark.parametrize(
    "section, key, command",
    [
        ("evaluate", "out_dir", "evaluate-stage"),
        ("viewpoints", "out_dir", "viewpoints"),
        ("train", "out_dir", "train-final"),
        ("sweep", "storage_path", "sweep"),
        ("publish", "html", "publish"),
    ],
)
def test_a_params_output_under_a_file_is_refused_before_work(
    tmp_path, monkeypatch, tally, blocker, section, key, command
):
    if command in ("sweep", "train-final", "publish"):
        pytest.importorskip("ray")
    monkeypatch.chdir(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(f"{section}:\n  {key}: {blocker / 'out'}\n")
    done = invoke(command, "--params", params)
    judge(tally, done, code=1, names=(f"{section}.{key}", str(blocker)))


def test_a_full_disk_fails_training_in_one_line_and_leaves_nothing(tally, prepared_root, full_disk):
    out = full_disk / "run"
    done = invoke(*train_args(prepared_root, out))
    judge(tally, done, fault=True, before={}, after=snapshot(full_disk / "run"))
    assert f"{out}/model.pt: no space left on device" in done.lines[0]
    assert "(--out)" in done.lines[0]
    assert debris(full_disk) == []


def test_a_file_size_limit_while_saving_the_checkpoint_is_one_line(tmp_path, tally, prepared_root):
    """``ulimit -f`` below a lenet5 checkpoint (about 250 KB): the write fails inside the
    save; the line names the limit and --out, and no run directory appears."""
    out = tmp_path / "run"
    with file_size_limit(64 * 1024):
        done = invoke(*train_args(prepared_root, out))
    judge(tally, done, fault=True, before={}, after=snapshot(out))
    assert f"{out}/model.pt: file too large" in done.lines[0] and "(--out)" in done.lines[0]
    assert not out.exists() and debris(tmp_path) == []


@pytest.mark.parametrize("what", ["eval-json", "figure"])
def test_a_full_disk_fails_small_writes_in_one_line(
    tally, prepared_root, lenet_checkpoint, full_disk, what
):
    if what == "eval-json":
        target = full_disk / "results.json"
        args = ["eval", lenet_checkpoint, "--limit", "8", "--out", target]
    else:
        target = full_disk / "grid.png"
        args = ["data", "show", "mnist", "--out", target, "--count", "4"]
    done = invoke(*args, "--data-root", prepared_root)
    judge(tally, done, fault=True, names=("no space left on device",))
    assert not target.exists() and debris(full_disk) == []


def test_a_full_disk_during_prepare_publishes_no_prepared_data(tmp_path, tally, mnist_mirror):
    with tmpfs(tmp_path / "small", "size=16m") as root:
        raw = root / "raw" / "mnist"
        raw.mkdir(parents=True)
        for gz in (mnist_mirror / "mnist").glob("*.gz"):
            shutil.copy(gz, raw / gz.name)
        done = invoke("data", "prepare", "mnist", "--data-root", root, env={"CAPSNET_MIRROR": ""})
        judge(tally, done, fault=True, before={}, after=snapshot(root / "prepared"))
        assert "no space left on device" in done.lines[0]


def test_a_read_only_file_system_is_refused_before_work(
    tally, prepared_root, lenet_checkpoint, read_only
):
    cases = [
        (train_args(prepared_root, read_only / "run"), "'--out'"),
        (["eval", lenet_checkpoint, "--out", read_only / "e.json"], "'--out'"),
        (["data", "prepare", "mnist", "--data-root", read_only / "data"], "'--data-root'"),
    ]
    for args, option in cases:
        done = invoke(*args)
        judge(tally, done, fault=True, code=2, names=(option, "read-only file system"))


@pytest.mark.parametrize(
    "target, code",
    [
        ("os.replace", errno.EIO),
        ("os.fsync", errno.ENOSPC),
        ("capsnet.io.files.new_temp_file", errno.EACCES),
    ],
)
def test_a_failing_write_of_eval_results_leaves_no_file(
    tmp_path, monkeypatch, tally, prepared_root, lenet_checkpoint, target, code
):
    import importlib
    import os

    module_name, attribute = target.rsplit(".", 1)
    module = importlib.import_module(module_name)
    real = getattr(module, attribute)

    def failing(*args, **kwargs):
        if "results" in str(args) or attribute == "fsync":
            raise OSError(code, os.strerror(code))
        return real(*args, **kwargs)

    out = tmp_path / "results.json"
    monkeypatch.setattr(module, attribute, failing)
    args = ["eval", lenet_checkpoint, "--limit", "8", "--data-root", prepared_root]
    done = invoke(*args, "--out", out)
    monkeypatch.undo()
    judge(tally, done, fault=True, before={}, after=snapshot(tmp_path))
    assert debris(tmp_path) == []


def test_training_killed_while_publishing_leaves_no_run_and_the_next_run_cleans_up(
    tmp_path, tally, prepared_root
):
    """Kill at the rename of model.pt (1) or metrics.json (2) into the staging directory,
    or of the staging directory into place (3): each in a folder of its own, each kill a
    fork of one child process."""
    outs = {nth: tmp_path / str(nth) / "run" for nth in (1, 2, 3)}
    for out in outs.values():
        out.parent.mkdir()
    cases = [(train_args(prepared_root, out), nth) for nth, out in outs.items()]
    outcomes = run_injected_each(cases, "os.replace", "run", "kill")
    for (nth, out), killed in zip(outs.items(), outcomes):
        assert killed.code == 137, (nth, killed.stderr)
        judge(tally, killed, fault=True, before={}, after=snapshot(out), killed=True)
        left = debris(out.parent)
        assert all(p.name.startswith(".run.") for p in left), left
        again = invoke(*train_args(prepared_root, out))
        assert again.code == 0, again.stderr
        assert debris(out.parent) == []
        assert checkpoint.load(out / "model.pt")[0] is not None


def test_training_killed_while_replacing_an_earlier_run_keeps_it(
    tmp_path, monkeypatch, tally, prepared_root
):
    """Killed at the exchange of the new run with the earlier one (a child process), or the
    exchange failing (in this process): the earlier run stays as it was."""
    from capsnet.io import files

    out = tmp_path / "run"
    first = invoke(*train_args(prepared_root, out))
    assert first.code == 0, first.stderr
    before = snapshot(out)
    killed = run_injected(
        train_args(prepared_root, out), "capsnet.io.files.exchange", "run", 1, "kill"
    )
    assert killed.code == 137, killed.stderr
    judge(tally, killed, fault=True, before=before, after=snapshot(out), killed=True)
    real_exchange = files.exchange

    def failing_exchange(*args, **kwargs):
        if "run" in " ".join(map(str, args)):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_exchange(*args, **kwargs)

    monkeypatch.setattr(files, "exchange", failing_exchange)
    failed = invoke(*train_args(prepared_root, out))
    monkeypatch.undo()
    judge(tally, failed, fault=True, before=before, after=snapshot(out), names=(f"--out {out}",))
    again = invoke(*train_args(prepared_root, out))
    assert again.code == 0 and debris(tmp_path) == [], again.stderr


def test_prepare_killed_mid_publish_leaves_no_prepared_data(tmp_path, tally, mnist_mirror):
    root = tmp_path / "data"
    raw = root / "raw" / "mnist"
    raw.mkdir(parents=True)
    for gz in (mnist_mirror / "mnist").glob("*.gz"):
        (raw / gz.name).symlink_to(gz)
    args = ["data", "prepare", "mnist", "--data-root", root]
    killed = run_injected(args, "os.replace", "prepared", 2, "kill")
    assert killed.code == 137, killed.stderr
    judge(tally, killed, fault=True, before={}, after=snapshot(root / "prepared"), killed=True)
    again = invoke(*args, env={"CAPSNET_MIRROR": ""})
    assert again.code == 0, again.stderr
    assert debris(root) == []
    assert sorted(p.name for p in (root / "prepared" / "mnist").iterdir()) == [
        "test.pt",
        "train.pt",
    ]


def test_ctrl_c_while_writing_is_exit_130_and_leaves_no_file(
    tmp_path, monkeypatch, tally, prepared_root, lenet_checkpoint
):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "results.json"
    monkeypatch.setattr(os, "replace", interrupted)
    args = ["eval", lenet_checkpoint, "--limit", "8", "--data-root", prepared_root]
    done = invoke(*args, "--out", out)
    monkeypatch.undo()
    judge(
        tally,
        done,
        fault=True,
        before={},
        after=snapshot(tmp_path),
        code=130,
        prefix="Interrupted.",
    )
    assert debris(tmp_path) == []
