"""benchmarks/gpu_check.py runs its whole logic on the CPU at tiny sizes, imports none of
the pipeline's heavy dependencies, and reports what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
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
         "--em-images", "4", "--em-batch-size", "4", "--em-size", "20", "--budget-s", "1",
         "--min-window-s", "0.25", "--shared-processes", "2", "--real-images", "16",
         "--real-seconds", "0.001", "--real-epochs", "3", "--test-limit", "16", "--no-compile"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["forbidden_imports"] == []  # no albumentations, ray, dvc, wandb
    assert result["device"] == "cpu" and result["torch"] == torch.__version__
    assert result["window_seconds"] == 0.25  # the floor (2 s unless a smoke test lowers it)
    for key, amp in (("capsnet_bf16", "bf16"), ("capsnet_fp32", "fp32")):
        run = result[key]
        assert run["amp"] == amp and run["precision"] == amp  # bf16 autocasts on a CPU too
        assert 1 <= run["images"] <= 16 and run["images_per_second"] > 0
        assert run["timed_epochs"] >= 2 and run["peak_gpu_mb"] is None  # not CUDA
    assert result["capsnet_eager"] == result["capsnet_bf16"]  # --no-compile: one eager run
    ratios = result["ratios"]
    bf16, naive = result["capsnet_bf16"]["images_per_second"], result["naive"]
    assert naive["precision"] == result["capsnet_bf16"]["precision"] and naive["steps"] >= 1
    assert ratios["capsnet_vs_naive"] == ratios["eager_vs_naive"]
    assert ratios["capsnet_vs_naive"] == bf16 / naive["images_per_second"]
    assert ratios["capsnet_seconds_per_epoch"] == 55_000 / bf16
    assert ratios["em_seconds_per_epoch"] == 24_300 / result["em"]["images_per_second"]
    assert result["em"]["model"] == "em-capsnet-small" and result["em"]["images"] <= 4
    shared = result["shared"]
    assert shared["processes"] == 2 and len(shared["images_per_second_each"]) == 2
    assert shared["aggregate_images_per_second"] > 0 and shared["window_seconds"] == 0.25
    assert shared["span_seconds"] >= shared["window_seconds"]
    real = result["real_run"]
    assert real["epochs"] == 1  # the budget stops after the first epoch
    assert real["test_images"] == 16 and 0 <= real["test_accuracy"] <= 1
    ran = result["capsnet_bf16"]["precision"]  # bf16 on a CPU with native bf16, else fp32
    why = f"n/a: capsnet-small in {ran}, the target is capsnet in bf16"
    assert result["met"]["capsnet_seconds_per_epoch"] == why
    assert result["met"]["em_seconds_per_epoch"].startswith(f"n/a: em-capsnet-small in {ran}")
    block = gpu_check.markdown(result)
    assert block in done.stdout and "| measurement | result | target | met |" in block
    assert f"| capsnet-small training, {ran}, eager, batch 8," in block
    assert f"| <= 1.0 s | {why} |" in block


def test_verdicts_follow_the_targets():
    result = {"model": "capsnet", "capsnet_bf16": {"model": "capsnet", "precision": "bf16",
                                                   "images_per_second": 60_000.0}}  # fmt: skip
    result["naive"] = {"images_per_second": 10_000.0}
    result["ratios"] = gpu_check.ratios(result)
    assert gpu_check.met(result) == {"capsnet_seconds_per_epoch": "yes", "capsnet_vs_naive": "yes"}
    result["naive"]["images_per_second"] = 20_000.0  # 3x
    result["ratios"] = gpu_check.ratios(result)
    assert gpu_check.met(result)["capsnet_vs_naive"] == "no"
    assert gpu_check.window_seconds(300) == 12.0 and gpu_check.window_seconds(1) == 2.0


def test_a_run_cut_after_its_first_section_has_saved_that_section(monkeypatch, tmp_path):
    def cut(*_args, **_kwargs):
        raise KeyboardInterrupt  # the time limit, during the second section

    monkeypatch.setattr(gpu_check, "timed_fit", lambda *a, **k: {"images_per_second": 1.0,
                        "model": "capsnet", "precision": "bf16"})  # fmt: skip
    monkeypatch.setattr(gpu_check, "naive_rate", cut)
    out = tmp_path / "check.json"
    options = {"device": "cpu", "budget_s": 300.0, "real_seconds": None, "model": "capsnet",
               "batch_size": 8, "compile": True, "epoch_images": 16, "real_images": 16,
               "mnist_dir": str(tiny_mnist_dir(tmp_path))}  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        gpu_check.run_check(options, lambda result: gpu_check._write(out, result))
    saved = json.loads(out.read_text())
    assert saved["capsnet_bf16"]["images_per_second"] == 1.0 and "naive" not in saved
    assert saved["ratios"] == {"capsnet_seconds_per_epoch": 55_000.0}
    assert saved["met"] == {"capsnet_seconds_per_epoch": "no"}


def test_a_missing_mnist_folder_is_one_line(tmp_path):
    from click.testing import CliRunner

    done = CliRunner().invoke(gpu_check.main, ["--mnist", str(tmp_path), "--device", "cpu"])
    assert done.exit_code == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "train-images" in lines[0]
