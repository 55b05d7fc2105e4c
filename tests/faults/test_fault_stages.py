"""A DVC stage reads only what DVC tracks and dies with its dvc process.

Inside a stage (DVC sets $DVC_STAGE for every stage command) an environment input that
would change what a command reads is refused in one line. Killing the dvc process alone
with SIGKILL, with the command its child or a shell's child, ends the command too: it
never lands an output after its runner is gone (a stale result beside a rerun's). Every
case is a real process tree with a deadline."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from faulthelpers import Outcome, judge, run_bounded, snapshot

STAGE_COMMANDS = {
    "sweep": ["sweep", "--params", "params.yaml"],
    "train": ["train-final", "--params", "params.yaml"],
    "evaluate": ["evaluate-stage", "--params", "params.yaml"],
    "viewpoints": ["viewpoints", "--params", "params.yaml"],
    "prepare_mnist": ["data", "prepare", "mnist"],
}


@pytest.mark.parametrize("stage", sorted(STAGE_COMMANDS))
def test_capsnet_data_is_refused_inside_a_stage(tmp_path, tally, prepared_root, stage):
    if stage in ("sweep", "train"):
        pytest.importorskip("ray")
    (tmp_path / "params.yaml").write_text("{}\n")
    env = {"DVC_STAGE": stage, "CAPSNET_DATA": str(prepared_root)}
    before = snapshot(tmp_path)
    done = run_bounded(STAGE_COMMANDS[stage], timeout=120, env=env, cwd=tmp_path)
    judge(tally, done, before=before, after=snapshot(tmp_path), code=2)
    assert "CAPSNET_DATA" in done.lines[0] and f"DVC stage {stage}" in done.lines[0]


def test_the_default_data_root_from_the_environment_is_accepted(tmp_path, tally):
    """$CAPSNET_DATA naming the root the stage's command names anyway changes nothing."""
    env = {"DVC_STAGE": "prepare_mnist", "CAPSNET_DATA": "data", "CAPSNET_MIRROR": None}
    done = run_bounded(["data", "prepare", "mnist"], timeout=120, env=env, cwd=tmp_path)
    judge(tally, done, names=("data/raw/mnist",))  # it got past the check, to the missing data


def test_no_stage_but_download_uses_a_mirror(tmp_path, monkeypatch):
    """Inside a stage, --mirror / $CAPSNET_MIRROR / data.mirror reach only data download."""
    import click

    from capsnet.cli.options import mirror_option, resolve_mirror

    seen = {}

    @click.command("prepare")
    @mirror_option
    def prepare(mirror):
        seen["prepare"] = (mirror, resolve_mirror(mirror))

    @click.command("download")
    @mirror_option
    def download(mirror):
        seen["download"] = (mirror, resolve_mirror(mirror))

    monkeypatch.setenv("CAPSNET_MIRROR", str(tmp_path))
    monkeypatch.setenv("DVC_STAGE", "x")
    for command in (prepare, download):
        command.main([], standalone_mode=False)
    assert seen == {"prepare": (None, None), "download": (str(tmp_path), str(tmp_path))}
    monkeypatch.delenv("DVC_STAGE")
    prepare.main([], standalone_mode=False)
    assert seen["prepare"] == (str(tmp_path), str(tmp_path))


#: A stand-in for ``dvc repro``: runs ARGV with $DVC_STAGE set and waits for it.
FAKE_DVC = textwrap.dedent(
    """
    import os, subprocess, sys
    env = dict(os.environ, DVC_STAGE="train")
    sys.exit(subprocess.Popen(sys.argv[1:], env=env).wait())
    """
)


def _processes_with(marker: str) -> list[int]:
    """Pids of the live Python processes (not shells) whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and cmdline.startswith(sys.executable) and state not in "ZX":
            found.append(int(entry.name))
    return found


def _wait_for(predicate, timeout: float) -> bool:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("through", ["direct", "shell"])
def test_killing_dvc_alone_ends_the_stage_command(tmp_path, tally, prepared_root, through):
    out = tmp_path / f"run-{through}"
    command = [
        sys.executable, "-c", "from capsnet.cli import main; main()", "train", "--model",
        "lenet5", "--epochs", "100", "--data-root", str(prepared_root), "--out", str(out),
    ]  # fmt: skip
    if through == "shell":  # a shell that cannot exec its last command stays in between
        command = ["/bin/sh", "-c", shlex.join(command) + "; true"]
    dvc = subprocess.Popen(
        [sys.executable, "-c", FAKE_DVC, *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert _wait_for(lambda: _processes_with(str(out)), 60), "the command never started"
        time.sleep(3)  # past the CLI's start, into loading data and training
        os.kill(dvc.pid, signal.SIGKILL)
        dvc.wait(10)
        ended = _wait_for(lambda: not _processes_with(str(out)), 30)
    finally:
        for pid in _processes_with(str(out)):  # this test's own command, if it outlived dvc
            os.kill(pid, signal.SIGKILL)
    outcome = Outcome(137, "", False, hung=not ended)
    judge(tally, outcome, fault=True, killed=True, stale=(out / "model.pt").exists())
    assert not (out / "model.pt").exists()


RAY_DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pipeline.sweep.stage import _init_ray
    _init_ray("local", 1, "disabled")
    Path(sys.argv[1]).write_text("ready")
    time.sleep(600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_sweep_driver_ends_its_local_ray(tmp_path, tally):
    """A SIGKILLed driver of a local Ray (started as the sweep starts it) leaves no Ray
    process behind: its agents too end within seconds, not after Ray's 60 s error report."""
    pytest.importorskip("ray")
    from pipeline.cluster.ray_reaper import descendants, reap, running

    ready = tmp_path / "ready"
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    driver = subprocess.Popen(
        [sys.executable, "-c", RAY_DRIVER, str(ready)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env,
    )  # fmt: skip
    started: dict[int, int] = {}
    try:
        assert _wait_for(ready.exists, 120), "Ray never started"
        time.sleep(3)  # the agents are up, the reaper has recorded them
        started = descendants(driver.pid)
        assert len(started) >= 4, started  # gcs, raylet, agents, reaper, ...
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        ended = _wait_for(lambda: not running(started), 30)
        left = sorted(running(started))
    finally:
        driver.kill()
        reap(started)  # this test's own processes, if any outlived the driver
    judge(tally, Outcome(137, "", False, hung=not ended), fault=True, killed=True)
    assert not left


LISTENERS = textwrap.dedent(
    """
    import json, sys
    import psutil
    from pipeline.sweep.stage import _init_ray
    _init_ray("local", 1, "disabled")
    found = set()
    for process in psutil.Process().children(recursive=True):
        try:
            for c in process.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    found.add(c.laddr.ip)
        except psutil.Error:
            pass
    print(json.dumps(sorted(found)))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_local_ray_listens_on_loopback_only(tmp_path):
    """Every port of the local Ray a sweep starts (GCS, raylet, workers, agents) listens
    on 127.0.0.1, not on all interfaces."""
    pytest.importorskip("ray")
    pytest.importorskip("psutil")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run(
        [sys.executable, "-c", LISTENERS], capture_output=True, text=True, env=env,
        timeout=180, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    addresses = json.loads(done.stdout.strip().splitlines()[-1])
    assert addresses, "no Ray server found listening"
    assert set(addresses) <= {"127.0.0.1", "::ffff:127.0.0.1"}, addresses


#: A driver whose ``ray.init`` starts a process (standing for a Ray agent), then hangs.
INIT_HANGS = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    import ray
    from pipeline.sweep.stage import _init_ray

    def init(**options):
        agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(sys.argv[1]).write_text(str(agent.pid))
        time.sleep(600)

    ray.init = init
    _init_ray("local", 1, "disabled")
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_driver_killed_during_ray_init_leaves_nothing(tmp_path, tally):
    """The reaper watches from before ``ray.init``: a driver SIGKILLed while Ray starts
    leaves none of the processes Ray had started."""
    pytest.importorskip("ray")
    from pipeline.cluster.ray_reaper import INTERVAL, descendants, reap, running

    started = tmp_path / "agent"
    driver = subprocess.Popen(
        [sys.executable, "-c", INIT_HANGS, str(started)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    recorded: dict[int, int] = {}
    try:
        assert _wait_for(lambda: started.exists() and started.read_text(), 60), "no init"
        agent = int(started.read_text())
        recorded = {p: s for p, s in descendants(driver.pid).items() if p == agent}
        assert recorded, "the agent is not the driver's"
        time.sleep(3 * INTERVAL)  # a watching reaper has recorded it
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        ended = _wait_for(lambda: not running(recorded), 15)
    finally:
        driver.kill()
        reap(recorded)  # the stand-in agent, if it outlived the driver
    judge(tally, Outcome(137, "", False, hung=False), fault=True, killed=True)
    assert ended, "the agent started during ray.init outlived its SIGKILLed driver"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_ray_shut_down_in_order_reaps_nothing():
    """ray_reaper.stop() (after ray.shutdown) ends the reaper and leaves the driver's other
    children alone."""
    from pipeline.cluster import ray_reaper

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reaper = ray_reaper.watch()
        assert _wait_for(lambda: child.pid in ray_reaper.descendants(os.getpid()), 10)
        time.sleep(2 * ray_reaper.INTERVAL)  # recorded by the reaper
        ray_reaper.stop()
        assert reaper.returncode == 0 and child.poll() is None
    finally:
        child.kill()
        child.wait()
