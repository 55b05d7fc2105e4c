"""Running ``capsnet`` against a fault and judging what it left: the exit code, one stderr
line, no traceback, and no output that looks complete but is not.

A ``Tally`` counts every case: bad inputs tried, faults injected (a full disk, a read-only
file system, a process killed or an operation failing mid-write), tracebacks and partial
outputs seen, hangs (a subprocess still running at its deadline: ``run_bounded``) and stale
results (an output that a killed or refused run left or changed after the fact).
tests/faults/conftest.py prints the totals and writes them as JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

#: A temporary a writer names recognisably (capsnet.io.files): ``.<target>.<tag>.tmp|.old``.
TEMPORARY = re.compile(r"\..+\.(tmp|old)")
#: Files a writer may leave that are neither output nor debris.
HOUSEKEEPING = {".capsnet.lock"}
#: Progress lines a command prints on stderr while it works (``capsnet train``'s epochs).
PROGRESS = re.compile(r"epoch \d+: .*")


@dataclasses.dataclass
class Tally:
    """What the suite tried and what it saw."""

    inputs: int = 0
    faults: int = 0
    tracebacks: int = 0
    partial_outputs: int = 0
    hangs: int = 0
    stale_results: int = 0

    def line(self) -> str:
        return (
            f"faults: {self.inputs} inputs tried, {self.faults} faults injected, "
            f"{self.tracebacks} tracebacks, {self.partial_outputs} partial outputs, "
            f"{self.hangs} hangs, {self.stale_results} stale results"
        )

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        return path


@dataclasses.dataclass
class Outcome:
    """How one ``capsnet`` run ended."""

    code: int
    stderr: str
    traceback: bool
    hung: bool = False

    @property
    def lines(self) -> list[str]:
        """The stderr lines that are not progress reports."""
        return [x for x in self.stderr.strip().splitlines() if not PROGRESS.fullmatch(x)]


def invoke(*args, env: dict | None = None) -> Outcome:
    """``capsnet ARGS`` in this process (the boundary of capsnet.cli.main included)."""
    from capsnet.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args], env=env)
    exc = result.exception
    crashed = exc is not None and not isinstance(exc, SystemExit)
    return Outcome(result.exit_code, result.stderr, crashed or "Traceback" in result.stderr)


#: Run before ``capsnet.cli.main`` in a subprocess: wrap ``TARGET`` (a module attribute)
#: so that its ``NTH`` call whose arguments mention ``MATCH`` kills the process (exit 137,
#: no cleanup runs, as with SIGKILL) or raises OSError(ERRNO).
_INJECT = """
import errno, importlib, os, sys
module_name, attribute = {target!r}.rsplit(".", 1)
module = importlib.import_module(module_name)
real = getattr(module, attribute)
seen = [0]
def wrapped(*args, **kwargs):
    if {match!r} in " ".join(map(str, args)):
        seen[0] += 1
        if seen[0] == {nth}:
            if {action!r} == "kill":
                os._exit(137)
            raise OSError({errno}, os.strerror({errno}))
    return real(*args, **kwargs)
setattr(module, attribute, wrapped)
sys.argv = ["capsnet", *{args!r}]
from capsnet.cli import main
main()
"""


def run_injected(
    args, target: str, match: str = "", nth: int = 1, action: str = "kill", errno: int = 5
) -> Outcome:
    """``capsnet ARGS`` in a subprocess whose ``target`` is made to fail (see _INJECT)."""
    code = _INJECT.format(
        target=target, match=match, nth=nth, action=action, errno=errno, args=[str(a) for a in args]
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True
    )
    return Outcome(done.returncode, done.stderr, "Traceback" in done.stderr)


#: Run in one subprocess: for each (ARGS, NTH) of CASES, a fork of it runs ``capsnet ARGS``
#: with ``TARGET`` wrapped as in _INJECT (its NTH call that mentions MATCH kills the fork,
#: exit 137, or raises), its stderr in ERRDIR/<index>; prints the forks' exit codes as JSON.
#: torch is imported once, before the forks; the rest after the wrapping, as in _INJECT.
_INJECT_EACH = """
import errno, importlib, json, os, sys, traceback
import torch
module_name, attribute = {target!r}.rsplit(".", 1)
module = importlib.import_module(module_name)
real = getattr(module, attribute)
codes = []
for index, (args, nth) in enumerate({cases!r}):
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(os.path.join({errdir!r}, str(index)), os.O_WRONLY | os.O_CREAT), 2)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        seen = [0]
        def wrapped(*a, **kwargs):
            if {match!r} in " ".join(map(str, a)):
                seen[0] += 1
                if seen[0] == nth:
                    if {action!r} == "kill":
                        os._exit(137)
                    raise OSError({errno}, os.strerror({errno}))
            return real(*a, **kwargs)
        setattr(module, attribute, wrapped)
        sys.argv = ["capsnet", *args]
        code = 1
        try:
            from capsnet.cli import main
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        sys.stderr.flush()
        os._exit(code)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(codes))
"""


def run_injected_each(
    cases, target: str, match: str = "", action: str = "kill", errno: int = 5
) -> list[Outcome]:
    """``run_injected`` for each (args, nth) of ``cases``, each in a fork of one subprocess
    (one interpreter start and torch import for all)."""
    import tempfile

    with tempfile.TemporaryDirectory() as errdir:
        code = _INJECT_EACH.format(
            target=target, match=match, action=action, errno=errno, errdir=errdir,
            cases=[([str(a) for a in args], nth) for args, nth in cases],
        )  # fmt: skip
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        codes = json.loads(done.stdout.strip().splitlines()[-1])
        errs = [(Path(errdir) / str(i)).read_text() for i in range(len(cases))]
    return [Outcome(c, err, "Traceback" in err) for c, err in zip(codes, errs)]


#: Seconds a ``run_bounded`` command may take unless the case says otherwise.
DEADLINE = 120.0


class Hang(BaseException):
    """Raised in a bounded in-process case at its deadline (not an Exception, so no
    handler of the code under test swallows it)."""


def invoke_bounded(*args, timeout: float = 60.0, env: dict | None = None) -> Outcome:
    """``invoke`` with a deadline: at ``timeout`` seconds (SIGALRM, main thread) the run
    stops and the outcome is ``hung``."""
    import signal

    def expired(signum, frame):
        raise Hang

    import time

    outer, _ = signal.getitimer(signal.ITIMER_REAL)  # the test's own deadline, if set
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, min(timeout, outer) if outer else timeout)
    try:
        return invoke(*args, env=env)
    except Hang:
        return Outcome(124, "", False, hung=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # give the test's deadline back what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.01))


@contextlib.contextmanager
def file_size_limit(limit: int):
    """``ulimit -f`` for this process while the block runs: a write past ``limit`` bytes
    fails with EFBIG (SIGXFSZ ignored) instead of killing the process; both restored after."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def run_bounded(
    args, *, timeout: float = DEADLINE, env: dict | None = None, cwd: Path | None = None
) -> Outcome:
    """``capsnet ARGS`` in a subprocess that is killed at ``timeout`` seconds (then
    ``hung``, exit 124); ``env`` is laid over this process's environment."""
    full_env = {**os.environ, **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}
    command = [sys.executable, "-c", "from capsnet.cli import main; main()"]
    try:
        done = subprocess.run(
            [*command, *map(str, args)],
            capture_output=True,
            text=True,
            env=full_env,
            cwd=cwd,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        return Outcome(124, stderr or "", "Traceback" in (stderr or ""), hung=True)
    return Outcome(done.returncode, done.stderr, "Traceback" in done.stderr)


def snapshot(*roots: Path) -> dict[str, str]:
    """relative path -> content hash of every file under ``roots`` that is not a
    recognisable temporary or housekeeping file."""
    found = {}
    for root in roots:
        if root.is_file():
            found[str(root)] = hashlib.sha1(root.read_bytes()).hexdigest()
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not TEMPORARY.fullmatch(d)]
            for name in filenames:
                if TEMPORARY.fullmatch(name) or name in HOUSEKEEPING:
                    continue
                path = Path(dirpath) / name
                found[str(path)] = hashlib.sha1(path.read_bytes()).hexdigest()
    return found


def debris(*roots: Path) -> list[Path]:
    """Recognisable temporaries under ``roots`` (what a killed writer may leave)."""
    found = []
    for root in roots:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            found += [Path(dirpath) / n for n in dirnames + filenames if TEMPORARY.fullmatch(n)]
            dirnames[:] = [d for d in dirnames if not TEMPORARY.fullmatch(d)]
    return sorted(found)


def judge(
    tally: Tally,
    outcome: Outcome,
    *,
    fault: bool = False,
    before: dict[str, str] | None = None,
    after: dict[str, str] | None = None,
    code: int | None = None,
    names: tuple[str, ...] = (),
    killed: bool = False,
    prefix: str = "Error: ",
    stale: bool = False,
) -> None:
    """Count one case and hold it to the rules: a non-zero exit (``code`` when given), no
    traceback, one stderr line besides progress reports naming each of ``names`` (unless
    ``killed``), no file under the watched outputs added, changed or lost (``before`` /
    ``after`` snapshots), no hang, and no stale result (``stale``: the case saw one)."""
    if fault:
        tally.faults += 1
    else:
        tally.inputs += 1
    tally.tracebacks += outcome.traceback
    tally.hangs += outcome.hung
    tally.stale_results += stale
    assert not outcome.hung, f"still running at its deadline: {outcome.stderr[-2000:]}"
    assert not stale, "a stale result appeared"
    changed = []
    if before is not None and after is not None:
        changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        tally.partial_outputs += bool(changed)
    assert not outcome.traceback, outcome.stderr
    assert outcome.code != 0, outcome.stderr
    if code is not None:
        assert outcome.code == code, outcome.stderr
    assert not changed, f"outputs appeared, changed or vanished in a failed run: {changed}"
    if killed:
        return
    assert len(outcome.lines) == 1, outcome.stderr
    assert outcome.lines[0].startswith(prefix), outcome.stderr
    for name in names:
        assert name in outcome.lines[0], outcome.lines[0]


@contextlib.contextmanager
def tmpfs(where: Path, options: str):
    """A tmpfs mounted at ``where`` with ``options``; skips when it cannot be mounted."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
