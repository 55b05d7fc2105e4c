"""A shared DVC remote over the S3 protocol: dvc-s3 against a real S3-compatible server
(moto's, started on loopback for the test), in a tiny DVC project of one stage. The push is
the cluster job's (pipeline/cluster/dvc_remote.sh); the pull is the team workflow of
docs/guides/pipeline.md in a fresh clone: the models and the run cache come back."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "capsnet-dvc"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def s3_server(tmp_path):
    """moto's S3 server on 127.0.0.1 with one bucket: (endpoint URL, environment)."""
    pytest.importorskip("moto.server", reason="moto[server] (the dev extra) is not installed")
    boto3 = pytest.importorskip("boto3")
    port = _free_port()
    log = open(tmp_path / "moto.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto server did not start: {(tmp_path / 'moto.log').read_text()}")
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "DVC_NO_ANALYTICS": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            env.pop(key, None)
        s3 = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id="testing",
            aws_secret_access_key="testing", region_name="us-east-1",
        )  # fmt: skip
        s3.create_bucket(Bucket=BUCKET)
        yield endpoint, env, s3
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def run(*args: str, cwd: Path, env: dict) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout + done.stderr


STAGE = """stages:
  train:
    cmd: python -c "import pathlib; pathlib.Path('models').mkdir(exist_ok=True);
      pathlib.Path('models/m.pt').write_bytes(bytes(range(256)) * 8);
      open('runs.log', 'a').write('ran\\n')"
    deps:
      - seed.txt
    outs:
      - models
"""


def test_models_and_run_cache_go_through_an_s3_remote_to_a_fresh_clone(s3_server, tmp_path):
    if shutil.which("dvc", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("dvc (the pipeline extra) is not installed")
    endpoint, env, s3 = s3_server
    url = f"s3://{BUCKET}/store"
    work, origin, fresh = tmp_path / "work", tmp_path / "origin.git", tmp_path / "fresh"
    work.mkdir()
    git = ("git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main")
    run(*git, "init", "-q", cwd=work, env=env)
    run("dvc", "init", "-q", cwd=work, env=env)
    (work / "dvc.yaml").write_text(STAGE)
    (work / ".gitignore").write_text("runs.log\n")
    (work / "seed.txt").write_text("0\n")  # a stage without deps is never run-cached
    run("dvc", "repro", cwd=work, env=env)
    run(*git, "add", "-A", cwd=work, env=env)
    run(*git, "commit", "-qm", "run", cwd=work, env=env)

    # the cluster job's push: remote "job" at the S3 endpoint, outputs and run cache
    pushed = {**env, "CAPSNET_DVC_REMOTE": url, "CAPSNET_DVC_ENDPOINT": endpoint}
    run("bash", str(ROOT / "pipeline/cluster/dvc_remote.sh"), "push", "train", cwd=work,
        env=pushed)  # fmt: skip
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert any(k.startswith("store/files/md5/") for k in keys), keys
    assert any(k.startswith("store/runs/") for k in keys), keys  # the run cache

    # a teammate: clone, add the remote (docs/guides/pipeline.md), pull
    run("git", "clone", "-q", "--bare", str(work), str(origin), cwd=tmp_path, env=env)
    run("git", "clone", "-q", str(origin), str(fresh), cwd=tmp_path, env=env)
    failed = subprocess.run(["dvc", "pull"], cwd=fresh, env=env, capture_output=True, text=True)
    assert failed.returncode != 0 and "No remote provided" in failed.stderr  # as the README says
    run("dvc", "remote", "add", "--local", "-d", "shared", url, cwd=fresh, env=env)
    run("dvc", "remote", "modify", "--local", "shared", "endpointurl", endpoint, cwd=fresh,
        env=env)  # fmt: skip
    run("dvc", "pull", "--run-cache", cwd=fresh, env=env)
    assert (fresh / "models/m.pt").read_bytes() == (work / "models/m.pt").read_bytes()
    assert "up to date" in run("dvc", "status", cwd=fresh, env=env)

    # the run cache came too: with the output gone, repro restores it without running
    shutil.rmtree(fresh / "models")
    shutil.rmtree(fresh / ".dvc" / "cache" / "files")
    run("dvc", "pull", "--run-cache", cwd=fresh, env=env)
    shutil.rmtree(fresh / "models")
    said = run("dvc", "repro", cwd=fresh, env=env)
    assert "is cached" in said and not (fresh / "runs.log").exists(), said
    assert (fresh / "models/m.pt").read_bytes() == (work / "models/m.pt").read_bytes()
