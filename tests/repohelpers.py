"""A copy of the repository for tests that edit it (a toy stage, a dataset module)."""

import shutil
import subprocess
from pathlib import Path

import pytest


def tracked_copy(repo_root: Path, work: Path) -> Path:
    """The repository's git-tracked files, as the workspace holds them, committed in a
    fresh git repository at ``work``; skips without git."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=repo_root, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in filter(None, tracked):
        if (repo_root / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo_root / name, work / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run([*git, *args], cwd=work, check=True, capture_output=True)
    return work
