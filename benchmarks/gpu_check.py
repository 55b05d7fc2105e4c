"""The prepared GPU check: what issue 16's targets need measured, in one command.

    python benchmarks/gpu_check.py --mnist DIR --json gpu-check.json [--budget-s 300]

DIR holds the four raw MNIST IDX .gz files (as in the datasets mirror). ``--budget-s``
sizes the run: 40% is the real run's training time, the rest the timed windows (each at
least ``MIN_WINDOW`` seconds), plus compilation and start-ups. Sections, most important
first; the JSON is rewritten (atomically) after each, so a run cut short keeps what it
measured:
  1. full CapsNet training through ``fit`` (batch 128, 3 routing iterations, shift 2),
     compiled (``--compile``), bf16: s per 55,000-image epoch, images/s, peak GPU memory;
  2. the naive reference (benchmarks/naive_capsnet.py, eager, same precision) in a bare
     training-step loop on one fixed batch (no data work: it flatters the reference);
  3. the same CapsNet eager: the eager-against-eager ratio (the algorithm alone) beside
     compiled-against-naive (the algorithm and compilation);
  4. em-capsnet (A=B=C=D=32, 3 EM iterations) s per epoch of 24,300 random uint8
     smallNORB-format stereo 32x32 images, batch 64;
  5. a short real run: full CapsNet with shift on the 60,000 MNIST training images for a
     training-time budget, then the 10,000-image test accuracy;
  6. four training processes sharing the device: each compiles and warms up, then all
     wait on a barrier and run training steps in one common window; aggregate images/s;
  7. the CapsNet in fp32.
Every row names the precision it really ran (bf16 autocast exists on CUDA only: a CPU run
is fp32) and whether it met its target. Needs only torch, click and this project
(docs/guides/gpu.md).
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import threading
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
    "real_run_seconds": 300.0,
}
#: The models and precision the targets were set for.
TARGET_MODEL, TARGET_EM_MODEL, TARGET_PRECISION = "capsnet", "em-capsnet", "bf16"
EPOCH_IMAGES = 55_000  # the MNIST training epoch of the targets
SMALLNORB_IMAGES = 24_300
MIN_WINDOW = 2.0  # seconds: no timed window is shorter
REAL_SHARE = 0.4  # of --budget-s: the real run's training time
TIMED_SECTIONS = 15  # windows the rest of the budget is split into (each costs ~1.5 windows)


def window_seconds(budget: float, floor: float = MIN_WINDOW) -> float:
    """The length of each timed window for a total budget of ``budget`` seconds."""
    return max(floor, (1 - REAL_SHARE) * budget / TIMED_SECTIONS)


def _dataset(images: torch.Tensor, labels: torch.Tensor, name: str):
    from capsnet.data.datasets import TensorImageDataset

    return TensorImageDataset(images, labels, name, int(labels.max()) + 1)


def _precision(device: torch.device, amp: str) -> str:
    from capsnet.training.device import effective_precision

    return effective_precision(device, amp)


def timed_fit(model_name: str, data, config, window: float, **overrides) -> dict:
    """Train ``model_name`` through ``fit`` for a timed window of at least ``window``
    seconds: a two-epoch calibration on a few batches (it compiles) sizes the run, whose
    first epoch warms up and whose other epochs are timed; peak GPU memory of the run."""
    import dataclasses

    from capsnet import models
    from capsnet.training.device import select_device
    from capsnet.training.fit import fit

    device = select_device(config.device)
    torch.manual_seed(config.seed)
    model = models.build(model_name, **overrides)
    few = data.subset(4 * config.batch_size)
    calibration = fit(model, few, None, dataclasses.replace(config, epochs=2))
    rate = calibration[-1]["images_per_second"]
    images = max(1, min(len(data), math.ceil(rate * window / 2)))
    epochs = max(2, math.ceil(rate * window / images))
    used = data.subset(images)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timed = fit(model, used, None, dataclasses.replace(config, epochs=1 + epochs))[1:]
    seconds = sum(r["seconds"] for r in timed)
    seen = sum(r["seconds"] * r["images_per_second"] for r in timed)
    return {
        "model": model_name,
        "parameters": models.count_parameters(model),
        "amp": config.amp,
        "precision": _precision(device, config.amp),
        "compile": config.compile,
        "batch_size": config.batch_size,
        "images": len(used),
        "timed_epochs": len(timed),
        "timed_seconds": seconds,
        "images_per_second": seen / seconds,
        "peak_gpu_mb": _peak_gpu_mb(device),
        "train_loss": timed[-1]["train_loss"],
    }


def _peak_gpu_mb(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def _steps(model_name: str, impl: str, batch: int, device: torch.device, amp: str, compile: bool):
    """A training step closure (forward, margin + reconstruction loss, backward, Adam) of
    ``impl`` (capsnet or naive) on one fixed batch, warmed up."""
    from benchmarks.throughput import _maybe_compile, build_impl, make_steps
    from capsnet.training.device import configure_backends

    configure_backends(device)
    module = _maybe_compile(build_impl(impl, model_name).to(device), compile)
    train_step, _ = make_steps(module, batch, module.config, device, amp)
    for _ in range(3):  # allocator, kernels, compilation
        train_step()
    _sync(device)
    return train_step


def step_rate(train_step, batch: int, device: torch.device, until: float) -> tuple[int, float]:
    """(steps run, seconds) of ``train_step`` from now until the clock (``time.time``)
    passes ``until``, synchronised at the end."""
    started, steps = time.time(), 0
    while time.time() < until:
        train_step()
        steps += 1
        if device.type == "cuda" and steps % 8 == 0:
            torch.cuda.synchronize(device)  # keep the clock close to the device
    _sync(device)
    return steps, time.time() - started


def naive_rate(model_name: str, batch: int, window: float, device: str, amp: str) -> dict:
    """Images/s of the naive reference's training step on one fixed batch (eager, under
    the same precision policy) over a window of ``window`` seconds."""
    from capsnet.training.device import select_device

    dev = select_device(device)
    train_step = _steps(model_name, "naive", batch, dev, amp, compile=False)
    steps, seconds = step_rate(train_step, batch, dev, time.time() + window)
    return {
        "amp": amp,
        "precision": _precision(dev, amp),
        "batch": batch,
        "steps": steps,
        "timed_seconds": seconds,
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
    """One of the processes sharing the device: compile and warm up its training step,
    print "ready", read the common window "start end" (``time.time``) from stdin, run steps
    from start until end; print its result as JSON."""
    from capsnet.training.device import select_device

    settings = json.loads(settings_json)
    device = select_device(settings["device"])
    batch = settings["batch_size"]
    train_step = _steps(settings["model"], "capsnet", batch, device, "bf16", settings["compile"])
    print("ready", flush=True)
    start, end = (float(v) for v in sys.stdin.readline().split())
    time.sleep(max(0.0, start - time.time()))
    began = time.time()
    steps, seconds = step_rate(train_step, batch, device, end)
    print(json.dumps({
        "images": batch * steps, "start": began, "end": began + seconds,
        "images_per_second": batch * steps / seconds, "peak_gpu_mb": _peak_gpu_mb(device),
    }), flush=True)  # fmt: skip


def shared_run(settings: dict, processes: int, window: float) -> dict:
    """``processes`` training processes on the device: each warms up, then all start on a
    barrier and run for one common window; aggregate images/s over that window. Their
    pipes are drained concurrently (a thread each), so no process blocks on a full pipe."""
    code = "import sys; from benchmarks.gpu_check import shared_worker; shared_worker(sys.argv[1])"
    running = [
        subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(settings)], cwd=ROOT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for _ in range(processes)
    ]  # fmt: skip
    outputs = [_Drain(proc) for proc in running]
    try:
        for out in outputs:
            out.wait_for("ready")
        start = time.time() + 0.5
        for proc in running:
            proc.stdin.write(f"{start} {start + window}\n")
            proc.stdin.flush()
        for proc in running:
            proc.wait()
    finally:
        for proc in running:
            if proc.poll() is None:
                proc.kill()
    results = [out.result() for out in outputs]
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "processes": processes,
        "window_seconds": window,
        "span_seconds": span,
        "precision": _precision(torch.device(settings["device"]), "bf16"),
        "images_per_second_each": [r["images_per_second"] for r in results],
        "aggregate_images_per_second": sum(r["images"] for r in results) / span,
        "peak_gpu_mb_each": [r["peak_gpu_mb"] for r in results],
    }


class _Drain:
    """Reads a worker's stdout and stderr in threads of their own, as they arrive."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines, self.err = proc, [], []
        self.changed = threading.Condition()
        self.threads = [
            threading.Thread(target=self._read, args=(proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(proc.stderr, self.err), daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _read(self, stream, into: list[str]) -> None:
        for line in stream:
            with self.changed:
                into.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            into.append(None)  # end of stream
            self.changed.notify_all()

    def wait_for(self, text: str) -> None:
        with self.changed:
            while text not in self.lines:
                if None in self.lines:
                    raise self._failed()
                self.changed.wait()

    def result(self) -> dict:
        for thread in self.threads:
            thread.join()
        if self.proc.returncode != 0:
            raise self._failed()
        return json.loads([line for line in self.lines if line][-1])

    def _failed(self) -> click.ClickException:
        self.proc.wait()
        err = "\n".join(line for line in self.err if line)
        return click.ClickException(f"a shared training process failed: {err.strip()[-500:]}")


def _mnist(directory: str, split: str, limit: int | None = None):
    from capsnet.data.mnist import read_split

    images, labels = read_split(directory, split)
    return images[:limit], labels[:limit]


def real_run(settings: dict, seconds: float, max_epochs: int, test_limit: int | None) -> dict:
    """Full CapsNet with shift on the MNIST training set for ``seconds`` of training (at
    most ``max_epochs``), then the test accuracy on the device."""
    from capsnet import models
    from capsnet.training import scoring as evaluate
    from capsnet.training.device import select_device
    from capsnet.training.fit import fit

    images, labels = _mnist(settings["mnist"], "train", settings["real_images"])
    test_images, test_labels = _mnist(settings["mnist"], "test", test_limit)
    config = _train_config(settings, epochs=max_epochs, time_budget=seconds, amp="bf16")
    torch.manual_seed(0)
    model = models.build(settings["model"])
    history = fit(model, _dataset(images, labels, "mnist-train"), None, config)
    test = _dataset(test_images, test_labels, "mnist-test")
    scored = evaluate.accuracy(model, test, 1000, amp="bf16")
    return {
        "precision": _precision(select_device(settings["device"]), "bf16"),
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


def ratios(result: dict) -> dict:
    """The figures the targets are stated in, from the sections measured so far."""
    out = {}
    caps, eager, naive = (result.get(k) for k in ("capsnet_bf16", "capsnet_eager", "naive"))
    if caps:
        out["capsnet_seconds_per_epoch"] = EPOCH_IMAGES / caps["images_per_second"]
    if caps and naive:
        out["capsnet_vs_naive"] = caps["images_per_second"] / naive["images_per_second"]
    if eager and naive:
        out["eager_vs_naive"] = eager["images_per_second"] / naive["images_per_second"]
    if result.get("em"):
        out["em_seconds_per_epoch"] = SMALLNORB_IMAGES / result["em"]["images_per_second"]
    if result.get("real_run"):
        out["test_accuracy"] = result["real_run"]["test_accuracy"]
    return out


def met(result: dict) -> dict[str, str]:
    """Per target: "yes", "no", or "n/a: why" when the run measured another model or
    precision than the target's."""
    r, out = result["ratios"], {}

    def verdict(key: str, ok: bool, model: str, want: str, precision: str) -> None:
        if model != want or precision != TARGET_PRECISION:
            out[key] = f"n/a: {model} in {precision}, the target is {want} in {TARGET_PRECISION}"
        else:
            out[key] = "yes" if ok else "no"

    caps = result.get("capsnet_bf16")
    if caps:
        seconds = r["capsnet_seconds_per_epoch"]
        verdict("capsnet_seconds_per_epoch", seconds <= TARGETS["capsnet_seconds_per_epoch"],
                caps["model"], TARGET_MODEL, caps["precision"])  # fmt: skip
        if "capsnet_vs_naive" in r:
            verdict("capsnet_vs_naive", r["capsnet_vs_naive"] >= TARGETS["capsnet_vs_naive"],
                    caps["model"], TARGET_MODEL, caps["precision"])  # fmt: skip
    if result.get("em"):
        em = result["em"]
        ok = r["em_seconds_per_epoch"] <= TARGETS["em_seconds_per_epoch"]
        verdict("em_seconds_per_epoch", ok, em["model"], TARGET_EM_MODEL, em["precision"])
    if result.get("real_run"):
        real = result["real_run"]
        ok = (real["test_accuracy"] >= TARGETS["test_accuracy"]
              and real["train_seconds"] <= TARGETS["real_run_seconds"])  # fmt: skip
        verdict("test_accuracy", ok, result["model"], TARGET_MODEL, real["precision"])
    return out


def markdown(result: dict) -> str:
    """The block to paste into BENCHMARKS.md (the sections measured so far)."""
    r, done = result["ratios"], result["met"]
    lines = [
        f"{result['date']}, {result['device_name']}, torch {result['torch']}, "
        f"commit {result['commit']}: `python benchmarks/gpu_check.py {result['command']}` "
        f"(timed windows of {result['window_seconds']:.1f} s)",
        "",
        "| measurement | result | target | met |",
        "|---|---|---|---|",
    ]

    def row(what: str, value: str, target: str = "", key: str | None = None) -> None:
        lines.append(f"| {what} | {value} | {target} | {done.get(key, '') if key else ''} |")

    def epoch_row(run: dict, label: str, target: str = "", key: str | None = None) -> None:
        compiled = "compiled" if run["compile"] else "eager"
        row(f"{run['model']} training, {run['precision']}, {compiled}, batch "
            f"{run['batch_size']}, s per 55,000-image epoch{label}",
            f"{EPOCH_IMAGES / run['images_per_second']:.2f} s "
            f"({run['images_per_second']:,.0f} img/s)", target, key)  # fmt: skip

    if caps := result.get("capsnet_bf16"):
        epoch_row(caps, "", "<= 1.0 s", "capsnet_seconds_per_epoch")
        memory = caps["peak_gpu_mb"]
        row(f"peak GPU memory, {caps['model']} training",
            f"{memory:,.0f} MiB" if memory is not None else "n/a (not CUDA)")  # fmt: skip
    if naive := result.get("naive"):
        row(f"naive reference, {naive['precision']}, eager training step",
            f"{naive['images_per_second']:,.0f} img/s")  # fmt: skip
    if "capsnet_vs_naive" in r:
        row("compiled training vs the naive reference (algorithm + compile)",
            f"{r['capsnet_vs_naive']:.1f}x", ">= 5x", "capsnet_vs_naive")  # fmt: skip
    if eager := result.get("capsnet_eager"):
        epoch_row(eager, "")
    if "eager_vs_naive" in r:
        ratio = f"{r['eager_vs_naive']:.1f}x"
        row("eager training vs the naive reference (algorithm alone)", ratio)
    if em := result.get("em"):
        row(f"{em['model']} ({em['parameters']:,} parameters), {em['precision']}, s per "
            f"24,300-image epoch, batch {em['batch_size']}",
            f"{r['em_seconds_per_epoch']:.1f} s", "<= 30 s", "em_seconds_per_epoch")  # fmt: skip
    if real := result.get("real_run"):
        row(f"short real run, {real['precision']}: {real['epochs']} epochs with shift, "
            f"{real['train_seconds']:.0f} s",
            f"{100 * real['test_accuracy']:.2f}% MNIST test ({real['test_images']:,} images)",
            ">= 99.6% in <= 5 min", "test_accuracy")  # fmt: skip
    if shared := result.get("shared"):
        row(f"{shared['processes']} training processes sharing the device, {shared['precision']}, "
            f"one common {shared['window_seconds']:.1f} s window",
            f"{shared['aggregate_images_per_second']:,.0f} img/s aggregate")  # fmt: skip
    if fp32 := result.get("capsnet_fp32"):
        epoch_row(fp32, "")
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
              show_default=True, help="Where the numbers go (after every section).")  # fmt: skip
@click.option("--budget-s", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="Seconds the sections are sized to (compilation and "
              "start-ups come on top).")  # fmt: skip
@click.option("--model", default="capsnet", show_default=True, help="The dynamic-routing model.")
@click.option("--em-model", default="em-capsnet", show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=128, show_default=True)
@click.option("--epoch-images", type=click.IntRange(1), default=EPOCH_IMAGES, show_default=True,
              help="MNIST training images the timed fits may use.")  # fmt: skip
@click.option("--em-images", type=click.IntRange(1), default=SMALLNORB_IMAGES, show_default=True)
@click.option("--em-batch-size", type=click.IntRange(1), default=64, show_default=True)
@click.option("--em-size", type=click.IntRange(8), default=32, show_default=True)
@click.option("--shared-processes", type=click.IntRange(1), default=4, show_default=True)
@click.option("--real-images", type=click.IntRange(1), default=60_000, show_default=True)
@click.option(
    "--real-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help=f"The real run's training (default: {REAL_SHARE:.0%} of --budget-s).",
)
@click.option(
    "--min-window-s",
    type=click.FloatRange(min=0, min_open=True),
    default=MIN_WINDOW,
    show_default=True,
    help="The shortest timed window (lower: smoke tests only).",
)
@click.option("--real-epochs", type=click.IntRange(1), default=200, show_default=True)
@click.option("--test-limit", type=click.IntRange(1), default=None, help="Default: all 10,000.")
@click.option("--compile/--no-compile", default=True, show_default=True,
              help="torch.compile the models (TrainConfig.compile).")  # fmt: skip
def main(**options) -> None:
    """Time full CapsNet and em-capsnet training on one device, against the naive
    reference; share the device among processes; a short real MNIST run."""
    from capsnet.io.errors import CapsnetError

    try:
        result = run_check(options, lambda r: _write(options["json_path"], r))
    except CapsnetError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(markdown(result))
    click.echo(f"wrote {options['json_path']}", err=True)


def _write(path: str, result: dict) -> None:
    from capsnet.io.files import atomic_write_json

    atomic_write_json(path, result)


def run_check(options: dict, save=lambda result: None) -> dict:
    """Every section of the check in order; after each, ``save(result)`` with the ratios,
    verdicts and provenance of what was measured so far. Returns the final dict."""
    from capsnet.training.device import select_device

    device = select_device(options["device"])
    budget = options["budget_s"]
    window = window_seconds(budget, options.get("min_window_s", MIN_WINDOW))
    real_seconds = options["real_seconds"] or REAL_SHARE * budget
    settings = {
        "mnist": options["mnist_dir"],
        "model": options["model"],
        "batch_size": options["batch_size"],
        "device": str(device),
        "compile": options["compile"],
        "real_images": options["real_images"],
    }
    images, labels = _mnist(options["mnist_dir"], "train", options["epoch_images"])
    mnist = _dataset(images, labels, "mnist-train")
    result: dict = {
        "model": options["model"],
        "batch_size": options["batch_size"],
        "budget_seconds": budget,
        "window_seconds": window,
        "targets": TARGETS,
        "device": str(device),
        "device_name": _device_name(device),
        "torch": torch.__version__,
        "commit": _commit(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(sys.argv[1:]),
    }
    say = lambda text: click.echo(text, err=True)  # noqa: E731

    def section(key: str, what: str, measure) -> None:
        say(f"{what} ...")
        result[key] = measure()
        result["ratios"] = ratios(result)
        result["met"] = met(result)
        result["forbidden_imports"] = sorted(name for name in FORBIDDEN if name in sys.modules)
        save(result)

    def capsnet_fit(amp: str, compile: bool):
        config = _train_config(settings, amp=amp, compile=compile)
        return lambda: timed_fit(options["model"], mnist, config, window)

    def em_fit():
        norb = smallnorb_like(options["em_images"], options["em_size"])
        config = _train_config(settings, batch_size=options["em_batch_size"], augment="none",
                               amp="bf16")  # fmt: skip
        shape = {"in_channels": 2, "input_size": options["em_size"], "num_classes": 5}
        return timed_fit(options["em_model"], norb, config, window, **shape)

    compiled = "compiled" if options["compile"] else "eager"
    section("capsnet_bf16", f"{options['model']} training, bf16, {compiled}",
            capsnet_fit("bf16", options["compile"]))  # fmt: skip
    section("naive", "naive reference, bf16, eager", lambda: naive_rate(
        options["model"], options["batch_size"], window, str(device), "bf16"))  # fmt: skip
    if options["compile"]:
        section("capsnet_eager", f"{options['model']} training, bf16, eager",
                capsnet_fit("bf16", False))  # fmt: skip
    else:
        section("capsnet_eager", "(the eager run above)", lambda: result["capsnet_bf16"])
    section("em", f"{options['em_model']} training", em_fit)
    section("real_run", f"real run ({real_seconds:.0f} s of training)", lambda: real_run(
        settings, real_seconds, options["real_epochs"], options["test_limit"]))  # fmt: skip
    section("shared", f"{options['shared_processes']} processes sharing the device",
            lambda: shared_run(settings, options["shared_processes"], window))  # fmt: skip
    section("capsnet_fp32", f"{options['model']} training, fp32, {compiled}",
            capsnet_fit("fp32", options["compile"]))  # fmt: skip
    return result


if __name__ == "__main__":
    if not __package__:  # run as a file: make benchmarks.* and capsnet importable
        sys.path.insert(0, str(ROOT))
    main()
