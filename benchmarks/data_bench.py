"""Data benchmarks (issue 3 targets), each measured in one run on this machine.

    python benchmarks/data_bench.py [--mirror ../shared/datasets]

1. MultiMNIST rendering, images/s on one core (target >= 20,000).
2. MNIST download from the mirror + raw-MD5 verification + prepare, seconds (target <= 15).
3. Augmentation cost per batch of 128 for each strategy, as a fraction of one capsnet-small
   training step on the CPU (target < 10% for shift and affine). The augmentation runs in
   DataLoader workers during training, so this is an upper bound on the slowdown of a run
   with num_workers=0.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def best_of(fn, repeats: int = 3) -> float:
    """The fastest of ``repeats`` timed calls, in seconds."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def multimnist_rate(images, labels, batch: int = 1024, total: int = 20480) -> float:
    from capsnet.data import multimnist

    recipe = multimnist.make_recipe(labels, 2, shift=4, pad=4, seed=0)

    def render_all():
        for start in range(0, total, batch):
            multimnist.render(images, labels, recipe, slice(start, start + batch))

    return total / best_of(render_all)


def mnist_seconds(mirror: str) -> float:
    from capsnet.data import mnist

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        mnist.download(Path(tmp) / "raw", mirror=mirror, progress=False)
        mnist.prepare(Path(tmp) / "raw", Path(tmp) / "prepared")
        return time.perf_counter() - started


def augment_fractions(images, labels, batch: int = 128) -> tuple[float, dict[str, float]]:
    from capsnet import models
    from capsnet.config import AugmentParams
    from capsnet.data import TensorImageDataset
    from capsnet.data.augment import STRATEGIES, AugmentedDataset
    from capsnet.training.fit import TrainConfig, compute_loss

    torch.manual_seed(0)
    model = models.build("capsnet-small")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = images[:batch, None].float() / 255
    y = labels[:batch]
    config = TrainConfig()

    def step():
        output = model(x, y)
        loss = compute_loss(model, output, x, y, config)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()  # warm-up
    step_seconds = best_of(step)
    base = TensorImageDataset(images[:batch], labels[:batch])
    fractions = {}
    for strategy in STRATEGIES:
        data = AugmentedDataset(base, strategy, AugmentParams(), seed=0)
        seconds = best_of(lambda data=data: [data[i] for i in range(batch)])
        fractions[strategy] = seconds / step_seconds
    return step_seconds, fractions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mirror",
        default=os.environ.get("CAPSNET_MIRROR") or str(REPO.parent / "shared" / "datasets"),
    )
    args = parser.parse_args()
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    from capsnet.data import mnist

    seconds = mnist_seconds(args.mirror)
    print(f"mnist download (mirror) + verify + prepare: {seconds:.2f} s   (target <= 15 s)")
    with tempfile.TemporaryDirectory() as tmp:
        mnist.download(tmp, mirror=args.mirror, progress=False)
        images, labels = mnist.read_split(tmp, "train")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rate = multimnist_rate(images, labels)
    print(f"multimnist render, 1 thread: {rate:,.0f} images/s   (target >= 20,000)")
    torch.set_num_threads(threads)
    step, fractions = augment_fractions(images, labels)
    print(f"capsnet-small training step, batch 128, {threads} threads: {step * 1000:.0f} ms")
    for strategy, fraction in fractions.items():
        print(
            f"augment {strategy:<8} per batch of 128: {fraction * step * 1000:6.1f} ms = "
            f"{fraction:6.1%} of a step   (target < 10% for shift, affine)"
        )


if __name__ == "__main__":
    main()
