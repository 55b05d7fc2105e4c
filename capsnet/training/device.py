"""The device and precision policy of training and evaluation: which
device a run uses, its CUDA backend settings, and when autocast is on."""

from __future__ import annotations

import contextlib
import functools

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
    """The speed policy of a CUDA run, set in this one place (docs/guides/gpu.md): cuDNN picks
    the fastest convolution for the (fixed) batch shape, and fp32 matmuls may use TF32
    ("high"; bf16 runs keep their few fp32 matmuls fast too). Nothing changes elsewhere."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")


#: CPU flags that mark native bf16 arithmetic (/proc/cpuinfo): without them CPU autocast
#: emulates bf16, several times slower than fp32 (BENCHMARKS.md, "CPU bf16").
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpu_flags() -> set[str]:
    """This machine's CPU flags (empty where /proc/cpuinfo is missing or unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def bf16_matches_fp32() -> bool:
    """The accuracy check of CPU bf16: a convolution and a matmul under CPU bf16 autocast
    agree with fp32 to bf16's precision (relative error below 2e-2), so a broken or
    emulated kernel never gets picked silently."""
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(4, 2, 12, 12, generator=generator)  # (B, C, H, W)
    weight = torch.randn(8, 2, 5, 5, generator=generator) / 5  # (C_out, C, k, k)
    matrix = torch.randn(512, 10, generator=generator) / 16  # (8 * 8 * 8, K)

    def run() -> torch.Tensor:
        features = torch.nn.functional.conv2d(images, weight).flatten(1)  # (B, 512)
        return (features @ matrix).float()  # (B, K)

    reference = run()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reduced = run()
    error = (reduced - reference).norm() / reference.norm()
    return bool(torch.isfinite(error)) and float(error) < 2e-2


@functools.cache
def cpu_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively: torch's kernels run at AVX-512 or above
    (``ATEN_CPU_CAPABILITY=avx2`` makes the machine an AVX2 one), the CPU has avx512_bf16
    or AMX, and the accuracy check (``bf16_matches_fp32``) holds."""
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith(("AVX512", "AMX")):
        return False
    if not set(NATIVE_BF16_FLAGS) & _cpu_flags():
        return False
    return bf16_matches_fp32()


def cpu_kind() -> str:
    """This CPU as trained numbers depend on it: the kernels torch runs (AVX2, AVX-512, ...)
    and whether ``auto`` trains in bf16 here ("AVX-512, native bf16")."""
    capability = torch.backends.cpu.get_cpu_capability().replace("AVX512", "AVX-512")
    return f"{capability}, native bf16" if cpu_native_bf16() else capability


def effective_precision(device: torch.device, amp: str | None = None) -> str:
    """The precision a run with ``amp`` (``TrainConfig.amp``, its default when None) really
    computes in on ``device``: bf16 for ``bf16`` on CUDA and the CPU, for ``auto`` on CUDA
    and on a CPU with native bf16 (``cpu_native_bf16``); fp32 everywhere else (MPS, meta)."""
    from capsnet.config.training import TrainConfig

    amp = amp or TrainConfig.amp
    if amp == "fp32" or device.type not in ("cuda", "cpu"):
        return "fp32"
    if device.type == "cuda" or amp == "bf16":
        return "bf16"
    return "bf16" if cpu_native_bf16() else "fp32"


def autocast(device: torch.device, amp: str | None = None):
    """The precision policy of training and evaluation (``effective_precision``): bf16
    autocast where it picks bf16; none elsewhere. Under it squash, the routing softmax and
    the losses still compute in fp32."""
    if effective_precision(device, amp) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()  # (torch.autocast refuses some devices, e.g. meta)
