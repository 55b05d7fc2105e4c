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
    # Ray refuses object puts once the disk holding its temp folder is 95% used, counting
    # every other user of a shared disk (CI failed so: OutOfDiskError with the suite's own
    # files a small part of it); 1 turns the check off for the clusters the tests start.
    "RAY_local_fs_capacity_threshold": "1",
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
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Workers share the cores (.ci/run: two on two): torch in each on one thread, where a
    # second would mostly spin waiting for a core another worker holds; so do the processes
    # the tests start (DVC stages, CLI runs), through OpenMP's setting, unless it is set.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Inductor compiles in the process itself, not in a pool of compile processes per test
    # process (their start costs CPU the other worker needs; a compile failed now and then
    # in CI with the pool, InductorError, and the EM layers fell back to eager).
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch

    torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_MIRROR = REPO_ROOT.parent / "shared" / "datasets"


def pytest_collection_modifyitems(config, items):
    """The slowest test files first (tests/ciorder.py)."""
    from ciorder import slowest_first

    slowest_first(items)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


#: The committed run's files: what `dvc repro` in a workspace overwrites.
COMMITTED_RESULTS = ("README.md", "params.yaml", "dvc.lock", "eval", "sweep", "sweep-smallnorb",
                     "models-viewpoints.csv", "docs")  # fmt: skip


@pytest.fixture(scope="session")
def committed_root(tmp_path_factory) -> Path:
    """The committed results as git's HEAD holds them, exported to a folder: a workspace
    where `dvc repro` ran has other numbers, and tests compare the committed ones with each
    other, never the workspace's. Outside a git checkout: the checkout itself."""
    import subprocess

    out = tmp_path_factory.mktemp("committed")
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "HEAD", *COMMITTED_RESULTS],
        capture_output=True,
    )
    if archive.returncode != 0:
        return REPO_ROOT
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


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


def _shared_temp(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this run sees (the base temp without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _reproduce(work: Path, repo_root: Path, mnist_mirror: Path) -> str:
    """The shrunk pipeline of tests/test_dvc_repro.py in ``work`` after `dvc repro`,
    committed; the repro's output."""
    from test_dvc_repro import run, shrunk_copy

    work.mkdir(parents=True)
    dvc, env = shrunk_copy(work, repo_root, mnist_mirror, files=(".gitignore",))
    run(["git", "init", "-q", "-b", "main"], work, env)
    run([dvc, "init", "-q"], work, env)
    shutil.copy(repo_root / ".dvc" / "config", work / ".dvc" / "config")  # the plots page
    log = run([dvc, "repro"], work, env)
    run(["git", "add", "-A"], work, env)
    run(["git", "commit", "-q", "-m", "baseline"], work, env)
    return log


@pytest.fixture(scope="session")
def reproduced_project(tmp_path_factory, repo_root, mnist_mirror):
    """The real dvc.yaml on a shrunk params.yaml (tests/test_dvc_repro.py) in a git
    repository after `dvc repro`, committed: (its folder, the dvc command, the environment,
    the repro's output). Reproduced once per test run, by whichever pytest-xdist worker
    asks first (the others wait for it); read-only: tests work on a ``copy_project``."""
    from filelock import FileLock
    from test_dvc_repro import stage_env, tools

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    dvc = tools()
    shared = _shared_temp(tmp_path_factory)
    work, log_file = shared / "dvcproject" / "repo", shared / "dvcproject.log"
    with FileLock(str(shared / "dvcproject.lock")):
        if not log_file.is_file():
            if work.exists():
                pytest.fail(f"the shrunk `dvc repro` in {work} failed in another worker")
            log_file.write_text(_reproduce(work, repo_root, mnist_mirror))
    return work, dvc, stage_env(work, mnist_mirror), log_file.read_text()


def copy_project(reproduced, target: Path):
    """A private copy of ``reproduced`` (that fixture's tuple) at ``target``/repo, in the
    same form; DVC's cache files, which DVC never writes to, are hard links."""
    work, dvc, env, log = reproduced

    def link_cache(source, destination):
        if "/.dvc/cache/" in source:
            os.link(source, destination)
        else:
            shutil.copy2(source, destination)

    shutil.copytree(work.parent, target, symlinks=True, copy_function=link_cache)
    env = {**env, "CAPSNET_PARAMS_TRACE": str(target / "params-read.tsv")}
    return target / "repo", dvc, env, log


@pytest.fixture(scope="session")
def shrunk_project(tmp_path_factory, reproduced_project):
    """This worker's copy of ``reproduced_project``, shared by the DVC end-to-end tests
    (tests/test_dvc_repro.py, tests/test_dvc_experiments.py)."""
    return copy_project(reproduced_project, tmp_path_factory.mktemp("dvcproject") / "p")


@pytest.fixture
def project_copy(tmp_path, reproduced_project):
    """A copy of ``reproduced_project`` for one test."""
    return copy_project(reproduced_project, tmp_path / "dvcproject")


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
