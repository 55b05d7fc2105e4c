"""The prepared GPU check: what issue 16's targets need measured, in one command.

    python benchmarks/gpu_check.py --mnist DIR --json gpu-check.json

DIR holds the four raw MNIST IDX .gz files (as in the datasets mirror). Measured on one
device, with the defaults sized to about 8 minutes on one H100:
  1. full CapsNet training through ``fit`` (batch 128, 3 routing iterations, shift 2): s per
     55,000-image epoch and images/s in bf16 and in fp32 (the second epoch: the first one
     compiles), and peak GPU memory;
  2. the naive reference (benchmarks/naive_capsnet.py, same weights and precision) in a
     bare training-step loop on one fixed batch (no data work: it flatters the reference);
  3. em-capsnet (A=B=C=D=32, 3 EM iterations) s per epoch of 24,300 random uint8
     smallNORB-format stereo 32x32 images, batch 64;
  4. four training processes started together on the device: their aggregate images/s;
  5. a short real run: full CapsNet with shift on the 60,000 MNIST training images for a
     wall-clock budget, then the 10,000-image test accuracy.
It prints a markdown block for BENCHMARKS.md (device, torch, commit, date) and writes the
numbers as JSON. Needs only torch, click and this project (docs/gpu.md).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import click
import torch

ROOT = Path(__file__).resolve().parents[1]
#: Modules the check must not import (the GPU machine has none of them).
FORBIDDEN = ("albumentations", "cv2", "ray", "dvc", "wandb")
TARGETS = {
    "capsnet_seconds_per_epoch": 1.0,
    "capsnet_vs_naive": 5.0,
    "em_seconds_per_epoch": 30.0,
    "test_accuracy": 0.996,
}
EPOCH_IMAGES = 55_000  # the MNIST training epoch of the targets
SMALLNORB_IMAGES = 24_300


def _dataset(images: torch.Tensor, labels: torch.Tensor, name: str):
    from capsnet.data.datasets import TensorImageDataset

    return TensorImageDataset(images, labels, name, int(labels.max()) + 1)


def timed_fit(model_name: str, data, config, **overrides) -> dict:
    """Train ``model_name`` for ``config.epochs`` epochs through ``fit``; the numbers of the
    last epoch (the first compiles and tunes) and the peak GPU memory of the run."""
    from capsnet import models
    from capsnet.train import fit, select_device

    device = select_device(config.device)
    torch.manual_seed(config.seed)
    model = models.build(model_name, **overrides)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    history = fit(model, data, None, config)
    last = history[-1]
    return {
        "model": model_name,
        "parameters": models.count_parameters(model),
        "amp": config.amp,
        "compile": config.compile,
        "images": len(data),
        "seconds_per_epoch": last["seconds"],
        "images_per_second": last["images_per_second"],
        "peak_gpu_mb": _peak_gpu_mb(device),
        "train_loss": last["train_loss"],
    }


def _peak_gpu_mb(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def naive_rate(model_name: str, batch: int, steps: int, device: str, amp: str) -> dict:
    """Images/s of the naive reference's training step (forward, margin + reconstruction
    loss, backward, Adam) on one fixed batch, under the same precision policy."""
    from benchmarks.throughput import build_impl, make_steps
    from capsnet.train import configure_backends, select_device

    dev = select_device(device)
    configure_backends(dev)
    module = build_impl("naive", model_name)
    train_step, _ = make_steps(module, batch, module.config, dev, amp)
    train_step()  # warm-up
    _sync(dev)
    started = time.perf_counter()
    for _ in range(steps):
        train_step()
    _sync(dev)
    seconds = time.perf_counter() - started
    return {
        "amp": amp,
        "batch": batch,
        "steps": steps,
        "images_per_second": batch * steps / seconds,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def smallnorb_like(images: int, size: int, seed: int = 0):
    """Random uint8 stereo images (N, 2, size, size) with labels 0..4: the official shape
    after the EM paper's crop, for timing only."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (images, 2, size, size), dtype=torch.uint8, generator=generator)
    return _dataset(pixels, torch.arange(images) % 5, "smallnorb-random")


def _train_config(settings: dict, **changes):
    from capsnet.config import AugmentParams, ShiftAugment
    from capsnet.config.training import TrainConfig

    values = {
        "epochs": 2,
        "batch_size": settings["batch_size"],
        "device": settings["device"],
        "compile": settings["compile"],
        "augment": "shift",
        "augment_params": AugmentParams(shift=ShiftAugment(pixels=2)),
        "progress": False,
    }
    return TrainConfig(**{**values, **changes})


def shared_worker(settings_json: str) -> None:
    """One of the processes sharing the device: a timed fit; prints its result as JSON with
    the wall-clock start and end of its timed (last) epoch."""
    settings = json.loads(settings_json)
    images, labels = _mnist(settings["mnist"], "train", settings["epoch_images"])
    config = _train_config(settings, amp="bf16")
    result = timed_fit(settings["model"], _dataset(images, labels, "mnist"), config)
    result["end"] = time.time()
    result["start"] = result["end"] - result["seconds_per_epoch"]
    print(json.dumps(result))


def shared_run(settings: dict, processes: int) -> dict:
    """``processes`` training processes started together; aggregate images/s over the span
    from the first timed epoch's start to the last one's end."""
    code = "import sys; from benchmarks.gpu_check import shared_worker; shared_worker(sys.argv[1])"
    running = [
        subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(settings)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**_environ(), "PYTHONPATH": str(ROOT)},
        )
        for _ in range(processes)
    ]
    results = []
    for proc in running:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise click.ClickException(f"a shared training process failed: {err.strip()[-500:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "processes": processes,
        "images_per_second_each": [r["images_per_second"] for r in results],
        "aggregate_images_per_second": sum(r["images"] for r in results) / span,
        "peak_gpu_mb_each": [r["peak_gpu_mb"] for r in results],
    }


def _environ() -> dict:
    import os

    return dict(os.environ)


def _mnist(directory: str, split: str, limit: int | None = None):
    from capsnet.data.mnist import read_split

    images, labels = read_split(directory, split)
    return images[:limit], labels[:limit]


def real_run(settings: dict, seconds: float, max_epochs: int, test_limit: int | None) -> dict:
    """Full CapsNet with shift on the MNIST training set for ``seconds`` of training (at
    most ``max_epochs``), then the test accuracy on the device."""
    from capsnet import evaluate, models
    from capsnet.train import fit

    images, labels = _mnist(settings["mnist"], "train", settings["real_images"])
    test_images, test_labels = _mnist(settings["mnist"], "test", test_limit)
    config = _train_config(settings, epochs=max_epochs, time_budget=seconds, amp="bf16")
    torch.manual_seed(0)
    model = models.build(settings["model"])
    history = fit(model, _dataset(images, labels, "mnist-train"), None, config)
    test = _dataset(test_images, test_labels, "mnist-test")
    scored = evaluate.accuracy(model, test, 1000, amp="bf16")
    return {
        "epochs": len(history),
        "train_seconds": sum(r["seconds"] for r in history),
        "train_images": len(images),
        "test_accuracy": scored["accuracy"],
        "test_images": scored["n"],
    }


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({platform.processor() or platform.machine()})"


def markdown(result: dict) -> str:
    """The block to paste into BENCHMARKS.md."""
    caps, fp32, naive = result["capsnet_bf16"], result["capsnet_fp32"], result["naive_bf16"]
    em, shared, real = result["em"], result["shared"], result["real_run"]
    per_epoch = EPOCH_IMAGES / caps["images_per_second"]
    memory = caps["peak_gpu_mb"]
    lines = [
        f"{result['date']}, {result['device_name']}, torch {result['torch']}, "
        f"commit {result['commit']}: `python benchmarks/gpu_check.py {result['command']}`",
        "",
        "| measurement | result | target |",
        "|---|---|---|",
        f"| {caps['model']} training, bf16, batch {result['batch_size']}, s per 55,000-image "
        f"epoch | {per_epoch:.2f} s ({caps['images_per_second']:,.0f} img/s) | <= 1.0 s |",
        f"| {fp32['model']} training, fp32 | {EPOCH_IMAGES / fp32['images_per_second']:.2f} s "
        f"({fp32['images_per_second']:,.0f} img/s) | |",
        f"| naive reference, bf16 training step | {naive['images_per_second']:,.0f} img/s | |",
        f"| bf16 training vs the naive reference | {result['ratios']['capsnet_vs_naive']:.1f}x "
        f"| >= 5x |",
        f"| peak GPU memory, {caps['model']} bf16 training | "
        + (f"{memory:,.0f} MiB" if memory is not None else "n/a (not CUDA)")
        + " | |",
        f"| {em['model']} ({em['parameters']:,} parameters), s per 24,300-image epoch, "
        f"batch {em['batch_size']} | "
        f"{result['ratios']['em_seconds_per_epoch']:.1f} s | <= 30 s |",
        f"| {shared['processes']} training processes sharing the device | "
        f"{shared['aggregate_images_per_second']:,.0f} img/s aggregate | |",
        f"| short real run: {real['epochs']} epochs with shift, {real['train_seconds']:.0f} s "
        f"| {100 * real['test_accuracy']:.2f}% MNIST test ({real['test_images']:,} images) "
        f"| >= 99.6% in <= 5 min |",
    ]
    return "\n".join(lines)


@click.command()
@click.option(
    "--mnist",
    "mnist_dir",
    type=click.Path(exists=True, file_okay=False),
    required=True,
    help="Folder holding the four raw MNIST IDX .gz files.",
)
@click.option("--device", default="auto", show_default=True, help="auto, cuda, cuda:N, cpu.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default="gpu-check.json",
              show_default=True, help="Where to write the numbers.")  # fmt: skip
@click.option("--model", default="capsnet", show_default=True, help="The dynamic-routing model.")
@click.option("--em-model", default="em-capsnet", show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=128, show_default=True)
@click.option("--epoch-images", type=click.IntRange(1), default=EPOCH_IMAGES, show_default=True)
@click.option("--naive-steps", type=click.IntRange(1), default=20, show_default=True)
@click.option("--em-images", type=click.IntRange(1), default=SMALLNORB_IMAGES, show_default=True)
@click.option("--em-batch-size", type=click.IntRange(1), default=64, show_default=True)
@click.option("--em-size", type=click.IntRange(8), default=32, show_default=True)
@click.option("--shared-processes", type=click.IntRange(1), default=4, show_default=True)
@click.option("--shared-images", type=click.IntRange(1), default=20_000, show_default=True)
@click.option("--real-images", type=click.IntRange(1), default=60_000, show_default=True)
@click.option("--real-seconds", type=click.FloatRange(min=0, min_open=True), default=150.0,
              show_default=True, help="Training budget of the real run (wall clock).")  # fmt: skip
@click.option("--real-epochs", type=click.IntRange(1), default=200, show_default=True)
@click.option("--test-limit", type=click.IntRange(1), default=None, help="Default: all 10,000.")
@click.option("--compile/--no-compile", default=True, show_default=True,
              help="torch.compile the models (TrainConfig.compile).")  # fmt: skip
def main(**options) -> None:
    """Time full CapsNet and em-capsnet training on one device, against the naive
    reference; share the device among processes; a short real MNIST run."""
    from capsnet.errors import CapsnetError

    try:
        result = run_check(options)
    except CapsnetError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(markdown(result))
    Path(options["json_path"]).write_text(json.dumps(result, indent=1, sort_keys=True))
    click.echo(f"wrote {options['json_path']}", err=True)


def run_check(options: dict) -> dict:
    """Every measurement of the check; the dict written as JSON."""
    from capsnet.train import select_device

    device = select_device(options["device"])
    settings = {
        "mnist": options["mnist_dir"],
        "model": options["model"],
        "batch_size": options["batch_size"],
        "device": str(device),
        "compile": options["compile"],
        "epoch_images": options["shared_images"],
        "real_images": options["real_images"],
    }
    images, labels = _mnist(options["mnist_dir"], "train", options["epoch_images"])
    mnist = _dataset(images, labels, "mnist-train")
    result: dict = {"batch_size": options["batch_size"]}
    say = lambda text: click.echo(text, err=True)  # noqa: E731
    for amp in ("bf16", "fp32"):
        say(f"{options['model']} training, {amp} ...")
        config = _train_config(settings, amp=amp)
        result[f"capsnet_{amp}"] = timed_fit(options["model"], mnist, config)
    say("naive reference ...")
    result["naive_bf16"] = naive_rate(
        options["model"], options["batch_size"], options["naive_steps"], str(device), "bf16"
    )
    say(f"{options['em_model']} training ...")
    norb = smallnorb_like(options["em_images"], options["em_size"])
    em_config = _train_config(
        settings, batch_size=options["em_batch_size"], augment="none", amp="bf16"
    )
    shape = {"in_channels": 2, "input_size": options["em_size"], "num_classes": 5}
    em = timed_fit(options["em_model"], norb, em_config, **shape)
    em["batch_size"] = options["em_batch_size"]
    result["em"] = em
    say(f"{options['shared_processes']} processes sharing the device ...")
    result["shared"] = shared_run(settings, options["shared_processes"])
    say("real run ...")
    result["real_run"] = real_run(
        settings, options["real_seconds"], options["real_epochs"], options["test_limit"]
    )
    result["ratios"] = {
        "capsnet_seconds_per_epoch": EPOCH_IMAGES / result["capsnet_bf16"]["images_per_second"],
        "capsnet_vs_naive": result["capsnet_bf16"]["images_per_second"]
        / result["naive_bf16"]["images_per_second"],
        "em_seconds_per_epoch": SMALLNORB_IMAGES / em["images_per_second"],
        "test_accuracy": result["real_run"]["test_accuracy"],
    }
    result["targets"] = TARGETS
    result |= {
        "device": str(device),
        "device_name": _device_name(device),
        "torch": torch.__version__,
        "commit": _commit(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(sys.argv[1:]),
        "forbidden_imports": sorted(name for name in FORBIDDEN if name in sys.modules),
    }
    return result


if __name__ == "__main__":
    if not __package__:  # run as a file: make benchmarks.* and capsnet importable
        sys.path.insert(0, str(ROOT))
    main()
