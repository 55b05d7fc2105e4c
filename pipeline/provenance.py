"""Where a run came from, for every W&B run's config and the README's results block: the
git commit, the DVC experiment, the hashes of params.yaml, the code and the data, and the
machine. Hashes are of content (parsed params, file bytes, DVC's recorded data hashes), so
the same inputs give the same values on any machine."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any


def content_hash(value: Any) -> str:
    """A short hash of a JSON-able value (keys sorted), e.g. a params section or a result."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit the run started from: DVC's baseline inside ``dvc exp run``, else HEAD of
    the repository at the working directory; None outside git."""
    baseline = os.environ.get("DVC_EXP_BASELINE_REV")
    if baseline:
        return baseline
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def machine() -> str:
    """The CPU model, its kind (the kernels torch runs and native bf16: what trained numbers
    depend on) and its core count."""
    from capsnet.training.device import cpu_kind

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({cpu_kind()}), {os.cpu_count()} cores"


#: The file a training stage writes beside its checkpoints: where they were trained.
ORIGIN_FILE = "ORIGIN.json"
ORIGIN_KEYS = ("git_commit", "machine")


def origin() -> dict[str, str | None]:
    """Where a run is made: the git commit it started from and the machine."""
    return dict(zip(ORIGIN_KEYS, (git_commit(), machine())))


def read_origin(directory: str | os.PathLike) -> dict[str, str | None]:
    """The origin a training stage recorded in ``directory`` (fields None without one:
    checkpoints from elsewhere say nothing of where they were trained). Its text reaches
    the README block and results.md, so it is checked (``check_origin``), never escaped."""
    from capsnet.io.errors import CapsnetError
    from capsnet.io.files import read_json

    path = Path(directory) / ORIGIN_FILE
    if not os.path.lexists(path):
        return dict.fromkeys(ORIGIN_KEYS)
    if not path.is_file():
        raise CapsnetError(f"{path}: not a file; remove it or rerun the train stage")
    recorded = read_json(path)
    if not isinstance(recorded, dict):
        raise CapsnetError(f"{path}: a JSON object expected")
    return check_origin(path, {key: recorded.get(key) for key in ORIGIN_KEYS})


#: A commit id: abbreviated or full SHA-1, or SHA-256.
_COMMIT = re.compile(r"[0-9a-f]{7,64}")
#: Characters a machine line may not hold: they would start markup in Markdown or HTML.
_MARKUP = set("<>`|[]\\")
MACHINE_MAX = 200


def check_origin(path: str | os.PathLike, origin: dict) -> dict[str, str | None]:
    """``origin`` when each field is null or plain: git_commit a hex commit id, machine one
    printable line without markup characters; CapsnetError naming ``path`` otherwise."""
    from capsnet.io.errors import CapsnetError

    commit, where = origin.get("git_commit"), origin.get("machine")
    if commit is not None and not (isinstance(commit, str) and _COMMIT.fullmatch(commit)):
        raise CapsnetError(
            f"{path}: git_commit {_shown(commit)} is not a commit id (7 to 64 hex digits) or null"
        )
    plain = (
        isinstance(where, str)
        and 0 < len(where) <= MACHINE_MAX
        and where.isprintable()
        and where == where.strip()
        and not _MARKUP & set(where)
    )
    if where is not None and not plain:
        raise CapsnetError(
            f"{path}: machine {_shown(where)} is not one plain line (printable, at most "
            f"{MACHINE_MAX} characters, none of {''.join(sorted(_MARKUP))}) or null"
        )
    return {"git_commit": commit, "machine": where}


#: What no published text may hold: a character that starts a tag, a comment (the README's
#: markers) or a table cell, in Markdown or HTML ("<=" and ">=" are plain text).
_TAG_OR_CELL = re.compile(r"<(?!=)|>(?!=)|\|")


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot reach the README or the report as it is, or None."""
    if not value.isprintable():
        return "is not one printable line"
    found = _TAG_OR_CELL.search(value)
    if found is not None:
        return f"holds {found.group(0)!r}, which would start markup"
    return None


def check_results_text(path: str | os.PathLike, results: Any) -> Any:
    """``results`` (metrics.json typed, ``capsnet.evaluation.results``) when every string in
    it, names and keys included, is plain text (``text_problem``); CapsnetError naming
    ``path``, the field and the value otherwise. The one check of what the README and the
    HTML report print from metrics.json."""
    import dataclasses

    from capsnet.io.errors import CapsnetError

    def walk(value: Any, where: str) -> None:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for item in dataclasses.fields(value):
                walk(getattr(value, item.name), f"{where}/{item.name}")
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key, f"{where} (a key)")
                walk(item, f"{where}/{key}")
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{where}/{index}")
        elif isinstance(value, str):
            problem = text_problem(value)
            if problem is not None:
                raise CapsnetError(
                    f"{path}: {where.lstrip('/') or 'a name'} {_shown(value)} {problem}; "
                    "rename it or rerun the evaluate stage"
                )

    walk(results, "")
    return results


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


def params_hash(params_path: str | os.PathLike = "params.yaml") -> str | None:
    """The hash of params.yaml's settings (parsed, so comments and layout do not count)."""
    import yaml

    try:
        return content_hash(yaml.safe_load(Path(params_path).read_text()))
    except (OSError, yaml.YAMLError):
        return None


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """The hash of the Python files of the capsnet and pipeline packages (what runs)."""
    import capsnet

    digest = hashlib.sha256()
    for package in (Path(capsnet.__file__).parent, Path(__file__).parent):
        for path in sorted(package.rglob("*.py")):
            digest.update(path.relative_to(package.parent).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def data_hash(lock_path: str | os.PathLike = "dvc.lock") -> str | None:
    """The hash of the data DVC recorded (every ``data/`` output's hash in dvc.lock), None
    without a dvc.lock. Parsed once per version of the file (a stage starts many runs)."""
    try:
        stat = os.stat(lock_path)
    except OSError:
        return None
    return _lock_data_hash(str(Path(lock_path).resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _lock_data_hash(path: str, _mtime_ns: int, _size: int) -> str | None:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: a large lock in ms
    try:
        text = Path(path).read_text()
        stages = (yaml.load(text, Loader=loader) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError):
        return None
    outs = sorted(
        (out.get("path", ""), out.get("md5", ""))
        for stage in stages.values()
        if isinstance(stage, dict)
        for out in stage.get("outs") or []
        if isinstance(out, dict) and str(out.get("path", "")).startswith("data/")
    )
    return content_hash(outs)


def provenance(params_path: str | os.PathLike = "params.yaml") -> dict[str, Any]:
    """What every run's config records about where it came from: the git commit, the DVC
    experiment, and the hashes of params.yaml, the code and the data."""
    return {
        "git_commit": git_commit(),
        "dvc_experiment": os.environ.get("DVC_EXP_NAME") or None,
        "params_hash": params_hash(params_path),
        "code_hash": code_hash(),
        "data_hash": data_hash(),
    }
