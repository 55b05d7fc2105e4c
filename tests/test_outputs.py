"""Outputs that belong together are published together, killed runs leave nothing that
survives the next run, writers of one data root take turns, and modes follow the umask.

Kills are real: a child process is stopped with ``os._exit(9)`` (no cleanup runs) at a
chosen point of a write, then the parent checks what a reader would find.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from clihelpers import invoke_cli

from capsnet import models
from capsnet.config import SweepConfig
from capsnet.io import files as io
from capsnet.models import checkpoint
from capsnet.training.fit import TrainConfig


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _run_child(script: str, *args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, cwd=cwd
    )


def _exchange_works(tmp_path: Path) -> bool:
    a, b = tmp_path / "probe-a", tmp_path / "probe-b"
    a.mkdir()
    b.mkdir()
    try:
        return io.exchange(a, b)
    finally:
        a.rmdir()
        b.rmdir()


def _debris(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# --- capsnet train --out DIR: model.pt and metrics.json together -----------------------------

#: A child that publishes a run directory as ``capsnet train`` does once per (OUT, FAULT) of
#: its JSON argument, each time in a fork of itself that dies at FAULT (one interpreter and
#: its imports for every kill); prints each fork's exit code by FAULT as JSON.
SAVE_RUNS = r"""
import json, os, sys, traceback
from pathlib import Path
from types import SimpleNamespace
import torch
from capsnet.io import files as io
from capsnet import models
from capsnet.training.fit import TrainConfig
from capsnet.cli.train_commands import _save

torch.set_num_threads(1)  # no thread pool for the forks to inherit


def die(*args, **kwargs):
    os._exit(9)


def save_and_die(out, label, fault):
    real_replace, real_exchange = os.replace, io.exchange

    def exchange_then_die(a, b):
        real_exchange(a, b)
        die()

    def replace_then_die(src, dst):
        real_replace(src, dst)
        if Path(src if fault == "after-aside" else dst) == out:
            die()

    if fault == "in-staging":  # model.pt written, metrics.json not yet
        io.atomic_write_json = die
    elif fault == "before-exchange":
        io.exchange = die
    elif fault == "after-exchange":  # the old run is still beside the new one
        io.exchange = exchange_then_die
    else:  # no exchange on this system: two renames, killed after the first or the second
        io.exchange = lambda a, b: False
        os.replace = replace_then_die
    model = models.build("lenet5")
    _save(out, SimpleNamespace(model=model, train_config=TrainConfig(), data={}), {"run": label})


codes = {}
for out, fault in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        try:
            save_and_die(Path(out), "new", fault)
        except BaseException:
            traceback.print_exc()
        os._exit(1)  # it should have died at FAULT
    codes[fault] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(codes))
"""


def _save_run(out: Path, label: str) -> None:
    from capsnet.cli.train_commands import _save

    result = SimpleNamespace(model=models.build("lenet5"), train_config=TrainConfig(), data={})
    _save(out, result, {"run": label})


def _run_label(out: Path) -> str:
    """The run in ``out``, after checking that model.pt and metrics.json belong together."""
    assert sorted(os.listdir(out)) == ["metrics.json", "model.pt"]
    label = json.loads((out / "metrics.json").read_text())["run"]
    assert checkpoint.load(out / "model.pt")[1]["metrics"]["run"] == label
    return label


#: fault -> the run a reader finds at OUT after the kill (None: nothing; the next writer
#: removes the old copy aside)
SAVE_FAULTS = {
    "in-staging": "old",
    "before-exchange": "old",
    "after-exchange": "new",
    "after-aside": None,
    "after-rename-in": "new",
}


def test_killed_saves_leave_old_or_new_run_never_a_mix(tmp_path):
    """Each fault in a folder of its own, holding an earlier run; the faults that need the
    renameat2 exchange only where it works."""
    exchange = _exchange_works(tmp_path)
    faults = {f: run for f, run in SAVE_FAULTS.items() if exchange or "exchange" not in f}
    outs = {fault: tmp_path / fault / "run" for fault in faults}
    for out in outs.values():
        out.parent.mkdir()
        _save_run(out, "old")
    killed = _run_child(SAVE_RUNS, json.dumps([[str(outs[f]), f] for f in faults]))
    assert killed.returncode == 0, killed.stderr
    assert json.loads(killed.stdout.strip().splitlines()[-1]) == dict.fromkeys(faults, 9)
    for fault, after_kill in faults.items():
        out = outs[fault]
        if after_kill is None:
            assert not out.exists() and any(n.endswith(".old") for n in _debris(out.parent))
            io.remove_stale(out)  # what the next writer does first: a .old is never put back
            assert not out.exists() and not any(n.endswith(".old") for n in _debris(out.parent))
        else:
            assert _run_label(out) == after_kill, fault
        _save_run(out, "next")
        assert _run_label(out) == "next"
        assert sorted(os.listdir(out.parent)) == ["run"], fault  # no staging, copy or lock


def test_run_dir_holding_other_files_is_refused_before_training(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    result = invoke_cli("train", "--model", "lenet5", "--epochs", "1", "--out", out)
    assert result.returncode == 2
    assert "notes.txt" in result.stderr and "--out" in result.stderr
    assert "epoch" not in result.stderr
    assert sorted(os.listdir(out)) == ["notes.txt"]


# --- the train stage: one models directory, never old and new checkpoints mixed --------------


def run_train_stage(tmp: Path, data_root, die_at: int, final: dict) -> None:
    """The train stage on ``tmp``/best.json with a fake (instant) training that kills the
    process (``os._exit(9)``, no cleanup) at its run ``die_at`` (0: never)."""
    import capsnet.training.run
    from capsnet.config import FinalTrainConfig
    from pipeline.final.stage import train_final

    calls = []

    def fake_train_run(spec, split=None, on_epoch=None, **kwargs):
        calls.append(spec.model)
        if len(calls) == die_at:
            os._exit(9)
        history = [{"epoch": 1, "train_loss": 1.0, "val_accuracy": 0.5, "seconds": 0.1}]
        return SimpleNamespace(model=models.build(spec.model), train_config=spec.train,
                               history=history, train_images=len(split.train),
                               train_seconds=0.1, clock_seconds=0.1, clock="process CPU time",
                               data={}, compile={})  # fmt: skip

    real, capsnet.training.run.train_run = capsnet.training.run.train_run, fake_train_run
    try:
        config = FinalTrainConfig.from_dict(final)
        sweep = SweepConfig.from_dict({"name": "tiny", "wandb": {"mode": "disabled"}})
        metrics = Path(config.out_dir) / "metrics.json"
        train_final(config, sweep, best_path=tmp / "best.json", data_root=data_root,
                    metrics_path=metrics, log=lambda line: None)  # fmt: skip
    finally:
        capsnet.training.run.train_run = real


#: A child running ``run_train_stage`` (arguments: tmp, data root, die_at, final as JSON,
#: the folder of this module).
TRAIN_STAGE = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[5])
from test_outputs import run_train_stage
run_train_stage(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]))
"""


def test_killed_train_stage_keeps_the_old_models_directory(tmp_path, mnist_root):
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    old = {"capsnet-small.pt": "old best", "metrics.json": '{"old": 1}'}
    for name, text in old.items():
        (models_dir / name).write_text(text)
    config = {"model": "capsnet-small", "routing_iterations": 1, "augment": "none"}
    (tmp_path / "best.json").write_text(json.dumps({"sweep": "tiny", "config": config}))
    final = {"epochs": 1, "train_size": 100, "val_size": 50, "out_dir": str(models_dir)}
    final |= {"seeds": 1, "equal_time": False}
    here = Path(__file__).parent
    killed = _run_child(TRAIN_STAGE, tmp_path, mnist_root, 2, json.dumps(final), here)
    assert killed.returncode == 9, killed.stderr
    assert {p.name: p.read_text() for p in models_dir.iterdir()} == old  # the first run's
    assert any(n.startswith(".models.") for n in _debris(tmp_path))  # checkpoint is staged

    run_train_stage(tmp_path, mnist_root, 0, final)  # the next run, in this process
    names = ["ORIGIN.json", "capsnet-small.pt", "lenet5.pt", "metrics.json"]
    assert sorted(os.listdir(models_dir)) == names
    assert set(json.loads((models_dir / "metrics.json").read_text())) == {
        "capsnet-small",
        "lenet5",
    }
    assert checkpoint.load(models_dir / "lenet5.pt")[1]["extra"]["role"] == "baseline"
    assert not [n for n in _debris(tmp_path) if n.startswith(".models.")]


def test_disabled_train_stage_replaces_the_directory_whole(tmp_path):
    from capsnet.io.outputset import write_disabled
    from pipeline.final.stage import model_dir_files

    out = tmp_path / "models-smallnorb"
    out.mkdir()
    (out / "em-capsnet-small.pt").write_text("from a run with the data on")
    own = model_dir_files()
    write_disabled(out, "data.smallnorb.enabled is false", [out / "metrics.json"], own=own)
    assert sorted(os.listdir(out)) == ["DISABLED.txt", "metrics.json"]
    elsewhere = tmp_path / "final.json"
    write_disabled(out, "still off", [elsewhere], own=own)
    assert sorted(os.listdir(out)) == ["DISABLED.txt"]
    assert json.loads(elsewhere.read_text()) == {"disabled": "still off"}


# --- the evaluate stage and the sweep: figures/ and plots/ whole, the manifest last ----------


def _eval_params(tmp_path: Path, models_dir: Path):
    from capsnet import config

    path = tmp_path / "params.yaml"
    path.write_text(
        f"evaluate:\n  models_dir: {models_dir}\n  out_dir: {tmp_path / 'eval'}\n"
        "  datasets: [mnist]\n"
    )
    return config.load(path)


def test_failed_evaluation_keeps_old_figures_and_metrics(tmp_path, monkeypatch):
    from capsnet.evaluation import stage
    from capsnet.evaluation.metrics import parse_results

    monkeypatch.chdir(tmp_path)  # no models or data of the checkout in reach
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    (models_dir / "a.pt").write_text("checkpoint")
    figures = tmp_path / "eval" / "figures"
    figures.mkdir(parents=True)
    (figures / "confusion-gone.png").write_bytes(b"old figure")
    (tmp_path / "eval" / "metrics.json").write_text('{"old": {}}\n')
    params = _eval_params(tmp_path, models_dir)

    def half_then_fail(paths, request, names, figures):
        (figures.fig_dir / "confusion-a.png").write_bytes(b"new figure")
        figures.written["confusion-a"] = figures.fig_dir / "confusion-a.png"
        raise RuntimeError("evaluation failed")

    monkeypatch.setattr(stage, "evaluate_checkpoints", half_then_fail)
    with pytest.raises(RuntimeError):
        stage.run_stage(params)
    assert os.listdir(figures) == ["confusion-gone.png"]
    assert (tmp_path / "eval" / "metrics.json").read_text() == '{"old": {}}\n'
    assert sorted(os.listdir(tmp_path / "eval")) == ["figures", "metrics.json"]

    def evaluate(paths, request, names, figures):
        (figures.fig_dir / "confusion-a.png").write_bytes(b"new figure")
        figures.written["confusion-a"] = figures.fig_dir / "confusion-a.png"
        return parse_results({"a": {"model": "lenet5", "checkpoint": str(paths[0])}})

    monkeypatch.setattr(stage, "evaluate_checkpoints", evaluate)
    written = stage.run_stage(params)
    assert written["confusion-a"] == figures / "confusion-a.png"
    assert os.listdir(figures) == ["confusion-a.png"]  # the removed model's figure is gone
    assert json.loads(written["metrics"].read_text())["a"]["model"] == "lenet5"
    assert sorted(os.listdir(tmp_path / "eval")) == [
        "figures",
        "metrics.json",
        "rotation.csv",
        "summary.json",
    ]


def test_evaluation_outputs_land_together_or_not_at_all(tmp_path, monkeypatch):
    """A failure while writing the files (after every figure is drawn) leaves the old
    figures, rotation.csv and metrics.json: nothing is swapped in before all is written."""
    from capsnet.evaluation import outputs, stage
    from capsnet.evaluation.metrics import parse_results

    monkeypatch.chdir(tmp_path)  # no models or data of the checkout in reach
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    (models_dir / "a.pt").write_text("checkpoint")
    out = tmp_path / "eval"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "rotation.png").write_bytes(b"old figure")
    for name in ("metrics.json", "rotation.csv", "summary.json"):
        (out / name).write_text(f"old {name}")
    params = _eval_params(tmp_path, models_dir)

    def evaluate(paths, request, names, figures):
        (figures.fig_dir / "rotation.png").write_bytes(b"new figure")
        figures.written["rotation"] = figures.fig_dir / "rotation.png"
        return parse_results({"a": {"model": "lenet5", "checkpoint": str(paths[0])}})

    def no_space(results):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(stage, "evaluate_checkpoints", evaluate)
    monkeypatch.setattr(outputs, "metrics_json", no_space)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(OSError, match="No space left"):
        stage.run_stage(params)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_sweep_outputs_plots_whole_and_best_last(tmp_path):
    from pipeline.sweep import results

    sweep = SweepConfig.from_dict({"name": "tiny"})
    out = tmp_path / "sweep"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "by_something_old.csv").write_text("stale")
    (out / "best.json").write_text('{"config": {"model": "old"}}')
    rows = [
        {"trial_id": "t1", "status": "TERMINATED", "model": "capsnet-small",
         "routing_iterations": 3, "augment": "none",
         "final_val_accuracy": 0.5, "final_val_rotated_accuracy": 0.25}
    ]  # fmt: skip
    best = {"config": {"model": "capsnet-small"}}
    written = results.write_outputs(out, rows, best, sweep)
    assert sorted(os.listdir(out / "plots")) == ["by_augment.csv", "by_routing.csv"]
    assert json.loads((out / "best.json").read_text()) == best
    assert os.path.getmtime(written["best"]) >= os.path.getmtime(written["results"])
    results.write_outputs(out, rows, None, sweep)  # no best trial: no best.json from before
    assert not (out / "best.json").exists()
    assert sorted(os.listdir(out)) == ["plots", "results.csv"]


# --- data: a killed extraction or prepare, two prepares at once, modes ----------------------

#: A child extracting a zip that dies after writing its first member.
EXTRACT = r"""
import os, shutil, sys
from capsnet.data import sources
real = shutil.copyfileobj
def copy_then_die(*args, **kwargs):
    real(*args, **kwargs)
    os._exit(9)
sources.shutil.copyfileobj = copy_then_die
sources.safe_extract_zip(sys.argv[1], sys.argv[2])
"""


def test_killed_extraction_is_cleaned_and_the_next_one_succeeds(tmp_path):
    archive = tmp_path / "test_batches.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for i in range(1, 4):
            zf.writestr(f"test_batches/{i}.mat", f"batch {i}")
    raw = tmp_path / "raw" / "affnist"
    target = raw / "test_batches"
    killed = _run_child(EXTRACT, archive, target)
    assert killed.returncode == 9, killed.stderr
    assert not target.exists()  # nothing that looks extracted
    assert _debris(raw)  # the killed run's staging directory
    legacy = target / ".test_batches.zip.k2j4x9_q"  # an orphan left inside by older versions
    legacy.mkdir(parents=True)
    (legacy / "9.mat").write_text("partial")
    from capsnet.data.sources import safe_extract_zip

    written = safe_extract_zip(archive, target)
    assert sorted(p.name for p in written) == ["1.mat", "2.mat", "3.mat"]
    assert sorted(p.name for p in target.rglob("*.mat")) == ["1.mat", "2.mat", "3.mat"]
    assert os.listdir(raw) == ["test_batches"]


@pytest.fixture
def raw_mnist_root(tmp_path, mnist_root) -> Path:
    """A fresh data root holding only the raw MNIST files."""
    root = tmp_path / "data"
    shutil.copytree(mnist_root / "raw", root / "raw")
    return root


def _prepare_cmd(root: Path) -> list[str]:
    return [sys.executable, "-m", "capsnet", "data", "prepare", "mnist", "--data-root", str(root)]


def _assert_prepared(root: Path) -> None:
    prepared = root / "prepared"
    assert os.listdir(prepared) == ["mnist"]
    assert sorted(os.listdir(prepared / "mnist")) == ["test.pt", "train.pt"]
    from capsnet.data import mnist

    images, labels = mnist.load_tensors(root, "test")
    assert images.shape[0] == labels.shape[0] == 10000
    assert sorted(os.listdir(root)) == ["prepared", "raw"]  # no lock file, no temporaries


def test_two_prepares_into_one_root_take_turns(raw_mnist_root, tmp_path):
    root = raw_mnist_root
    with io.locked(root):  # a third writer holds the root while both start
        procs = [
            subprocess.Popen(_prepare_cmd(root), stderr=subprocess.PIPE, text=True, cwd=tmp_path)
            for _ in range(2)
        ]
        for proc in procs:  # each says it waits, and does
            first = proc.stderr.readline()
            assert first.startswith(f"waiting for {root / '.capsnet.lock'}: another"), first
            assert str(os.getpid()) in first
        time.sleep(1)
        assert [p.poll() for p in procs] == [None, None]
        assert not (root / "prepared").exists()
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert "Traceback" not in "".join(errs)
    _assert_prepared(root)


#: A child running ``capsnet data prepare`` that dies while writing test.pt.
PREPARE_KILLED = r"""
import os, sys
from capsnet.data import store
real = store.save_prepared
def save_then_die(path, *args, **kwargs):
    if path.name == "test.pt":
        os._exit(9)
    return real(path, *args, **kwargs)
store.save_prepared = save_then_die
from capsnet.cli import main
main(["data", "prepare", "mnist", "--data-root", sys.argv[1]])
"""


def test_killed_prepare_leaves_nothing_the_next_run_keeps(raw_mnist_root, tmp_path, monkeypatch):
    """The killed run is a child process; the next run, in this process."""
    killed = _run_child(PREPARE_KILLED, raw_mnist_root, cwd=tmp_path)
    assert killed.returncode == 9, killed.stderr
    assert not (raw_mnist_root / "prepared" / "mnist").exists()
    assert _debris(raw_mnist_root / "prepared")
    monkeypatch.chdir(tmp_path)
    done = invoke_cli("data", "prepare", "mnist", "--data-root", raw_mnist_root)
    assert done.returncode == 0, done.stderr
    _assert_prepared(raw_mnist_root)


@pytest.mark.parametrize(
    "umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775)]
)
def test_prepared_data_and_downloads_follow_the_umask(
    tmp_path, monkeypatch, mnist_mirror, umask, file_mode, dir_mode
):
    """In this process, under ``umask`` (restored after)."""
    root = tmp_path / "data"
    monkeypatch.chdir(tmp_path)
    previous = os.umask(umask)
    try:
        for stage, extra in {"download": ["--mirror", mnist_mirror], "prepare": []}.items():
            done = invoke_cli("data", stage, "mnist", "--data-root", root, *extra)
            assert done.returncode == 0, done.stderr
    finally:
        os.umask(previous)
    for directory in (root / "raw" / "mnist", root / "prepared" / "mnist"):
        assert _mode(directory) == dir_mode
        for path in directory.iterdir():
            assert _mode(path) == file_mode, path
