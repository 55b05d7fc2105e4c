"""The error boundary against what the machine, W&B, Ray and damaged state raise: host
memory exhausted, W&B online without a key, an end of input (no interrupt), Ctrl+C (130
everywhere, ``capsnet sweep`` included, whose next run resumes), an unreachable Ray
address, a damaged tuner.pkl, errored trials reported by their cause, a checkpoint whose
comparison metadata has the wrong types. Each is one line, bounded by a deadline."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from faulthelpers import Outcome, invoke, judge, run_bounded, snapshot
from tunehelpers import trial_results


def _wandb_error(kind: str, message: str) -> Exception:
    import wandb.errors

    return getattr(wandb.errors, kind)(message)


#: name -> (the exception training raises, exit code, words the line holds)
RAISED = {
    "host-memory": (
        lambda: RuntimeError(
            "[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 98304000000 bytes. Error code 12 (Cannot allocate "
            "memory)"
        ),
        1,
        ("out of memory", "--batch-size"),
    ),
    "wandb-no-key": (
        lambda: _wandb_error("UsageError", "No API key configured. Use `wandb login` to log in."),
        1,
        ("W&B", "WANDB_API_KEY"),
    ),
    "wandb-no-network": (
        lambda: _wandb_error("CommError", "Network error (ConnectionError), entering retry loop."),
        1,
        ("W&B", "network"),
    ),
    "end-of-input": (lambda: EOFError("Ran out of input"), 1, ("truncated",)),
    "disk-full-in-a-temporary": (
        lambda: OSError(28, "No space left on device", "runs/.model.pt.a1b2c3-4242-deadbeef.tmp"),
        1,
        ("runs/model.pt", "no space left"),
    ),
    "ctrl-c": (KeyboardInterrupt, 130, ("Interrupted",)),
}


@pytest.mark.parametrize("case", sorted(RAISED))
def test_what_training_raises_is_one_line(tmp_path, tally, prepared_root, monkeypatch, case):
    """``capsnet train`` (in this process, its boundary included) with training raising."""
    raised, code, names = RAISED[case]
    if case.startswith("wandb"):
        pytest.importorskip("wandb")

    def train_run(*args, **kwargs):
        raise raised()

    monkeypatch.setattr("capsnet.training.run.train_run", train_run)
    out = tmp_path / "run"
    args = ["train", "--model", "lenet5", "--epochs", "1", "--data-root", prepared_root]
    outcome = invoke(*args, "--out", out)
    prefix = "Interrupted" if code == 130 else "Error: "
    judge(tally, outcome, fault=True, code=code, names=names, prefix=prefix)
    if code != 130:
        assert "Interrupted" not in outcome.stderr
    assert ".tmp" not in outcome.stderr and ".old" not in outcome.stderr  # no internal path
    assert not out.exists()


def test_an_unreachable_ray_address_fails_after_bounded_tries(tmp_path, tally, prepared_root):
    pytest.importorskip("ray")
    (tmp_path / "params.yaml").write_text("{}\n")
    before = snapshot(tmp_path)
    started = time.monotonic()
    done = run_bounded(
        ["sweep", "--data-root", prepared_root],
        timeout=90,
        env={"RAY_ADDRESS": "127.0.0.1:9"},
        cwd=tmp_path,
    )
    judge(tally, done, fault=True, before=before, after=snapshot(tmp_path), names=("127.0.0.1:9",))
    assert time.monotonic() - started < 60


class _Planted:
    """Unpickled, it creates the file ``path``: code a planted state would run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("plant", ["unrecorded", "replaced", "added", "record-edited"])
def test_a_planted_tuner_state_is_refused_unread(tmp_path, tally, plant):
    """A tuner.pkl or experiment state that capsnet sweep did not record is never
    unpickled: one line naming the directory and how to start afresh."""
    pytest.importorskip("ray")
    import json
    import pickle

    from pipeline.sweep.restore import STATE_FILE, record_state, restore_tuner
    from pipeline.sweep.stage import SweepError

    state = tmp_path / "sweep-0123456789ab"
    state.mkdir()
    ran = tmp_path / "payload-ran"
    planted = pickle.dumps(_Planted(ran))
    (state / "tuner.pkl").write_bytes(pickle.dumps({"a": "tuner"}))
    if plant != "unrecorded":
        record_state(state)
    if plant in ("unrecorded", "replaced"):
        (state / "tuner.pkl").write_bytes(planted)
    elif plant == "added":
        (state / "experiment_state-2099-01-01_00-00-00.json").write_bytes(planted)
    else:  # the record rewritten to match a replaced tuner.pkl's old digest: still refused
        (state / "tuner.pkl").write_bytes(planted)
        record = json.loads((state / STATE_FILE).read_text())
        record["sha256"]["tuner.pkl"] = "0" * 64
        (state / STATE_FILE).write_text(json.dumps(record))
    try:
        restore_tuner(str(state), lambda config: None)
    except SweepError as exc:
        outcome = Outcome(1, f"Error: {exc}\n", False)
    except Exception as exc:
        outcome = Outcome(1, f"Traceback: {type(exc).__name__}: {exc}\n", True)
    else:
        outcome = Outcome(0, "", False)
    judge(tally, outcome, fault=True, names=(str(state), "remove that directory"))
    assert not ran.exists(), "the planted state was unpickled"


def test_the_state_record_follows_every_snapshot_tune_takes(tmp_path):
    """After each step whose snapshot changed the state files the record matches them, so
    a driver killed between snapshots resumes; a file changed after it is refused."""
    pytest.importorskip("ray")
    import pickle

    from pipeline.sweep.restore import StateRecorder, verify_state
    from pipeline.sweep.stage import SweepError

    state = tmp_path / "sweep-0123456789ab"
    state.mkdir()
    recorder = pickle.loads(pickle.dumps(StateRecorder(str(state))))  # as restored
    for step in range(3):
        (state / "tuner.pkl").write_bytes(pickle.dumps({"a": "tuner"}))
        (state / f"experiment_state-{step}.json").write_text(f"{{'step': {step}}}")
        recorder.on_step_end(iteration=step, trials=[])
        verify_state(state)  # a SIGKILL here resumes from this snapshot
    (state / "experiment_state-2.json").write_text("{'planted': 1}")
    with pytest.raises(SweepError, match="differs"):
        verify_state(state)


@pytest.mark.parametrize("content", ["random", "truncated", "empty", "text"])
def test_a_damaged_tuner_state_is_one_line(tmp_path, tally, content):
    pytest.importorskip("ray")
    import pickle
    import random

    from pipeline.sweep.restore import record_state, restore_tuner
    from pipeline.sweep.stage import SweepError

    state = tmp_path / "sweep-0123456789ab"
    state.mkdir()
    good = pickle.dumps({"not": "a tuner"} | {str(i): i for i in range(200)})
    (state / "tuner.pkl").write_bytes(
        {
            "random": random.Random(0).randbytes(2048),
            "truncated": good[: len(good) // 2],
            "empty": b"",
            "text": b"tuner state\n",
        }[content]
    )
    record_state(state)  # damaged after this project wrote it: recorded, yet unreadable
    try:
        restore_tuner(str(state), lambda config: None)
    except SweepError as exc:
        outcome = Outcome(1, f"Error: {exc}\n", False)
    except Exception as exc:  # anything else escapes the boundary: a traceback
        outcome = Outcome(1, f"Traceback: {type(exc).__name__}: {exc}\n", True)
    else:
        outcome = Outcome(0, "", False)
    judge(tally, outcome, fault=True, names=(str(state), "remove that directory"))


def test_errored_trials_are_reported_by_their_cause(tally):
    """Ray wraps a trial's exception with its traceback; the report names the exception
    and its first meaningful lines, never a link or the traceback's last line."""
    pytest.importorskip("ray")
    from ray.exceptions import RayTaskError

    from pipeline.sweep.results import _first_line

    pydantic_like = ValueError(
        "1 validation error for InitSchema\nsigma\n  Input should be greater than or equal to "
        "1 [type=greater_than_equal, input_value=0.5, input_type=float]\n    For further "
        "information visit https://errors.pydantic.dev/2.14/v/greater_than_equal"
    )
    cases = {
        "pydantic": (pydantic_like, "ValueError: 1 validation error for InitSchema; sigma;"),
        "long": (RuntimeError("word " * 100), "RuntimeError: word word"),
    }
    for cause, starts in cases.values():
        traceback = (
            'Traceback (most recent call last):\n  File "trainable.py", line 9, in train\n'
            f"{type(cause).__name__}: {cause}"
        )
        wrapped = RayTaskError("train_trial", traceback, cause)
        line = _first_line(wrapped)
        outcome = Outcome(1, f"Error: {line}\n", False)
        judge(tally, outcome, names=(starts,))
        assert "://" not in line and len(line) <= 240 and not line.endswith("wor")


@pytest.mark.parametrize(
    "comparison",
    [
        {"arm": "equal_augmentation", "label": "lenet5", "reference": ["capsnet-small"]},
        {"arm": "equal_time", "label": "lenet5", "reference": {"a": 1}},
        {"arm": "equal_time", "label": "lenet5", "time_budget_seconds": "soon"},
        {"arm": "equal_time", "label": ["lenet5"]},
        ["equal_time"],
    ],
    ids=["reference-list", "reference-dict", "budget-text", "label-list", "not-a-dict"],
)
def test_a_checkpoint_with_malformed_comparison_metadata_is_one_line(
    tmp_path, tally, prepared_root, monkeypatch, comparison
):
    """``capsnet evaluate-stage`` (in this process, its boundary included) on a checkpoint
    whose comparison metadata has the wrong types."""
    import torch

    from capsnet import models
    from capsnet.models import checkpoint

    torch.manual_seed(0)
    models_dir = tmp_path / "models"
    path = checkpoint.save(
        models_dir / "lenet5.pt", models.build("lenet5"), extra={"comparison": comparison}
    )
    (tmp_path / "params.yaml").write_text(
        textwrap.dedent(
            f"""\
            evaluate:
              models_dir: {models_dir}
              extra_models_dirs: []
              out_dir: {tmp_path / "eval"}
              datasets: [mnist]
              limit: 8
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    done = invoke("evaluate-stage", "--data-root", prepared_root)
    judge(tally, done, names=(path.name, "comparison"))
    assert snapshot(tmp_path / "eval") == {}


def test_ctrl_c_ends_a_sweep_with_130_and_the_next_run_resumes_it(
    tmp_path, tally, prepared_root, monkeypatch
):
    """SIGINT during a running sweep: Tune saves its state, the command exits 130 and
    writes no output; the same command again resumes it without retraining the trials
    that finished. Three two-epoch trials one after another in one Ray worker; the signal
    lands as Tune prints that the first completed (its result.json is flushed later, so the
    files cannot tell in time)."""
    pytest.importorskip("ray")
    storage, out = tmp_path / "ray", tmp_path / "sweep"
    (tmp_path / "params.yaml").write_text(
        textwrap.dedent(
            f"""\
            sweep:
              name: resume
              epochs: 2
              batch_size: 50
              train_size: 300
              val_size: 200
              asha: {{enabled: false}}
              resources: {{cpus_per_trial: 1, max_concurrent_trials: 1}}
              storage_path: {storage}
              wandb: {{mode: disabled}}
              space: {{model: lenet5, augment: none, routing_iterations: 1,
                       lr: {{grid: [0.001, 0.002, 0.003]}}}}
            """
        )
    )
    command = [sys.executable, "-c", "from capsnet.cli import main; main()", "sweep",
               "--data-root", str(prepared_root), "--num-cpus", "1", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # Tune's lines arrive as printed
    env.pop("RAY_ADDRESS", None)
    first = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    lines = []
    try:
        for line in first.stdout:
            lines.append(line)
            if re.match(r"Trial \S+ completed after", line):
                first.send_signal(signal.SIGINT)
                break
        lines.extend(first.stdout)
        first.wait(timeout=120)
        output = "".join(lines)
        outcome = Outcome(first.returncode, output, "Traceback" in output)
    except subprocess.TimeoutExpired:
        first.kill()
        first.communicate()
        outcome = Outcome(124, "".join(lines), False, hung=True)
    # Ray and Tune log on their own; the command's own last word is the line
    judge(tally, outcome, fault=True, code=130, killed=True)
    assert outcome.lines[-1] == "Interrupted.", outcome.stderr[-3000:]
    assert "interrupted" in outcome.stderr
    finished = {t: rs for t, rs in trial_results(storage).items() if rs and rs[-1]["epoch"] == 2}
    assert 1 <= len(finished) < 3, f"{len(finished)} of 3 trials finished before the signal"
    assert not out.exists(), outcome.stderr[-3000:]

    # the same command again, in this process (its Ray instance ends with the command)
    from click.testing import CliRunner

    from capsnet.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    second = CliRunner().invoke(main, command[3:])
    assert second.exit_code == 0, second.output[-3000:]
    assert "resumed 3 trial(s)" in second.stdout
    with open(out / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 and {r["status"] for r in rows} == {"TERMINATED"}
    assert {r["epochs"] for r in rows} == {"2"}
    after = trial_results(storage)
    for trial, reports in finished.items():  # finished trials were not trained again
        assert after[trial] == reports


def test_a_full_disk_under_the_sweep_state_is_not_blamed_on_params(tmp_path, tally, monkeypatch):
    """pyarrow (Tune's state writer) raises OSError without an errno, ``[Errno 28]`` in its
    text: the boundary reads the errno from it and names no input file; met while Tune
    saves its state, the sweep names its storage path."""
    import errno

    from capsnet.cli.boundary import user_error
    from capsnet.config import SweepConfig
    from pipeline.sweep.stage import SweepError, _storage_errors

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("{}\n")
    full = OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left")
    line = user_error(full, ["sweep", "--params", "params.yaml"])
    tally.faults += 1
    assert "params.yaml" not in line and line.startswith("no space left on device"), line
    with pytest.raises(SweepError) as raised:
        with _storage_errors(SweepConfig(), "runs/ray/mnist-0123"):
            raise full
    message = str(raised.value)
    assert message.startswith("runs/ray/mnist-0123: no space left on device"), message
    assert "sweep.storage_path runs/ray" in message
    with pytest.raises(OSError) as kept:  # a file it names keeps its own report
        with _storage_errors(SweepConfig(), "runs/ray/x"):
            raise OSError(errno.ENOSPC, "No space left on device", "sweep/best.json")
    assert kept.value.filename == "sweep/best.json"
