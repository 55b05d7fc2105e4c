"""How far load moves the equal-time rule: ``capsnet.training.run.step_costs`` of
capsnet-small and LeNet5 (batch 32, shift augmentation, tests/test_budget_clock.py's
setting) measured ``--repeats`` times with the machine as it is, then as often again beside
each count of ``--busy`` spinning processes; prints the epochs LeNet5 would train for
capsnet-small's 3 epochs of ``--images`` images, and each loaded measurement's distance
from the first one as a ratio. The numbers in docs/guides/evaluation.md ("The equal-time rule")
were measured with it."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import torch


def _spinners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


@click.command()
@click.option("--busy", default="1,2", show_default=True, help="spinner counts to try")
@click.option("--repeats", type=int, default=2, show_default=True)
@click.option("--images", type=int, default=20_000, show_default=True)
def main(busy: str, repeats: int, images: int) -> None:
    from capsnet.config.training import TrainConfig
    from capsnet.data.datasets import TensorImageDataset
    from capsnet.training.run import RunSpec, Split, equal_time_epochs, step_costs

    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (64, 1, 28, 28), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (64,), generator=generator)
    split = Split(TensorImageDataset(pixels, labels, "noise"), None)
    train = TrainConfig(epochs=3, batch_size=32, device="cpu", progress=False)
    specs = [RunSpec(model=m, train=train, augment="shift") for m in ("capsnet-small", "lenet5")]

    def epochs() -> tuple[int, list[float]]:
        costs = step_costs(specs, split)
        return equal_time_epochs(specs[0], specs[1], (costs[0], costs[1]), images), costs

    reference = None
    for spinners in [0] + [int(n) for n in busy.split(",")]:
        loops = _spinners(spinners)
        try:
            for _ in range(repeats):
                count, costs = epochs()
                reference = reference or count
                line = {"busy": spinners, "epochs": count, "vs_first": round(count / reference, 3),
                        "step_ms": [round(c * 1000, 2) for c in costs]}  # fmt: skip
                print(json.dumps(line), flush=True)
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()


if __name__ == "__main__":
    main()
