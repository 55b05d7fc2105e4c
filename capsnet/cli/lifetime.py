"""A DVC stage's command dies with the ``dvc`` process that runs it.

DVC runs a stage as ``$SHELL -c CMD``. When ``dvc`` is killed (SIGKILL gives it no chance
to stop its children) the command would run on and land its outputs after a rerun has
written newer ones. ``die_with_dvc`` ties this process to ``dvc``: on Linux the kernel
sends SIGKILL when the parent dies (``prctl(PR_SET_PDEATHSIG)``), and where a shell stands
between the two, a daemon thread watches ``dvc`` itself and kills this process when it is
gone. Only the standard library is used, so every command can call it first.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

#: Process names of the shells DVC may run a stage command with.
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "busybox"})
PR_SET_PDEATHSIG = 1
#: Seconds between two looks at the dvc process.
WATCH_INTERVAL = 0.5


def process_stat(pid: int) -> tuple[str, str, int, int] | None:
    """(name, state, parent pid, start time) of ``pid`` from /proc, or None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return name, fields[0], int(fields[1]), int(fields[19])


def runner_pid(parent: int) -> int:
    """The nearest ancestor, from ``parent`` up, that is not a shell: the dvc process."""
    pid = parent
    for _ in range(8):
        found = process_stat(pid)
        if found is None or found[0] not in SHELLS or found[2] <= 1:
            return pid
        pid = found[2]
    return parent


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def gone(pid: int, started: int) -> bool:
    """Whether ``pid`` (started at ``started``) has exited: missing, a zombie, or reused."""
    found = process_stat(pid)
    return found is None or found[1] in ("Z", "X") or found[3] != started


def _watch(pid: int, started: int) -> None:
    """Kill this process once ``pid`` has exited."""
    while not gone(pid, started):
        time.sleep(WATCH_INTERVAL)
    _kill_self()


def die_with_dvc() -> bool:
    """Tie this process's life to the dvc process running it (see the module doc); False
    where the system offers neither means (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (AttributeError, OSError):
        pass
    if os.getppid() != parent:  # the parent died before the call took effect
        _kill_self()
    runner = runner_pid(parent)
    found = process_stat(runner)
    if runner != parent and found is not None:
        threading.Thread(target=_watch, args=(runner, found[3]), daemon=True).start()
    return True
