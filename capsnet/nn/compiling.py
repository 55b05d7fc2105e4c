"""What every ``torch.compile`` of the library does first."""

from __future__ import annotations

import logging

import torch

#: The record torch logs when a machine has a CUDA toolkit but no CUDA runtime.
NO_CUDA_RUNTIME = "No CUDA runtime is found"


class _NoCudaRuntimeNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(NO_CUDA_RUNTIME)


def quiet_cuda_home_probe() -> None:
    """Drop the one warning compiling for the CPU prints on a machine with a CUDA toolkit
    (nvcc, /usr/local/cuda) but no CUDA device: Inductor imports
    ``torch.utils.cpp_extension``, whose import looks for the toolkit and logs "No CUDA
    runtime is found, using CUDA_HOME=..." when torch sees no device. A CPU compilation
    needs no CUDA, so the record is noise in a stage's log; every other record of that
    logger, and the warning on a machine with a device, stays."""
    if torch.cuda.is_available():
        return
    logger = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _NoCudaRuntimeNote) for f in logger.filters):
        logger.addFilter(_NoCudaRuntimeNote())


#: The device types torch has autocast for (not meta), read once at import.
AUTOCAST_DEVICES = frozenset(
    kind
    for kind in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla")
    if torch.amp.is_autocast_available(kind)
)


def has_autocast(device_type: str) -> bool:
    """Whether torch has autocast for ``device_type``. Read from ``AUTOCAST_DEVICES``, not
    ``torch.amp.is_autocast_available``: Dynamo cannot trace that one, and a compiled
    forward calling it breaks its graph there on every step."""
    return device_type in AUTOCAST_DEVICES
