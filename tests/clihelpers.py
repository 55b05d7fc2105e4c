"""Running `capsnet` as a user does, and checking its one-line errors."""

import os
import subprocess
import sys


def run_cli(*args, env_extra=None, cwd=None):
    """`python -m capsnet ARGS` in a subprocess; returns the CompletedProcess."""
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "capsnet", *args], capture_output=True, text=True, env=env, cwd=cwd
    )


def assert_one_line_error(result, *fragments):
    """A non-zero exit with exactly one stderr line, no traceback, naming every fragment."""
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
