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
    """The CPU model and core count (trained numbers differ across CPUs; data do not)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


#: The file a training stage writes beside its checkpoints: where they were trained.
ORIGIN_FILE = "ORIGIN.json"
ORIGIN_KEYS = ("git_commit", "machine")


def origin() -> dict[str, str | None]:
    """Where a run is made: the git commit it started from and the machine."""
    return dict(zip(ORIGIN_KEYS, (git_commit(), machine())))


def read_origin(directory: str | os.PathLike) -> dict[str, str | None]:
    """The origin a training stage recorded in ``directory`` (fields None without one:
    checkpoints from elsewhere say nothing of where they were trained)."""
    from capsnet.errors import CapsnetError
    from capsnet.io import read_json

    path = Path(directory) / ORIGIN_FILE
    recorded = read_json(path) if path.is_file() else {}
    if not isinstance(recorded, dict):
        raise CapsnetError(f"{path}: a JSON object expected")
    return {key: v if isinstance(v := recorded.get(key), str) else None for key in ORIGIN_KEYS}


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
    without a dvc.lock."""
    import yaml

    try:
        stages = (yaml.safe_load(Path(lock_path).read_text()) or {}).get("stages") or {}
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
