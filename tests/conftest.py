"""Shared fixtures: offline environment, the MNIST mirror, a prepared data root."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

for _key, _value in {
    "DVC_NO_ANALYTICS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "NO_ALBUMENTATIONS_UPDATE": "1",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
}.items():
    os.environ.setdefault(_key, _value)
if os.environ.get("PYTEST_XDIST_WORKER") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    # Workers compiling at once in Inductor's one default cache failed a compile
    # (InductorError): each worker keeps its own, reused by the next run (kept apart per
    # ATEN_CPU_CAPABILITY as capsnet.nn.routing.em.compile_routing_function does).
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    _capability = os.environ.get("ATEN_CPU_CAPABILITY")
    _worker = os.environ["PYTEST_XDIST_WORKER"] + (f"_{_capability}" if _capability else "")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}_pytest_{_worker}"

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_MIRROR = REPO_ROOT.parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def mnist_mirror() -> Path:
    """The faithful MNIST mirror beside the repository (skips when absent)."""
    mirror = Path(os.environ.get("CAPSNET_MIRROR") or SHARED_MIRROR)
    if not (mirror / "mnist" / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"no MNIST mirror at {mirror}")
    return mirror


@pytest.fixture(scope="session")
def mnist_root(tmp_path_factory, mnist_mirror) -> Path:
    """A data root holding the verified raw MNIST files (copied from the mirror once)."""
    root = tmp_path_factory.mktemp("data")
    raw = root / "raw" / "mnist"
    raw.mkdir(parents=True)
    for gz in (mnist_mirror / "mnist").glob("*.gz"):
        shutil.copy(gz, raw / gz.name)
    return root


@pytest.fixture(scope="session")
def shrunk_project(tmp_path_factory, repo_root, mnist_mirror):
    """The real dvc.yaml on a shrunk params.yaml (tests/test_dvc_repro.py) in a git
    repository after `dvc repro`, committed: (its folder, the dvc command, the environment,
    the repro's output). The DVC end-to-end tests share this one pipeline run."""
    from test_dvc_repro import run, shrunk_copy

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    work = tmp_path_factory.mktemp("dvcproject") / "repo"
    dvc, env = shrunk_copy(work, repo_root, mnist_mirror, files=(".gitignore",))
    env.update(
        GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.org",
        GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.org",
    )  # fmt: skip
    run(["git", "init", "-q", "-b", "main"], work, env)
    run([dvc, "init", "-q"], work, env)
    shutil.copy(repo_root / ".dvc" / "config", work / ".dvc" / "config")  # the plots page
    log = run([dvc, "repro"], work, env)
    run(["git", "add", "-A"], work, env)
    run(["git", "commit", "-q", "-m", "baseline"], work, env)
    return work, dvc, env, log


@pytest.fixture
def one_torch_thread():
    """torch on one intra-op thread for the test, restored after: on a loaded 2-core machine
    a second thread mostly spins waiting for the first (a small EM training run took 300 s of
    CPU with two threads, about 25 s with one)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
