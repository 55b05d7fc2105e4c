"""Where dataset files come from: an optional mirror, then the official URLs.

Every file is verified by the MD5 of its DECOMPRESSED content (so a faithful mirror that
recompressed a file still verifies) and written atomically: data goes to a temporary file
in the target directory (``capsnet.io.files`` names), is fsynced, verified and only then renamed
into place. An archive is extracted into a temporary sibling of its directory, swapped in
whole. A killed download or extraction therefore never leaves a file that looks complete,
and the next run removes its temporaries before it starts.

Every read is bounded: a file whose size is known (``RemoteFile.size``, the decompressed
bytes) is copied and decompressed to at most that size (plus gzip's overhead) and one byte
more, and every download has a total deadline besides the per-read timeout, covering the
status line and headers too (its sockets are shut down when it passes), so a source that
never ends or trickles its headers fails with one line. A mirror directory's entry must be
a regular file: a FIFO, socket or device node there is refused before it is opened. A
transfer slower than a floor over a window (``SpeedFloor``, as curl's
``--speed-limit``/``--speed-time``) fails within about two windows, naming the URL,
without a retry: a source that trickles a byte at a time gives up in a minute, not at the
size-based deadline.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import http.client
import os
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from capsnet.io.errors import DataError
from capsnet.io.files import fsync_dir, input_problem, new_temp_file, remove_stale
from capsnet.io.outputset import atomic_directory

MIRROR_ENV = "CAPSNET_MIRROR"
DEADLINE_ENV = "CAPSNET_DOWNLOAD_DEADLINE"
CHUNK = 1 << 20
#: The most bytes a file of unknown size may have (affNIST's largest archive is far below).
MAX_UNKNOWN_BYTES = 4 << 30
#: A download's total deadline: this many seconds, plus its size at MIN_RATE bytes/s.
DEADLINE_BASE = 120.0
MIN_RATE = 32 * 1024


@dataclass(frozen=True)
class SpeedFloor:
    """A transfer that moves fewer than ``bytes_per_s`` on average over ``window_s``
    seconds (or waits that long for a byte) is given up."""

    bytes_per_s: float = 1024.0
    window_s: float = 30.0

    def __str__(self) -> str:
        return f"{self.bytes_per_s:g} bytes/s over {self.window_s:g} s"


#: The floor every download uses unless ``fetch`` is given another.
SPEED_FLOOR = SpeedFloor()


@dataclass(frozen=True)
class RemoteFile:
    """One official file: its name, where it lives, and the MD5 of its raw content.

    Files without a published MD5 (affNIST) set ``raw_md5=None`` and a ``check`` that
    raises DataError when the file is incomplete (for zips: every member's CRC-32).
    """

    dataset: str
    filename: str
    urls: tuple[str, ...]
    raw_md5: str | None
    check: Callable[[Path], None] | None = None
    size: int | None = None  # bytes of the decompressed content, where known

    @property
    def max_bytes(self) -> int:
        """The most bytes a copy of this file may have on the wire or decompressed: its
        size plus what gzip can add (stored blocks: 5 bytes per 16 KiB, a header), or
        MAX_UNKNOWN_BYTES when its size is not known."""
        if self.size is None:
            return MAX_UNKNOWN_BYTES
        return self.size + self.size // 2048 + 1024

    def deadline(self) -> float:
        """Seconds a whole download of this file may take: $CAPSNET_DOWNLOAD_DEADLINE, else
        DEADLINE_BASE plus its largest size at MIN_RATE."""
        text = os.environ.get(DEADLINE_ENV, "").strip()
        if text:
            try:
                value = float(text)
            except ValueError:
                value = -1.0
            if not 0 < value < float("inf"):
                raise DataError(f"${DEADLINE_ENV}={text!r}: expected seconds, a number > 0")
            return value
        return DEADLINE_BASE + self.max_bytes / MIN_RATE

    def verify(self, path: str | os.PathLike) -> str | None:
        """None when ``path`` is a verified copy, else why not."""
        if self.raw_md5 is not None:
            digest = raw_md5(path, self.max_bytes)
            if digest != self.raw_md5:
                return f"MD5 mismatch: raw content {digest}, expected {self.raw_md5}"
        if self.check is not None:
            try:
                self.check(Path(path))
            except DataError as exc:
                return str(exc)
        return None


def candidate_urls(remote: RemoteFile, mirror: str | None = None) -> list[str]:
    """Mirror first (``<mirror>/<dataset>/<filename>``), then the official URLs."""
    urls = []
    if mirror:
        urls.append(mirror.rstrip("/") + f"/{remote.dataset}/{remote.filename}")
    urls.extend(remote.urls)
    return urls


def raw_md5(path: str | os.PathLike, max_bytes: int | None = None) -> str:
    """MD5 of the decompressed content of ``path`` (gzip detected by its magic bytes);
    DataError when that content runs past ``max_bytes`` (a gzip bomb stops there)."""
    digest = hashlib.md5()
    seen = 0
    try:
        with open(path, "rb") as fh:
            opener = gzip.open if fh.read(2) == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                seen += len(chunk)
                if max_bytes is not None and seen > max_bytes:
                    raise DataError(
                        f"{path}: its content runs past {max_bytes} bytes, more than the file "
                        "it should be"
                    )
                digest.update(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    return digest.hexdigest()


def is_verified(path: str | os.PathLike, expected: str | RemoteFile) -> bool:
    """Whether ``path`` exists and matches an MD5 (or a RemoteFile's verification)."""
    path = Path(path)
    if not path.is_file():
        return False
    try:
        if isinstance(expected, RemoteFile):
            return expected.verify(path) is None
        return raw_md5(path) == expected
    except DataError:
        return False


class NoSource(DataError):
    """No candidate URL gave a verified copy: ``tried`` says why for each ("URL (reason)");
    ``missing``: none of them held the file at all (not found), as opposed to one that held
    a corrupt, short or refused copy."""

    def __init__(self, message: str, tried: list[str], missing: bool):
        super().__init__(message)
        self.tried, self.missing = tried, missing


class SourceRefused(Exception):
    """A source gave more bytes than its file can have, or took longer than its deadline."""


def _open_local(path: Path):
    """A local source: only a regular file is opened (the one input check): a FIFO, a
    socket or a device node could block for ever or never end, out of the deadline's reach."""
    problem = input_problem(path)
    if problem == "not found":
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    if problem is not None:
        raise SourceRefused(problem)
    return open(path, "rb"), path.stat().st_size


class _Deadline:
    """Shuts down every socket a download opens (``_Connection``) when its total deadline
    passes, so no read, the status line and headers included, outlasts it (a socket
    timeout bounds only the wait for each byte). Used as ``with _Deadline(ends)``."""

    _current = threading.local()  # the deadline of this thread's download

    def __init__(self, ends: float):
        self.ends, self.expired = ends, False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def __enter__(self) -> _Deadline:
        self._timer = threading.Timer(max(self.ends - time.monotonic(), 0.0), self._expire)
        self._timer.daemon = True
        self._timer.start()
        _Deadline._current.deadline = self
        return self

    def __exit__(self, *exc) -> None:
        _Deadline._current.deadline = None
        self._timer.cancel()

    @classmethod
    def watch(cls, sock: socket.socket) -> None:
        """Shut ``sock`` down at this thread's deadline (at once when it has passed)."""
        deadline = getattr(cls._current, "deadline", None)
        if deadline is None:
            return
        with deadline._lock:
            deadline._sockets.append(sock)
            if not deadline.expired:
                return
        _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _HTTPConnection(http.client.HTTPConnection):
    def connect(self):
        super().connect()
        _Deadline.watch(self.sock)


class _HTTPSConnection(http.client.HTTPSConnection):
    def connect(self):
        super().connect()
        _Deadline.watch(self.sock)


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(_HTTPSConnection, req, context=self._context)


def _open_source(url: str, timeout: float):
    """A readable stream and its size (or None) for a URL, a file:// URL or a local path;
    a network source's sockets are shut down at the download's ``_Deadline``."""
    if "://" not in url:
        return _open_local(Path(url))
    if url.startswith("file://"):
        return _open_local(Path(urllib.request.url2pathname(url[len("file://") :])))
    request = urllib.request.Request(url, headers={"User-Agent": "capsnet-pipeline"})
    opener = urllib.request.build_opener(_HTTPHandler(), _HTTPSHandler())
    response = opener.open(request, timeout=timeout)
    size = response.headers.get("Content-Length")
    return response, int(size) if size and size.isdigit() else None


class _Pace:
    """Bytes moved per window of ``floor.window_s`` seconds; SourceRefused below the floor."""

    def __init__(self, floor: SpeedFloor):
        self.floor, self.start, self.moved = floor, time.monotonic(), 0

    def add(self, count: int) -> None:
        self.moved += count
        now = time.monotonic()
        elapsed = now - self.start
        if elapsed < self.floor.window_s:
            return
        if self.moved < self.floor.bytes_per_s * elapsed:
            raise SourceRefused(
                f"slower than {self.floor}: {self.moved} bytes in the last {elapsed:.0f} s"
            )
        self.start, self.moved = now, 0

    def stalled(self) -> SourceRefused:
        return SourceRefused(f"slower than {self.floor}: no byte for {self.floor.window_s:g} s")


def _copy_to_temp(
    remote: RemoteFile, url: str, target: Path, timeout: float, progress: bool, floor: SpeedFloor
):
    """Stream ``url`` into a temporary file next to ``target``; return its path. SourceRefused
    when the source holds more than ``remote.max_bytes``, outlasts ``remote.deadline()``
    (headers included: ``_Deadline``) or moves slower than ``floor`` (a read waits at most
    ``floor.window_s``)."""
    from tqdm.auto import tqdm

    limit, deadline = remote.max_bytes, remote.deadline()
    ends = time.monotonic() + deadline
    late = SourceRefused(f"not complete after the {deadline:g} s deadline")
    fd, tmp = new_temp_file(target)
    try:
        with os.fdopen(fd, "wb") as out, _Deadline(ends) as watchdog:
            try:
                stream, size = _open_source(url, min(timeout, deadline, floor.window_s))
                pace = _Pace(floor)
                bar = tqdm(total=size, unit="B", unit_scale=True, desc=target.name,
                           disable=not progress, leave=False)  # fmt: skip
                with stream, bar:
                    if size is not None and size > limit:
                        raise SourceRefused(
                            f"{size} bytes, more than the {limit} the file can have"
                        )
                    written = 0
                    # a network response is read as bytes arrive: the deadline is checked often
                    is_http = isinstance(stream, http.client.HTTPResponse)
                    read = stream.read1 if is_http else stream.read
                    while chunk := _read(read, min(CHUNK, limit + 1 - written), pace):
                        written += len(chunk)
                        pace.add(len(chunk))
                        if written > limit:
                            raise SourceRefused(f"more than the {limit} bytes the file can have")
                        if time.monotonic() > ends:
                            raise late
                        out.write(chunk)
                        bar.update(len(chunk))
                    if watchdog.expired:  # the stream was cut short at the deadline
                        raise late
                    out.flush()
                    os.fsync(out.fileno())
            except Exception as exc:
                if watchdog.expired and exc is not late:  # a read the deadline cut short
                    raise late from None
                raise
        return tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read(read, size: int, pace: _Pace) -> bytes:
    """One read of at most ``size`` bytes; a read that times out (no byte for the floor's
    window) is the source being too slow, not a network error to retry."""
    try:
        return read(size)
    except TimeoutError:
        raise pace.stalled() from None


def _place_verified(remote: RemoteFile, tmp: Path, target: Path) -> str | None:
    """Rename the download ``tmp`` to ``target`` when it verifies (None), else remove it
    and say why not."""
    try:
        problem = remote.verify(tmp)
    except DataError as exc:  # e.g. a truncated .gz
        problem = str(exc).replace(str(tmp), "download")
    if problem is not None:
        tmp.unlink(missing_ok=True)
        return problem
    os.replace(tmp, target)
    fsync_dir(target.parent)
    return None


def fetch(
    remote: RemoteFile,
    directory: str | os.PathLike,
    mirror: str | None = None,
    retries: int = 3,
    backoff: float = 1.0,
    timeout: float = 60.0,
    progress: bool = True,
    floor: SpeedFloor | None = None,
) -> Path:
    """Make ``directory/remote.filename`` present and verified; return its path.

    A verified file already there is kept. Otherwise each candidate URL is tried (with
    ``retries`` attempts and exponential backoff for network errors); the first download
    whose raw MD5 matches is renamed into place. A source slower than ``floor`` (default
    SPEED_FLOOR) is given up at once.
    """
    floor = floor or SPEED_FLOOR
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / remote.filename
    if is_verified(target, remote):
        return target
    remove_stale(target)  # what a killed download left
    for stale in directory.glob(f".{remote.filename}.*.part"):  # the same, named by older runs
        stale.unlink(missing_ok=True)
    failures: list[str] = []
    missing = True
    for url in candidate_urls(remote, mirror):
        for attempt in range(retries):
            try:
                tmp = _copy_to_temp(remote, url, target, timeout, progress, floor)
            except (FileNotFoundError, SourceRefused) as exc:
                failures.append(f"{url} ({'not found' if isinstance(exc, OSError) else exc})")
                missing = missing and isinstance(exc, OSError)
                break
            except urllib.error.HTTPError as exc:
                failures.append(f"{url} (HTTP {exc.code})")
                missing = missing and exc.code in (404, 410)
                if exc.code in (404, 403, 410):
                    break
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                reason = getattr(exc, "reason", exc)
                if attempt == retries - 1:
                    failures.append(f"{url} ({reason})")
                    missing = False
            else:
                problem = _place_verified(remote, tmp, target)
                if problem is None:
                    return target
                failures.append(f"{url} ({problem})")
                missing = False
                break
            if attempt < retries - 1:
                time.sleep(backoff * 2**attempt)
    tried = "; ".join(failures)
    raise NoSource(
        f"{remote.dataset}/{remote.filename}: no source worked. Tried: {tried}. "
        f"Set ${MIRROR_ENV} (or data.mirror in params.yaml) to a directory or URL prefix "
        f"holding {remote.dataset}/{remote.filename}",
        failures,
        missing,
    )


def check_zip(path: Path) -> None:
    """Raise DataError unless ``path`` is a complete zip whose members' CRC-32s all match."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: corrupt zip ({exc})") from None
    if bad is not None:
        raise DataError(f"{path}: corrupt zip (CRC mismatch in member {bad})")


def safe_extract_zip(archive_path: str | os.PathLike, target: str | os.PathLike) -> list[Path]:
    """Extract every member of a zip into the directory ``target``, replacing it whole;
    refuse the archive when any member would land outside it (``../``, absolute paths,
    drive letters, symlinks).

    Members are extracted into a temporary sibling of ``target`` that is swapped in only
    when all succeeded (``capsnet.io.outputset.atomic_directory``), so a refused, corrupt or killed
    extraction leaves the earlier ``target`` as it was, and its debris is removed next time.
    """
    archive_path, target = Path(archive_path), Path(target)
    check_zip(archive_path)
    with zipfile.ZipFile(archive_path) as archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
        names = [_member_path(archive_path, target, m) for m in members]
        try:
            own = (*names, f".{archive_path.name}.*")  # and what older versions left inside
            with atomic_directory(target, own) as staging:
                for member, name in zip(members, names):
                    out = staging / name
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(member) as fin, open(out, "wb") as fout:
                        shutil.copyfileobj(fin, fout, CHUNK)
        except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
            raise DataError(f"{archive_path}: corrupt zip ({exc})") from None
    return [target / name for name in names]


def _member_path(archive_path: Path, target: Path, member: zipfile.ZipInfo) -> str:
    """The member's path relative to ``target``; DataError when it would land outside."""
    name = member.filename.replace("\\", "/")
    root = Path("/__capsnet_target__")
    dest = Path(os.path.normpath(root / name))
    is_link = (member.external_attr >> 16) & 0o170000 == 0o120000
    inside = dest.is_relative_to(root) and dest != root
    if name.startswith("/") or ":" in name or is_link or not inside:
        raise DataError(
            f"{archive_path}: member {member.filename!r} would be extracted outside "
            f"{target}; refusing the archive"
        )
    return dest.relative_to(root).as_posix()
