"""Throughput benchmark: training-step and inference images/s of a capsule model.

Implementations, measured interleaved in one process (round-robin, medians of rounds):
  capsnet  the registered model (``--model``, default ``capsnet``);
  naive    benchmarks/naive_capsnet.py with the same configuration (.repeat tiling);
  conv     the two convolutions alone (conv1 + primary conv, ReLU): the practical ceiling,
           channels_last like ``capsnet``.
A training step is what ``fit`` runs: forward and margin + reconstruction loss (the conv
ceiling: the sum of its output) under the training precision (``--amp``, TrainConfig's
policy: bf16 autocast on CUDA only), backward and an Adam step (fused on CUDA); with
``--compile`` the capsule model is compiled as training compiles it (``compile_routing``).
``--cpu-bf16`` (CPU only) adds ``capsnet-cpu-bf16``: the capsnet model again under bf16
autocast on the CPU, which training never uses, timed in the same rounds as the fp32 one.
Peak memory of a training step is measured per implementation in a fresh subprocess: on
CUDA the peak GPU memory (torch.cuda.max_memory_allocated), elsewhere the peak RSS (/proc
VmHWM, else resource.getrusage).

Run from a source checkout: ``capsnet bench``, ``python -m benchmarks.throughput`` or
``python benchmarks/throughput.py`` (same options); the library call is ``run(...) -> dict``.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import click
import torch
import torch.nn.functional as F
from torch import nn

from capsnet.cli.declared import Command
from capsnet.cli.options import MAX_COUNT, count, train_default
from capsnet.config.sweep import PRECISIONS
from capsnet.config.training import TrainConfig
from capsnet.io.errors import CapsnetError
from capsnet.training.device import autocast, configure_backends, mark_step, select_device

ROOT = Path(__file__).resolve().parents[1]
IMPLEMENTATIONS = ("capsnet", "naive", "conv")
TARGETS = {
    "train_vs_naive": 2.2,
    "train_vs_conv": 0.85,
    "infer_vs_conv": 0.85,
    "rss_vs_naive": 0.5,
    "gpu_memory_vs_naive": 0.5,
}
#: What the targets were set for: the full CapsNet at these batch sizes.
TARGET_MODEL, TARGET_BATCHES = "capsnet", (32, 128)
#: The bench-only precision of ``--cpu-bf16``: bf16 autocast on the CPU.
CPU_BF16 = "cpu-bf16"
CPU_BF16_IMPL = f"capsnet-{CPU_BF16}"


def targets_for(model: str, batch: int) -> dict[str, float]:
    """The targets that apply to ``model`` at ``batch`` (none for a smoke run)."""
    return dict(TARGETS) if model == TARGET_MODEL and batch in TARGET_BATCHES else {}


class ConvCeiling(nn.Module):
    """conv1 + primary conv with ReLU: about 98% of CapsNet's FLOPs."""

    def __init__(self, config):
        super().__init__()
        self.conv1 = nn.Conv2d(config.in_channels, config.conv_channels, config.conv_kernel)
        self.conv2 = nn.Conv2d(
            config.conv_channels,
            config.primary_types * config.primary_dim,
            config.primary_kernel,
            stride=config.primary_stride,
        )
        self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)  # (B, C, H, W)
        return F.relu(self.conv2(F.relu(self.conv1(x))))  # (B, 256, 6, 6)


def build_impl(name: str, model: str = "capsnet", seed: int = 0) -> nn.Module:
    """One implementation by name; all share the configuration of registered ``model``."""
    from capsnet.models import build

    torch.manual_seed(seed)
    ours = build(model)
    if name == "capsnet":
        return ours
    if name == "naive":
        from benchmarks.naive_capsnet import NaiveCapsNet

        return NaiveCapsNet.from_model(ours)
    if name == "conv":
        return ConvCeiling(ours.config)
    raise ValueError(f"unknown implementation {name!r}; choose from {', '.join(IMPLEMENTATIONS)}")


def _loss(output, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Margin + 0.0005 reconstruction loss (Sabour et al. 2017); the conv ceiling sums its output"""
    from capsnet.nn import losses

    if isinstance(output, torch.Tensor):
        return output.sum()
    scores, _, reconstruction = output
    loss = losses.margin_loss(scores, targets)
    if reconstruction is not None:
        loss = loss + losses.reconstruction_loss(reconstruction, images)
    return loss


def make_steps(
    module: nn.Module, batch: int, config, device: torch.device, amp: str = TrainConfig.amp
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(train_step, infer_step) closures on fixed random data of ``batch`` images, under
    the ``amp`` precision policy (or ``CPU_BF16``), with Adam fused where training fuses it."""
    module.to(device)
    size = config.input_size
    images = torch.rand(batch, config.in_channels, size, size, device=device)  # (B, C, H, W)
    targets = torch.randint(0, config.num_classes, (batch,), device=device)  # (B,)
    params = list(module.parameters())
    fused = all(p.is_cuda and p.is_floating_point() for p in params) or None
    optimizer = torch.optim.Adam(params, lr=1e-3, fused=fused)

    def train_step() -> None:
        module.train()
        mark_step(device)
        with _precision(device, amp):
            loss = _loss(module(images, targets), images, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def infer_step() -> None:
        module.eval()
        mark_step(device)
        with torch.inference_mode(), _precision(device, amp):
            module(images)

    return train_step, infer_step


def _precision(device: torch.device, amp: str):
    """Training's precision policy (``capsnet.training.device.autocast``), or bf16 autocast on the
    CPU for ``CPU_BF16``."""
    if amp == CPU_BF16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return autocast(device, amp)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _maybe_compile(module: nn.Module, enabled: bool) -> nn.Module:
    """The module compiled as training compiles it (``compile_routing`` where the model has
    it, else torch.compile) when asked; the eager module if compiling is unavailable."""
    if not enabled:
        return module
    try:
        if hasattr(module, "compile_routing"):
            return module.compile_routing()
        return torch.compile(module)
    except Exception as exc:  # compile support varies by platform: fall back to eager
        print(f"torch.compile unavailable ({exc}); using eager", file=sys.stderr)
        return module


def measure(
    implementations: Sequence[str],
    batch_sizes: Sequence[int],
    rounds: int,
    steps: int,
    model: str = "capsnet",
    device: str = "cpu",
    compile: bool = False,
    amp: str = TrainConfig.amp,
    cpu_bf16: bool = False,
) -> dict[str, dict[str, dict[str, float]]]:
    """Median images/s per mode ("train", "infer"), implementation and batch size.

    Every round times ``steps`` steps of each (mode, implementation) in turn, so a load
    change on a shared machine hits all implementations alike. ``cpu_bf16`` adds
    ``CPU_BF16_IMPL``: the capsnet model (same weights) under bf16 autocast on the CPU.
    """
    dev = torch.device(device)
    configure_backends(dev)
    modules = {name: build_impl(name, model).to(dev) for name in implementations}
    precisions = dict.fromkeys(modules, amp)
    if cpu_bf16:
        modules[CPU_BF16_IMPL] = build_impl("capsnet", model).to(dev)
        precisions[CPU_BF16_IMPL] = CPU_BF16
    config = modules["capsnet"].config if "capsnet" in modules else build_impl("capsnet").config
    results: dict[str, dict[str, dict[str, float]]] = {"train": {}, "infer": {}}
    for batch in batch_sizes:
        fns: dict[tuple[str, str], Callable[[], None]] = {}
        for name, module in modules.items():
            module = _maybe_compile(module, compile and name != "naive")
            train_step, infer_step = make_steps(module, batch, config, dev, precisions[name])
            fns["train", name] = train_step
            fns["infer", name] = infer_step
        for fn in fns.values():  # warm-up (allocator, oneDNN primitives, compilation)
            fn()
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in fns}
        keys = list(fns)
        for r in range(rounds):
            for key in keys[r % len(keys) :] + keys[: r % len(keys)]:  # rotate the order
                _sync(dev)
                start = time.perf_counter()
                for _ in range(steps):
                    fns[key]()
                _sync(dev)
                samples[key].append(batch * steps / (time.perf_counter() - start))
        print(f"measured batch {batch}", file=sys.stderr, flush=True)
        for (mode, name), values in samples.items():
            results[mode].setdefault(name, {})[str(batch)] = statistics.median(values)
    return results


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB.

    Linux: VmHWM of /proc/self/status, because ru_maxrss survives fork + exec and would
    report the (larger) parent's peak; elsewhere resource.getrusage's ru_maxrss.
    """
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB -> MiB
    import resource

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)  # bytes or KiB


def _memory_worker(name: str, model: str, batch: int, device: str, amp: str) -> None:
    """Run in a subprocess: two training steps; print the peak memory (MiB) as JSON: GPU
    memory allocated on CUDA, else the process's peak RSS."""
    dev = torch.device(device)
    configure_backends(dev)
    module = build_impl(name, model)
    config = build_impl("capsnet", model).config
    train_step, _ = make_steps(module, batch, config, dev, amp)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        before = peak_rss_mb()
    train_step()
    train_step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        peak = peak_rss_mb()
    print(json.dumps({"peak_mb": peak, "before_mb": before}))


def measure_memory(
    implementations: Sequence[str],
    batch: int,
    model: str = "capsnet",
    device: str = "cpu",
    amp: str = TrainConfig.amp,
) -> dict[str, dict[str, float]]:
    """Peak memory (MiB) of a training step per implementation, each in a fresh process:
    GPU memory on CUDA, RSS elsewhere."""
    out: dict[str, dict[str, float]] = {}
    for name in implementations:
        code = (
            "import sys; from benchmarks.throughput import _memory_worker; "
            "_memory_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, name, model, str(batch), device, amp],
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"memory run of {name} failed:\n{proc.stderr.strip()[-2000:]}")
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _memory_key(device: str) -> str:
    """The result key of the peak memory: GPU memory on CUDA, RSS elsewhere."""
    return "peak_gpu_mb" if torch.device(device).type == "cuda" else "peak_rss_mb"


def ratios(result: dict) -> dict[str, dict[str, float]]:
    """The target ratios of issue 2 per batch size (only those whose inputs were measured)."""
    memory_key = _memory_key(result["device"])
    train, infer, rss = result["train"], result["infer"], result.get(memory_key, {})
    out: dict[str, dict[str, float]] = {}
    for batch in result["batch_sizes"]:
        key = str(batch)
        r: dict[str, float] = {}
        ours_t = train.get("capsnet", {}).get(key)
        ours_i = infer.get("capsnet", {}).get(key)
        if ours_t and "naive" in train:
            r["train_vs_naive"] = ours_t / train["naive"][key]
        if ours_t and "conv" in train:
            r["train_vs_conv"] = ours_t / train["conv"][key]
        if ours_i and "conv" in infer:
            r["infer_vs_conv"] = ours_i / infer["conv"][key]
        if ours_t and CPU_BF16_IMPL in train:
            r["cpu_bf16_train_speedup"] = train[CPU_BF16_IMPL][key] / ours_t
            r["cpu_bf16_infer_speedup"] = infer[CPU_BF16_IMPL][key] / ours_i
        out[key] = r
    if "capsnet" in rss and "naive" in rss:
        ratio = "gpu_memory_vs_naive" if memory_key == "peak_gpu_mb" else "rss_vs_naive"
        out.setdefault(str(result["rss_batch"]), {})[ratio] = (
            rss["capsnet"]["peak_mb"] / rss["naive"]["peak_mb"]
        )
    return out


def run(
    batch_sizes: Sequence[int] = (32, 128),
    rounds: int = 5,
    steps: int = 2,
    implementations: Sequence[str] = IMPLEMENTATIONS,
    model: str = "capsnet",
    device: str = "cpu",
    rss: bool = True,
    compile: bool = False,
    amp: str = TrainConfig.amp,
    cpu_bf16: bool = False,
) -> dict:
    """Measure everything; returns the dict that ``main`` prints as its JSON line."""
    unknown = sorted(set(implementations) - set(IMPLEMENTATIONS))
    if unknown:
        raise ValueError(f"unknown implementation(s) {', '.join(unknown)}")
    if cpu_bf16 and ("capsnet" not in implementations or torch.device(device).type != "cpu"):
        raise CapsnetError("--cpu-bf16 compares the capsnet implementation on --device cpu")
    result: dict = {
        "model": model,
        "device": device,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "batch_sizes": list(batch_sizes),
        "rounds": rounds,
        "steps": steps,
        "compile": compile,
        "amp": amp,
        "cpu_bf16": cpu_bf16,
        "cpu_flags": cpu_flags(),
    }
    if torch.device(device).type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(torch.device(device))
    result.update(
        measure(implementations, batch_sizes, rounds, steps, model, device, compile, amp, cpu_bf16)
    )
    if rss:
        result["rss_batch"] = max(batch_sizes)
        result[_memory_key(device)] = measure_memory(
            implementations, max(batch_sizes), model, device, amp
        )
    result["ratios"] = ratios(result)
    result["targets"] = {
        str(batch): targets_for(model, batch) for batch in batch_sizes if targets_for(model, batch)
    }
    return result


def cpu_flags() -> list[str]:
    """The CPU's bf16 matrix features (avx512_bf16, amx_bf16) from /proc/cpuinfo: what CPU
    bf16 autocast needs to be fast; [] elsewhere."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return []
    flags = set(cpuinfo.read_text().split())
    return sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile"})


def format_table(result: dict) -> str:
    """A plain-text table of images/s, peak RSS and ratios."""
    lines = [f"{'impl':<8} {'batch':>5} {'train img/s':>12} {'infer img/s':>12}"]
    names = list(result["train"])
    for batch in result["batch_sizes"]:
        for name in names:
            t = result["train"][name][str(batch)]
            i = result["infer"][name][str(batch)]
            lines.append(f"{name:<8} {batch:>5} {t:>12.1f} {i:>12.1f}")
    key = _memory_key(result["device"])
    what = "peak GPU memory" if key == "peak_gpu_mb" else "peak RSS"
    for name, rss in result.get(key, {}).items():
        lines.append(
            f"{what} train step, {name} (batch {result['rss_batch']}): {rss['peak_mb']:.0f} MiB"
        )
    for batch, values in result["ratios"].items():
        targets = result["targets"].get(batch, {})
        for key, value in values.items():
            goal = f"target {targets[key]}" if key in targets else "no target at this size"
            lines.append(f"batch {batch} {key}: {value:.2f} ({goal})")
    if not result["targets"]:
        lines.append(
            f"(the targets are for {TARGET_MODEL} at batch "
            f"{' and '.join(map(str, TARGET_BATCHES))}; none applies to this run)"
        )
    return "\n".join(lines)


def _int_list(ctx, param, value: str) -> list[int]:
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected integers like 32,128") from None
    if not numbers or min(numbers) < 1 or max(numbers) > MAX_COUNT:
        raise click.BadParameter(f"{value!r}: expected positive integers like 32,128")
    return numbers


def benchmarked_models() -> list[str]:
    """Registered models this benchmark can compare: dynamic-routing CapsNets, the only
    family with a naive reference and a conv ceiling."""
    from capsnet.models import names, spec
    from capsnet.models.capsnet import CapsNetConfig

    return [name for name in names() if issubclass(spec(name).config_cls, CapsNetConfig)]


def _model(ctx, param, value: str) -> str:
    """A registered model without a naive reference is a usage error (an unknown name is
    the registry's one-line error, as in every command)."""
    from capsnet.models import names

    known = benchmarked_models()
    if value in names() and value not in known:
        raise click.BadParameter(
            f"{value!r} has no naive reference to compare with; choose one of: " + ", ".join(known)
        )
    return value


def _implementations(ctx, param, value: str) -> list[str]:
    names = [name for name in value.split(",") if name]
    unknown = sorted(set(names) - set(IMPLEMENTATIONS))
    if unknown or not names:
        shown = ", ".join(unknown) or repr(value)
        raise click.BadParameter(f"{shown} unknown; choose from {', '.join(IMPLEMENTATIONS)}")
    return names


COMMAND = Command(
    "bench",
    "throughput_command",
    "Throughput of a capsule model against its naive reference and the conv ceiling.",
    torch_free_help=False,
)


@click.command("bench")
@click.option("--batch-sizes", default="32,128", show_default=True, callback=_int_list)
@click.option(
    "--rounds",
    type=count(),
    default=5,
    show_default=True,
    help="Medians over rounds.",
)
@click.option("--steps", type=count(), default=2, show_default=True, help="Steps per round.")
@click.option(
    "--impl",
    "implementations",
    default=",".join(IMPLEMENTATIONS),
    show_default=True,
    callback=_implementations,
)
@click.option(
    "--model",
    default="capsnet",
    show_default=True,
    callback=_model,
    help="Registered dynamic-routing capsule model.",
)
@click.option("--device", default="cpu", show_default=True)
@click.option(
    "--rss/--no-rss",
    default=True,
    show_default=True,
    help="Peak memory subprocesses (GPU memory on CUDA, RSS elsewhere).",
)
@click.option("--compile", is_flag=True, help="Compile capsnet (as training does) and conv.")
@click.option(
    "--amp",
    type=click.Choice(PRECISIONS),
    **train_default("amp"),
    help="Training precision, as in training (auto: bf16 on CUDA and native-bf16 CPUs).",
)
@click.option(
    "--cpu-bf16",
    is_flag=True,
    help=f"Also time capsnet under bf16 autocast on the CPU ({CPU_BF16_IMPL}), alternating "
    "with the fp32 one.",
)
@click.option("--quick", is_flag=True, help="Smoke run: capsnet-small, batch 2, one round.")
def throughput_command(
    batch_sizes, rounds, steps, implementations, model, device, rss, compile, amp, cpu_bf16, quick
) -> None:
    """Throughput of a capsule model against its naive reference and the conv ceiling.

    Prints a table, then the results as one JSON line."""
    if quick:
        batch_sizes, rounds, steps, model = [2], 1, 1, "capsnet-small"
    try:
        select_device(device)
        result = run(
            batch_sizes, rounds, steps, implementations, model, device, rss, compile, amp, cpu_bf16
        )
    except CapsnetError as exc:  # e.g. an unknown --model: one line, also when run as a file
        raise click.ClickException(str(exc)) from None
    click.echo(format_table(result))
    click.echo(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    if not __package__:  # run as a file: make benchmarks.* importable from the checkout
        sys.path.insert(0, str(ROOT))
    throughput_command()
