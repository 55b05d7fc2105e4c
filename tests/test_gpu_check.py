"""benchmarks/gpu_check.py runs its whole logic on the CPU at tiny sizes, imports none of
the pipeline's heavy dependencies, and reports what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks import gpu_check
from capsnet.data.formats import write_idx

ROOT = Path(__file__).resolve().parents[1]


def tiny_mnist_dir(directory: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    for prefix, n in (("train", 48), ("t10k", 16)):
        images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=generator)
        write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte.gz", torch.arange(n) % 10)
    return directory


def test_the_whole_check_runs_on_the_cpu_at_tiny_sizes(tmp_path):
    mnist = tiny_mnist_dir(tmp_path)
    out = tmp_path / "check.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--mnist", str(mnist),
         "--device", "cpu", "--json", str(out), "--model", "capsnet-small",
         "--em-model", "em-capsnet-small", "--batch-size", "8", "--epoch-images", "16",
         "--naive-steps", "1", "--em-images", "4", "--em-batch-size", "4", "--em-size", "20",
         "--shared-processes", "2", "--shared-images", "16", "--real-images", "16",
         "--real-seconds", "0.001", "--real-epochs", "3", "--test-limit", "16", "--no-compile"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["forbidden_imports"] == []  # no albumentations, ray, dvc, wandb
    assert result["device"] == "cpu" and result["torch"] == torch.__version__
    for amp in ("bf16", "fp32"):
        run = result[f"capsnet_{amp}"]
        assert run["amp"] == amp and run["images"] == 16 and run["images_per_second"] > 0
        assert run["peak_gpu_mb"] is None  # not CUDA
    ratios = result["ratios"]
    bf16, naive = result["capsnet_bf16"]["images_per_second"], result["naive_bf16"]
    assert ratios["capsnet_vs_naive"] == bf16 / naive["images_per_second"]
    assert ratios["capsnet_seconds_per_epoch"] == 55_000 / bf16
    assert ratios["em_seconds_per_epoch"] == 24_300 / result["em"]["images_per_second"]
    assert result["em"]["model"] == "em-capsnet-small" and result["em"]["images"] == 4
    shared = result["shared"]
    assert shared["processes"] == 2 and len(shared["images_per_second_each"]) == 2
    assert shared["aggregate_images_per_second"] > 0
    real = result["real_run"]
    assert real["epochs"] == 1  # the budget stops after the first epoch
    assert real["test_images"] == 16 and 0 <= real["test_accuracy"] <= 1
    assert gpu_check.markdown(result) in done.stdout
    assert "| bf16 training vs the naive reference |" in done.stdout


def test_a_missing_mnist_folder_is_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--mnist", str(tmp_path),
         "--device", "cpu"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "train-images" in lines[0]
