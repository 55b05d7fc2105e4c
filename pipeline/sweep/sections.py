"""What ``capsnet sweep`` (pipeline/sweep/cli.py) and ``capsnet train-final``
(pipeline/final/cli.py) share: the params option, the sections and where each sweep
writes. Each command lives in its own module, so a
DVC stage depends only on the code its command imports.

``--section`` picks the params section: ``sweep`` / ``train`` (MNIST, the defaults) or
``smallnorb_sweep`` / ``smallnorb_train`` (the EM paper's smallNORB ablation). With
smallNORB switched off both commands exit 0 and write outputs marked DISABLED."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from capsnet.cli.options import check_output, data_root_option, params_option
from capsnet.io.errors import ConfigError

PARAMS_OPTION = params_option("sections sweep, train, smallnorb_sweep, smallnorb_train")
DATA_ROOT_OPTION = data_root_option()
SWEEP_SECTIONS = ("sweep", "smallnorb_sweep")
TRAIN_SECTIONS = ("train", "smallnorb_train")
#: Each sweep section's output directory (also where train-final reads best.json), so the
#: smallNORB sweep never writes over the MNIST one by default.
SWEEP_OUT = {"sweep": Path("sweep"), "smallnorb_sweep": Path("sweep-smallnorb")}


def load_params(params_path: Path):
    from capsnet import config

    return config.load(params_path)


def check_sweep_outputs(params_path: Path, section: str, sweep) -> None:
    """The sweep section's local storage and W&B directories, where the run will put them
    (``tracking.workspace_path``), are writable (before any work)."""
    from pipeline.tracking import workspace_path

    name = Path(params_path).name
    if "://" not in sweep.storage_path:
        check_output(workspace_path(sweep.storage_path), f"{name}: {section}.storage_path")
    check_output(workspace_path(sweep.wandb.dir), f"{name}: {section}.wandb.dir")


#: Tries, and seconds each may take, before a Ray address that does not answer is refused.
RAY_PROBE_TRIES = 3
RAY_PROBE_TIMEOUT = 2.0


def check_ray_address(address: str) -> None:
    """Refuse a ``host:port`` or ``ray://host:port`` Ray address where nothing accepts a
    connection after RAY_PROBE_TRIES tries, before any work (Ray itself retries without
    end). ``local`` and ``auto`` are Ray's to resolve."""
    if address in ("local", "auto"):
        return
    hostport = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"Ray address {address!r} (--address / $RAY_ADDRESS): expected local, auto, "
            "host:port or ray://host:port"
        )
    reason = ""
    for attempt in range(RAY_PROBE_TRIES):
        try:
            with socket.create_connection((host.strip("[]"), int(port)), RAY_PROBE_TIMEOUT):
                return
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
        if attempt < RAY_PROBE_TRIES - 1:
            time.sleep(1.0)
    raise ConfigError(
        f"Ray address {address} (--address / $RAY_ADDRESS): nothing answers at {hostport} "
        f"({reason}) after {RAY_PROBE_TRIES} tries; start the cluster or use --address local"
    )


@contextlib.contextmanager
def sigint_seen() -> Iterator[tuple[list[bool], Callable[[], bool]]]:
    """Yield a one-item list that is ``[True]`` after the block when SIGINT arrived during
    it, and ``poll()``, which says so while the block runs, whoever handled the signal
    (Ray Tune installs its own handler and ends ``fit`` quietly): the signal's number is
    read back from ``signal.set_wakeup_fd``."""
    seen = [False]
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not the main thread: nothing to watch
        previous = None

    def poll() -> bool:
        """Whether SIGINT has arrived so far (also while the block runs)."""
        with contextlib.suppress(BlockingIOError, OSError):
            seen[0] = seen[0] or signal.SIGINT in os.read(read_end, 4096)
        return seen[0]

    try:
        yield seen, poll
    finally:
        if previous is not None:
            signal.set_wakeup_fd(previous)
        poll()
        os.close(read_end)
        os.close(write_end)
