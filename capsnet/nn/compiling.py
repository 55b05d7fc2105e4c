"""What every ``torch.compile`` of the library does first."""

from __future__ import annotations

import logging

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
    import torch

    if torch.cuda.is_available():
        return
    logger = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _NoCudaRuntimeNote) for f in logger.filters):
        logger.addFilter(_NoCudaRuntimeNote())
