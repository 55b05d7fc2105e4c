"""Running `capsnet` as a user does (a subprocess) or in this process (cheaper: one real
subprocess per behaviour is enough), and checking its one-line errors."""

import os
import subprocess
import sys


def run_cli(*args, env_extra=None, cwd=None):
    """`python -m capsnet ARGS` in a subprocess; returns the CompletedProcess."""
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "capsnet", *args], capture_output=True, text=True, env=env, cwd=cwd
    )


def invoke_cli(*args, env_extra=None):
    """`capsnet ARGS` in this process (capsnet.cli.main's error boundary included); returns
    a CompletedProcess like ``run_cli``'s. An exception that escaped the boundary shows as
    a traceback on its stderr."""
    import traceback

    from click.testing import CliRunner

    from capsnet.cli import main

    args = [str(a) for a in args]
    done = CliRunner().invoke(main, args, env=env_extra)
    stderr = done.stderr
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        stderr += "".join(traceback.format_exception(done.exception))
    return subprocess.CompletedProcess(args, done.exit_code, done.stdout, stderr)


def assert_one_line_error(result, *fragments):
    """A non-zero exit with exactly one stderr line, no traceback, naming every fragment."""
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
