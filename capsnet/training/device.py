"""The device and precision policy of training and evaluation: which
device a run uses, its CUDA backend settings, and when autocast is on."""

from __future__ import annotations

import contextlib

import torch

from capsnet.io.errors import ConfigError


def select_device(name: str = "auto") -> torch.device:
    """cuda, then mps, then cpu for "auto"; otherwise the named device, checked by running
    one small tensor operation on it (a ConfigError naming --device when it cannot run)."""
    if name == "auto":
        if torch.cuda.is_available():
            device = torch.device("cuda")
        elif getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            device = torch.device("mps")
        else:
            return torch.device("cpu")
    else:
        device = _named_device(name)
    try:
        probe = torch.ones(2, device=device)  # (2,)
        float((probe + probe).sum().cpu())
    except (RuntimeError, AssertionError, NotImplementedError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"--device {name}: torch cannot run on {device} ({first}); choose auto or cpu"
        ) from None
    return device


def _named_device(name: str) -> torch.device:
    """``torch.device(name)`` for a device type this torch has and this machine offers."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(
            f"--device {name!r} is not a torch device (auto, cpu, cuda, mps)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(
            f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {name}: MPS is not available on this machine")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {name}: training runs on cpu, cuda or mps")
    return device


def mark_step(device: torch.device) -> None:
    """Tell a model compiled with CUDA graphs (torch.compile, reduce-overhead) that a new
    step begins. Off CUDA there are no CUDA graphs, and the mark would only import
    Inductor (seconds of CPU time in a process that trains or evaluates uncompiled)."""
    if device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()


def configure_backends(device: torch.device) -> None:
    """The speed policy of a CUDA run, set in this one place (docs/gpu.md): cuDNN picks
    the fastest convolution for the (fixed) batch shape, and fp32 matmuls may use TF32
    ("high"; bf16 runs keep their few fp32 matmuls fast too). Nothing changes elsewhere."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")


def effective_precision(device: torch.device, amp: str | None = None) -> str:
    """The precision a run with ``amp`` (``TrainConfig.amp``, default when None) really
    computes in on ``device``: bf16 on CUDA for ``bf16``; fp32 everywhere else."""
    from capsnet.config.training import TrainConfig

    return "bf16" if (amp or TrainConfig.amp) == "bf16" and device.type == "cuda" else "fp32"


def autocast(device: torch.device, amp: str | None = None):
    """The precision policy of training and evaluation (``effective_precision``): bf16
    autocast on CUDA for ``bf16``; none elsewhere. Under it squash, the routing softmax and
    the losses still compute in fp32."""
    if effective_precision(device, amp) == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()  # (torch.autocast refuses some devices, e.g. meta)
