"""Every process of a local Ray ends within seconds of its driver, even a SIGKILLed one.

Ray fate-shares the GCS and the raylet with the driver (SIGKILL on its death), but the
raylet's dashboard and runtime-env agents, on seeing the raylet die without the SIGTERM
line in its log, publish an error to the dead GCS with a timeout of 60 s fixed in Ray's
code (``ray._private.process_watcher.report_raylet_error_logs``), so they outlive a
``kill -9`` of the driver by a minute; no Ray setting shortens that call. ``watch()``
starts a small reaper process instead: it keeps a record of the driver's descendants and,
when the driver is gone (its pipe closes), SIGKILLs those still running; ``stop()`` (Ray
shut down in order) ends it without reaping.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from capsnet.cli.lifetime import gone, process_stat

#: Seconds between two looks at the driver's process tree.
INTERVAL = 1.0
#: What the driver writes to end its reaper without reaping.
STOP = b"q"

_started: list[tuple[subprocess.Popen, int]] = []


def watch() -> subprocess.Popen | None:
    """Start the reaper of this process's descendants (Linux; elsewhere None). The reaper
    holds the read end of a pipe whose write end only this process keeps."""
    if not Path("/proc/self/stat").exists():
        return None
    read, write = os.pipe()  # neither end is inherited by later children
    reaper = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cluster.ray_reaper", str(os.getpid())],
        cwd=Path(__file__).resolve().parents[1],  # this checkout's pipeline and capsnet
        stdin=read,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the driver's process group spares it
    )
    os.close(read)
    _started.append((reaper, write))
    return reaper


def stop() -> None:
    """End the reapers this process started, reaping nothing (Ray shut down in order)."""
    while _started:
        reaper, write = _started.pop()
        os.write(write, STOP)
        os.close(write)
        reaper.wait()


def descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every live descendant of ``root``."""
    parents: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = process_stat(int(entry))  # (name, state, parent, start time)
            if stat is not None and stat[1] not in "ZX":
                parents.setdefault(stat[2], []).append(int(entry))
                started[int(entry)] = stat[3]
    found: dict[int, int] = {}
    todo = list(parents.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in found and pid in started:
            found[pid] = started[pid]
            todo.extend(parents.get(pid, ()))
    return found


def running(recorded: dict[int, int]) -> dict[int, int]:
    """The recorded {pid: start time} that still run (the same start time: not a reused
    pid)."""
    return {pid: start for pid, start in recorded.items() if not gone(pid, start)}


def reap(recorded: dict[int, int]) -> list[int]:
    """SIGKILL each recorded process that still runs; returns the pids signalled."""
    killed = []
    for pid in running(recorded):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(pid)
    return killed


def main(driver: int) -> None:
    """Record the driver's descendants every INTERVAL seconds until its pipe (stdin) closes,
    then reap them; STOP on the pipe ends it without reaping."""
    recorded: dict[int, int] = {}
    me = os.getpid()
    while True:
        recorded.update({p: s for p, s in descendants(driver).items() if p != me})
        ready, _, _ = select.select([sys.stdin.fileno()], [], [], INTERVAL)
        if ready:
            if os.read(sys.stdin.fileno(), 1) == STOP:
                return
            break
    time.sleep(INTERVAL)  # Ray's own fate-sharing goes first
    reap(recorded)


if __name__ == "__main__":
    main(int(sys.argv[1]))
