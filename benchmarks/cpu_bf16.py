"""CPU bf16 against fp32: training-step and inference speed of the default run's models.

Each model is built twice with the same weights; its fp32 and bf16-autocast training steps
(forward, the model's loss, backward, Adam: ``capsnet.training.fit.train_step``) alternate
in every round, so load on the machine hits both alike, and the table gives the median
ratio of the paired rounds. ``--compile`` compiles what the default run compiles (the EM
routing). What ``amp: auto`` picks on this machine is printed first
(``capsnet.training.device.effective_precision``).

    python benchmarks/cpu_bf16.py [--models capsnet-small,lenet5] [--rounds 7]
"""

from __future__ import annotations

import copy
import json
import platform
import statistics
import time

import click
import torch

from capsnet import models
from capsnet.config.training import TrainConfig
from capsnet.training.device import (
    NATIVE_BF16_FLAGS,
    _cpu_flags,
    autocast,
    effective_precision,
)
from capsnet.training.fit import train_step

#: The default run's models: (batch size, input shape, classes, compiled) as its stages
#: train them (params.yaml: the smallNORB sections compile, train does not).
DEFAULT_MODELS = {
    "capsnet-small": (128, (1, 28, 28), 10, False),
    "lenet5": (128, (1, 28, 28), 10, False),
    "em-capsnet-small": (32, (2, 32, 32), 5, True),
    "smallnorb-cnn": (32, (2, 32, 32), 5, True),
}


def _setup(name: str, compile_routing: bool):
    batch, shape, classes, compiled = DEFAULT_MODELS[name]
    torch.manual_seed(0)
    model = models.build(name, shape)
    if compile_routing and compiled and hasattr(model, "compile_routing"):
        model.compile_routing()
    images = torch.rand(batch, *shape)  # (B, C, H, W)
    targets = torch.randint(0, classes, (batch,))  # (B,)
    return model, (images, targets)


def _step_timer(model, batch, amp: str):
    config = TrainConfig(amp=amp, progress=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def train() -> float:
        model.train()
        started = time.perf_counter()
        train_step(model, batch, optimizer, scheduler, config)
        return time.perf_counter() - started

    def infer() -> float:
        model.eval()
        started = time.perf_counter()
        with torch.no_grad(), autocast(torch.device("cpu"), amp):
            model(batch[0]).scores.float().sum().item()
        return time.perf_counter() - started

    return train, infer


def measure(name: str, rounds: int, compile_routing: bool) -> dict:
    """Median seconds per step of ``name`` in fp32 and bf16 and the median paired ratio."""
    model, batch = _setup(name, compile_routing)
    twin = copy.deepcopy(model)
    fp32_train, fp32_infer = _step_timer(model, batch, "fp32")
    bf16_train, bf16_infer = _step_timer(twin, batch, "bf16")
    for warm in (fp32_train, bf16_train, fp32_infer, bf16_infer):
        warm(), warm()  # allocations, kernel choice, compilation
    times: dict[str, list[float]] = {k: [] for k in ("fp32", "bf16", "fp32_i", "bf16_i")}
    for _ in range(rounds):
        times["fp32"].append(fp32_train())
        times["bf16"].append(bf16_train())
        times["fp32_i"].append(fp32_infer())
        times["bf16_i"].append(bf16_infer())
    return {
        "model": name,
        "batch": batch[0].shape[0],
        "train_ms": {p: 1000 * statistics.median(times[p]) for p in ("fp32", "bf16")},
        "train_speedup": statistics.median(
            a / b for a, b in zip(times["fp32"], times["bf16"], strict=True)
        ),
        "infer_speedup": statistics.median(
            a / b for a, b in zip(times["fp32_i"], times["bf16_i"], strict=True)
        ),
    }


@click.command()
@click.option("--models", "names", default=",".join(DEFAULT_MODELS), show_default=True)
@click.option("--rounds", default=7, show_default=True, type=click.IntRange(1, 1000))
@click.option("--compile/--no-compile", "compile_routing", default=True, show_default=True)
def main(names: str, rounds: int, compile_routing: bool) -> None:
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in DEFAULT_MODELS]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: choose from {', '.join(DEFAULT_MODELS)}")
    flags = sorted(set(NATIVE_BF16_FLAGS) & _cpu_flags())
    auto = effective_precision(torch.device("cpu"), "auto")
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"ATen {torch.backends.cpu.get_cpu_capability()}, bf16 flags {flags or 'none'}: "
          f"amp auto -> {auto}")  # fmt: skip
    print("| model | batch | fp32 step | bf16 step | train speedup | inference speedup |")
    print("|---|---|---|---|---|---|")
    results = []
    for name in chosen:
        r = measure(name, rounds, compile_routing)
        results.append(r)
        print(f"| {name} | {r['batch']} | {r['train_ms']['fp32']:.1f} ms | "
              f"{r['train_ms']['bf16']:.1f} ms | {r['train_speedup']:.2f}x | "
              f"{r['infer_speedup']:.2f}x |")  # fmt: skip
    print(json.dumps({"auto": auto, "flags": flags, "results": results}))


if __name__ == "__main__":
    main()
