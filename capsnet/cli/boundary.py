"""The ``capsnet`` error boundary: what the user, the file system or the machine did wrong,
as one line that names the file or option and says what to do.

``user_error(exc, args)`` returns that line for the exceptions a user can cause (the
OSError family, undecodable or truncated files, numbers too large, a device torch accepts
but cannot run, memory) and None for anything else: a programming error, which keeps its
traceback. Only the standard library is imported, so the boundary costs ``--help`` nothing.
"""

from __future__ import annotations

import errno
import json
import os
import re
import zlib
from pathlib import Path

#: Options whose value is a path the command writes (named when the OS does not say where).
OUTPUT_OPTIONS = ("--out", "--data-root", "--root", "--figures", "--metrics", "--readme")

#: errno -> (what happened, what to do).
OS_ERRORS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on device (disk full)", "free space or write elsewhere"),
    errno.EDQUOT: ("disk quota exceeded", "free space or write elsewhere"),
    errno.EFBIG: (
        "file too large (the file-size limit, ulimit -f, or the file system's)",
        "raise the limit or write elsewhere",
    ),
    errno.EACCES: ("permission denied", "choose a path you may use or change its permissions"),
    errno.EPERM: ("operation not permitted", "choose a path you may use"),
    errno.EROFS: ("read-only file system", "write to a writable location"),
    errno.ENOTDIR: (
        "a part of this path is a file, not a directory",
        "choose a path that is not under a file",
    ),
    errno.EISDIR: ("is a directory", "give the path of a file"),
    errno.ENAMETOOLONG: ("file name too long", "use a shorter path"),
    errno.ENOENT: ("no such file or directory", "check the path"),
    errno.EEXIST: ("already exists", "remove it or choose another path"),
    errno.EMFILE: ("too many open files", "raise the limit (ulimit -n) or use fewer workers"),
    errno.EIO: ("input/output error", "check the disk"),
}

#: Fragments of torch RuntimeErrors that mean the device, not the code, failed.
DEVICE_FAILURES = (
    "CUDA error",
    "CUDA driver",
    "CUDA out of memory",
    "no kernel image",
    "not linked with support",
    "unsupported autocast device",
    "MPS backend",
    "out of memory",
)


def error_cause(error: BaseException, width: int = 200) -> str:
    """``Type: first meaningful line`` of what caused ``error``: wrappers unwrapped (a
    ``.cause`` as Ray's task errors carry), then the first line of its message that is not a
    traceback, a source line or a link (with the next two), cut at a word within ``width``
    characters."""
    seen = set()
    while isinstance(getattr(error, "cause", None), BaseException) and id(error) not in seen:
        seen.add(id(error))
        error = error.cause
    skip = ("Traceback", "File ", "During handling", "The above exception", "ray::")
    lines = [" ".join(line.split()) for line in str(error).splitlines()]
    meaningful = [
        line for line in lines if line and "://" not in line and not line.startswith(skip)
    ]
    name = type(error).__name__
    text = "; ".join(meaningful[:3])  # a heading line ("1 validation error") and its detail
    if text.startswith(name + ":"):
        text = text[len(name) + 1 :].strip()
    if len(text) > width:
        text = text[:width].rsplit(" ", 1)[0] + " ..."
    return f"{name}: {text}" if text else name


#: A writer's temporary name (capsnet.io.files): ``.<target>.<host>-<pid>-<hex>.tmp|.old``.
TEMPORARY_NAME = re.compile(r"\.([^/\s]+?)\.(?:[0-9a-f]{6}-[0-9]{1,10}-)?[0-9a-f]{8}\.(?:tmp|old)")


def without_temporaries(line: str) -> str:
    """``line`` with every writer's temporary name replaced by the output it stands for:
    a message names the user's path, never an internal one."""
    return TEMPORARY_NAME.sub(r"\1", line)


def shorten(text: str, width: int = 120) -> str:
    """``text`` on one line, its middle elided beyond ``width`` characters."""
    text = " ".join(str(text).split())
    if len(text) <= width:
        return text
    half = (width - 3) // 2
    return f"{text[:half]}...{text[-half:]}"


def option_values(args: list[str]) -> list[tuple[str, str]]:
    """(option, value) for each ``--name value`` or ``--name=value`` in ``args``."""
    pairs = []
    for i, word in enumerate(args):
        if not word.startswith("--"):
            continue
        if "=" in word:
            name, value = word.split("=", 1)
            pairs.append((name, value))
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append((word, args[i + 1]))
    return pairs


def option_for(path: str | None, args: list[str]) -> str | None:
    """The option in ``args`` whose value is ``path`` or one of its parents."""
    if not path:
        return None
    target = Path(os.path.abspath(path))
    for name, value in option_values(args):
        given = Path(os.path.abspath(value))
        if given == target or given in target.parents:
            return name
    return None


def named_files(args: list[str]) -> list[str]:
    """The words of ``args`` that name existing regular files (arguments and option values)."""
    return [w for w in args if not w.startswith("--") and os.path.isfile(w)]


def _existing(path: str) -> str:
    """``path`` or its nearest existing parent."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _full(path: str) -> bool:
    """Whether the file system holding ``path`` has no space left for this user."""
    try:
        return os.statvfs(_existing(path)).f_bavail == 0
    except OSError:
        return False


def _outputs(args: list[str], code: int | None) -> list[str]:
    """``--out x`` for the output options given: for a full disk those on a full file
    system; otherwise the outputs proper (--out, --figures...) before the data root."""
    given = [(n, v) for n, v in option_values(args) if n in OUTPUT_OPTIONS]
    if code in (errno.ENOSPC, errno.EDQUOT):
        full = [(n, v) for n, v in given if _full(v)]
        given = full or given
    proper = [(n, v) for n, v in given if n not in ("--data-root", "--root")]
    return [f"{n} {v}" for n, v in (proper or given)]


def _where(shown: list[str]) -> str:
    """``" (a, b, c)"`` for the first three of ``shown``; empty when there are none."""
    return f" ({', '.join(shown[:3])})" if shown else ""


#: How libraries that raise OSError without an errno (pyarrow, under Ray Tune) spell it.
ERRNO_IN_TEXT = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)


def os_errno(exc: OSError) -> int | None:
    """``exc.errno``, or the ``[Errno N]`` its message names when it has none."""
    if exc.errno is not None:
        return exc.errno
    found = ERRNO_IN_TEXT.search(str(exc))
    return int(found.group(1)) if found else None


def os_error(exc: OSError, args: list[str]) -> str:
    """One line for an OSError: its path, the option that named it, and what to do."""
    code = os_errno(exc)
    what, todo = OS_ERRORS.get(code, (exc.strerror or str(exc), "check the path"))
    if code is None and not exc.filename:
        return f"{shorten(exc)}{_where(named_files(args))}: check the file"
    path = exc.filename2 if code == errno.EEXIST and exc.filename2 else exc.filename
    if path is None:
        return f"{what} while writing{_where(_outputs(args, code))}: {todo}"
    option = option_for(without_temporaries(os.fsdecode(path)), args)
    named = f" ({option})" if option else ""
    return f"{shorten(os.fsdecode(path))}: {what}{named}: {todo}"


#: Fragments of torch RuntimeErrors that mean host memory ran out.
HOST_MEMORY_FAILURES = ("can't allocate memory", "DefaultCPUAllocator", "Cannot allocate memory")


def runtime_error(exc: RuntimeError) -> str | None:
    """One line for a device or memory failure torch reports as a RuntimeError, else None."""
    text = str(exc)
    if any(fragment in text for fragment in HOST_MEMORY_FAILURES):
        return (
            f"out of memory: {shorten(text.strip().splitlines()[0])}: lower --batch-size or "
            "the data limits, or use a larger machine"
        )
    if not any(fragment in text for fragment in DEVICE_FAILURES):
        return None
    first = shorten(text.strip().splitlines()[0] if text.strip() else type(exc).__name__)
    if "out of memory" in text:
        return f"out of memory on the device: {first}: lower --batch-size or use --device cpu"
    return f"the device cannot run this: {first}: choose another --device (e.g. cpu)"


def user_error(exc: BaseException, args: list[str]) -> str | None:
    """The one line for an error the user or the machine caused, or None (a bug)."""
    if isinstance(exc, OSError):
        return os_error(exc, args)
    files = _where(named_files(args))
    if isinstance(exc, UnicodeDecodeError):
        return (
            f"a file is not UTF-8 text{files}: {exc.reason} at byte {exc.start}; save it as UTF-8"
        )
    if isinstance(exc, json.JSONDecodeError):
        return f"a JSON file is not valid{files}: {exc.msg} at line {exc.lineno}; rewrite it"
    if isinstance(exc, (EOFError, zlib.error)):
        return f"a file is truncated or corrupt{files}: {shorten(exc)}; fetch or rebuild it"
    if isinstance(exc, OverflowError) or (
        isinstance(exc, ValueError) and "overflow" in str(exc).lower()
    ):
        return f"a number is too large: {shorten(exc)}; use a smaller value"
    if isinstance(exc, MemoryError):
        return "out of memory: lower --batch-size or the data limits, or use a larger machine"
    if isinstance(exc, RuntimeError) and (line := runtime_error(exc)) is not None:
        return line
    if type(exc).__module__.split(".")[0] == "wandb":
        return (
            f"W&B failed: {error_cause(exc)}; set WANDB_API_KEY (wandb login) and check the "
            "network, or set WANDB_MODE=offline"
        )
    return None
