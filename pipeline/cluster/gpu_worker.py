"""Where the final training and the viewpoints experiment run: in this process, or on a
GPU worker of the Ray cluster.

A stage runs its training in-process when this machine has a CUDA GPU, or when no Ray
cluster is named (``$RAY_ADDRESS`` unset). When the driver has no GPU (a CPU-only head
node) and the cluster named by ``$RAY_ADDRESS`` has one, each unit of work becomes a Ray
task asking for one GPU (``num_gpus=1``): its arguments (the data) travel through the
object store, so the worker needs no data directory, and it returns its results (models
on the CPU) to the driver, which writes every output. Work submitted together
(``Runner.submit``) runs together: a cluster with N GPUs trains N runs at once.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from capsnet.cli.boundary import error_cause
from capsnet.io.errors import ConfigError

#: CPUs a GPU task asks for besides its GPU (data batching and the Python loop).
TASK_CPUS = 1


@dataclass
class Runner:
    """Calls ``fn(*args, **kwargs)`` in this process or, ``remote``, as a one-GPU Ray
    task; ``nodes`` lists the Ray node id each remote call ran on and ``spans`` its (start,
    end) on that node's clock (``time.time``), in the order their results were taken."""

    remote: bool = False
    reason: str = "in this process"
    nodes: list[str] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)

    def __call__(self, fn: Callable, *args, **kwargs) -> Any:
        return self.result(self.submit(fn, *args, **kwargs))

    def submit(self, fn: Callable, *args, **kwargs) -> Any:
        """Start ``fn(*args, **kwargs)``; ``result`` waits for its value. Remote: a Ray task
        returning at once, so calls submitted before any result is taken run side by side,
        one per free GPU. In this process: ``fn`` runs now."""
        if not self.remote:
            return _Done(fn(*args, **kwargs))
        import ray

        task = ray.remote(num_gpus=1, num_cpus=TASK_CPUS, max_retries=0)(_on_node)
        return task.remote(fn, *args, **kwargs)

    def result(self, pending: Any) -> Any:
        """The value of a ``submit``ted call (waiting for its task)."""
        if isinstance(pending, _Done):
            return pending.value
        import ray

        node, start, end, value = ray.get(pending)
        self.nodes.append(node)
        self.spans.append((start, end))
        return value

    def share(self, value: Any) -> Any:
        """``value`` as the argument of many submitted calls: remote, put into Ray's object
        store once (each task reads that copy); in this process, ``value`` itself."""
        if not self.remote:
            return value
        import ray

        return ray.put(value)


@dataclass(frozen=True)
class _Done:
    """The value of a call that ran in this process."""

    value: Any


def _on_node(fn: Callable, *args, **kwargs) -> tuple[str, float, float, Any]:
    """(the Ray node id this task ran on, its start and end time, ``fn(*args, **kwargs)``)."""
    import ray

    start = time.time()
    value = fn(*args, **kwargs)
    return ray.get_runtime_context().get_node_id(), start, time.time(), value


def check_client(address: str) -> None:
    """A ``ray://`` address needs Ray Client (grpcio, the ``cluster`` extra)."""
    if address.startswith("ray://"):
        try:
            import grpc  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"Ray address {address}: Ray Client is not installed; "
                f"pip install -e '.[cluster]' (ray[client])"
            ) from None


def connect(address: str, **options) -> None:
    """``ray.init`` at ``address``: a cluster that cannot be reached (down, a wrong address,
    or a head that wants an authentication token, which Ray reports only in its log) is a
    ConfigError naming the address and what to check; over Ray Client (``ray://``), one
    naming what failed: nothing listening there, the head's Ray Client server not starting
    this driver's session (``client_failure``), or Ray and Python versions that differ."""
    import ray

    check_client(address)
    try:
        ray.init(address=address, **options)
    except ConnectionError as exc:
        if address.startswith("ray://"):
            raise ConfigError(client_failure(address, exc)) from None
        mode = os.environ.get("RAY_AUTH_MODE") or "unset"
        raise ConfigError(
            f"Ray cluster at {address}: {error_cause(exc)}; check that its head runs at that "
            f"address (--address, RAY_ADDRESS); a head started with RAY_AUTH_MODE=token also "
            f"needs RAY_AUTH_MODE=token (here: {mode}) and its token (RAY_AUTH_TOKEN or "
            f"~/.ray/auth_token) in this shell"
        ) from None
    except RuntimeError as exc:
        if not (address.startswith("ray://") and "Version mismatch" in str(exc)):
            raise
        versions = " ".join(str(exc).split()).removeprefix("Version mismatch: ")
        raise ConfigError(
            f"Ray cluster at {address}: Ray Client needs the same Ray and Python (minor) "
            f"versions on both ends: {versions} (docs/sweeps-and-clusters.md)"
        ) from None


def client_failure(address: str, exc: BaseException) -> str:
    """Why a Ray Client connection to ``address`` failed, as one line: a port nobody
    answers on is the address's fault (``check_ray_address`` raises); a port that answers
    means a head whose Ray Client server did not start this driver's session, whose reason
    is in the head's log."""
    from pipeline.sweep.sections import check_ray_address

    check_ray_address(address)
    return (
        f"Ray cluster at {address}: its Ray Client server answered but did not start this "
        f"driver's session ({error_cause(exc)}): the cause is on the head, in "
        f"/tmp/ray/session_latest/logs/ray_client_server_*.err; the head needs Ray "
        f"{ray_version()} and Python {python_version()} as here, this project installed "
        f"(pip install -e '.[pipeline,cluster]') and RAY_AUTH_MODE/its token as the driver "
        f'(docs/sweeps-and-clusters.md, "Ray Client")'
    )


def ray_version() -> str:
    import ray

    return ray.__version__


def python_version() -> str:
    import platform

    return ".".join(platform.python_version_tuple()[:2])


def cluster_gpus() -> float:
    """GPUs of the alive nodes of the Ray cluster this process is connected to."""
    import ray

    return sum(n["Resources"].get("GPU", 0) for n in ray.nodes() if n.get("Alive"))


@contextlib.contextmanager
def placement(address: str | None = None, log: Callable[[str], None] | None = None
              ) -> Iterator[Runner]:  # fmt: skip
    """A Runner for one stage: remote when this machine has no CUDA GPU and the Ray
    cluster at ``address`` (default ``$RAY_ADDRESS``) has one; in-process otherwise.
    Joins the cluster for the stage's duration (unless this process already had)."""
    import torch

    say = log or (lambda line: None)
    address = address if address is not None else os.environ.get("RAY_ADDRESS", "")
    if torch.cuda.is_available():
        say("training in this process (it has a CUDA GPU)")
        yield Runner(reason="this process has a CUDA GPU")
        return
    if not address:
        yield Runner(reason="no Ray cluster named (RAY_ADDRESS unset)")
        return
    import ray

    owns = not ray.is_initialized()
    if owns:
        connect(address, log_to_driver=True)
    try:
        gpus = cluster_gpus()
        if gpus > 0:
            say(f"training on a GPU worker of the Ray cluster at {address} ({gpus:g} GPU(s))")
            yield Runner(remote=True, reason=f"Ray task with one GPU on {address}")
        else:
            say(f"training in this process: the Ray cluster at {address} has no GPU")
            yield Runner(reason=f"the Ray cluster at {address} has no GPU")
    finally:
        if owns:
            ray.shutdown()
