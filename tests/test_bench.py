"""The throughput harness runs, and its naive reference is an honest comparison."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from benchmarks import throughput as bench
from benchmarks.naive_capsnet import NaiveCapsNet
from capsnet import cli, models

ROOT = Path(__file__).resolve().parents[1]

EXPECTED_KEYS = {
    "batch_sizes",
    "train",
    "infer",
    "ratios",
    "targets",
    "peak_rss_mb",
    "rss_batch",
    "threads",
    "torch",
    "model",
    "rounds",
    "steps",
}


def test_quick_run_prints_a_table_and_one_json_line():
    done = CliRunner().invoke(bench.throughput_command, ["--quick"])
    assert done.exit_code == 0, done.output
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert EXPECTED_KEYS <= set(result)
    assert result["model"] == "capsnet-small"
    for mode in ("train", "infer"):
        assert set(result[mode]) == set(bench.IMPLEMENTATIONS)
        assert all(v["2"] > 0 for v in result[mode].values())
    assert set(result["peak_rss_mb"]) == set(bench.IMPLEMENTATIONS)
    assert set(result["ratios"]["2"]) == set(bench.TARGETS) - {"gpu_memory_vs_naive"}
    assert result["amp"] == "auto" and result["compile"] is False  # training's defaults
    assert "train img/s" in lines[0]
    # a smoke run of the small model is not held to the full model's targets
    assert result["targets"] == {} and not any("(target " in line for line in lines)
    assert "none applies to this run" in done.stdout
    assert bench.targets_for("capsnet", 128) == bench.TARGETS


def test_run_with_a_subset_of_implementations_and_no_rss():
    result = bench.run(
        [2],
        rounds=1,
        steps=1,
        implementations=["capsnet", "conv"],
        model="capsnet-small",
        rss=False,
    )
    assert set(result["train"]) == {"capsnet", "conv"}
    assert set(result["ratios"]["2"]) == {"train_vs_conv", "infer_vs_conv"}


def test_memory_is_gpu_memory_on_cuda_and_rss_elsewhere():
    assert bench._memory_key("cuda") == bench._memory_key("cuda:1") == "peak_gpu_mb"
    assert bench._memory_key("cpu") == "peak_rss_mb"
    result = {"device": "cuda", "train": {}, "infer": {}, "batch_sizes": [], "rss_batch": 8}
    result["peak_gpu_mb"] = {"capsnet": {"peak_mb": 100.0}, "naive": {"peak_mb": 400.0}}
    assert bench.ratios(result) == {"8": {"gpu_memory_vs_naive": 0.25}}
    result["ratios"] = bench.ratios(result)
    result["targets"] = {"8": {"gpu_memory_vs_naive": 0.5}}
    assert "batch 8 gpu_memory_vs_naive: 0.25 (target 0.5)" in bench.format_table(result)
    assert "peak GPU memory train step, capsnet (batch 8): 100 MiB" in bench.format_table(result)


def test_the_training_step_runs_under_the_training_precision(monkeypatch):
    """bench's step enters the same precision context as fit's (evaluate.autocast)."""
    entered = []
    real = bench.autocast

    def spy(device, amp):
        entered.append((device.type, amp))
        return real(device, amp)

    monkeypatch.setattr(bench, "autocast", spy)
    module = bench.build_impl("capsnet", "capsnet-small")
    train_step, infer_step = bench.make_steps(module, 2, module.config, torch.device("cpu"), "fp32")
    train_step()
    infer_step()
    assert entered == [("cpu", "fp32"), ("cpu", "fp32")]


def test_cpu_bf16_times_the_same_model_under_cpu_autocast_beside_fp32():
    result = bench.run([2], rounds=1, steps=1, implementations=["capsnet"],
                       model="capsnet-small", rss=False, amp="fp32", cpu_bf16=True)  # fmt: skip
    assert set(result["train"]) == set(result["infer"]) == {"capsnet", bench.CPU_BF16_IMPL}
    speedup = result["ratios"]["2"]["cpu_bf16_train_speedup"]
    assert speedup == result["train"][bench.CPU_BF16_IMPL]["2"] / result["train"]["capsnet"]["2"]
    assert result["cpu_bf16"] is True and isinstance(result["cpu_flags"], list)
    dtypes = []
    module = bench.build_impl("capsnet", "capsnet-small")
    module.conv1.register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    for amp in (bench.CPU_BF16, "fp32"):
        train_step, _ = bench.make_steps(module, 2, module.config, torch.device("cpu"), amp)
        train_step()
    assert dtypes == [torch.bfloat16, torch.float32]
    done = CliRunner().invoke(bench.throughput_command, ["--quick", "--cpu-bf16", "--impl", "conv"])
    assert done.exit_code == 1 and "--cpu-bf16 compares the capsnet implementation" in done.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--quick", "--impl", "capsnet,nope"], "'--impl': nope unknown"),
        (["--batch-sizes", "a,b"], "'--batch-sizes'"),
        (["--batch-sizes", "0"], "positive integers"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args, needle):
    done = CliRunner().invoke(bench.throughput_command, args)
    assert done.exit_code == 2
    assert needle in done.stderr


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "capsnet", "bench"],
        [sys.executable, "-m", "benchmarks.throughput"],
        [sys.executable, str(ROOT / "benchmarks" / "throughput.py")],
    ],
    ids=["capsnet-bench", "python-m", "python-file"],
)
def test_every_entry_point_runs_the_same_command(command, tmp_path):
    """From another directory, so `capsnet bench` finds benchmarks/ through the checkout;
    an unknown model is one line and exit 1 in each."""
    cwd = ROOT if command[1] == "-m" and command[2].startswith("benchmarks") else tmp_path
    done = subprocess.run(
        [*command, "--model", "nope", "--no-rss"], capture_output=True, text=True, cwd=cwd
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: unknown model 'nope'; choose one of: " + ", ".join(models.names())
    ]


def test_capsnet_bench_outside_a_source_checkout_is_one_line(monkeypatch):
    """An installed wheel has no benchmarks/: `capsnet bench` says to use a checkout."""
    for name in ("benchmarks", "benchmarks.throughput"):  # their imports fail
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(cli, "source_checkout", lambda: None)
    done = CliRunner().invoke(cli.main, ["bench", "--quick"])
    assert done.exit_code == 1
    assert done.stderr.strip().splitlines() == [
        "Error: capsnet bench needs benchmarks/, which only a source checkout of "
        "capsnet-pipeline has: run it from one"
    ]


@pytest.mark.parametrize(
    "name, overrides",
    [("capsnet", {}), ("capsnet-small", {}), ("capsnet-small", {"decoder": False})],
)
def test_naive_reference_has_the_same_parameter_count(name, overrides):
    ours = models.build(name, **overrides)
    assert models.count_parameters(NaiveCapsNet(ours.config)) == models.count_parameters(ours)


@pytest.mark.parametrize("iterations", [1, 3])
def test_naive_reference_matches_our_model_with_the_same_weights(iterations):
    torch.manual_seed(0)
    ours = models.build("capsnet-small", routing_iterations=iterations)
    naive = NaiveCapsNet.from_model(ours)
    x = torch.rand(5, 1, 28, 28)  # (B, C, H, W)
    target = torch.tensor([0, 1, 2, 3, 4])
    for t in (None, target):
        expected = ours(x, t)
        scores, poses, reconstruction = naive(x, t)
        torch.testing.assert_close(scores, expected.scores, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(poses, expected.poses, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(reconstruction, expected.reconstruction, atol=1e-5, rtol=1e-4)


def _em_bench(*args: str):
    script = ROOT / "benchmarks" / "em_throughput.py"
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=600
    )


def test_em_benchmark_reports_ratios_against_the_reference(tmp_path):
    """The EM benchmark on a tiny model: every implementation timed in its own process, a
    table, and each throughput as a multiple of the reference's (from the same run)."""
    out = tmp_path / "em.json"
    done = _em_bench(
        "--model", "em-capsnet-small", "--input-size", "24", "--in-channels", "1",
        "--batch-size", "2", "--impls", "eager,reference", "--steps", "1", "--warmup", "0",
        "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| eager | 2 |" in done.stdout and "| reference | 2 |" in done.stdout
    assert "s / epoch: 24,300 images" in done.stdout
    results = {r["impl"]: r for r in json.loads(out.read_text())}
    expected = results["eager"]["images_per_second"] / results["reference"]["images_per_second"]
    assert results["eager"]["ratio_vs_reference"] == pytest.approx(expected)
    epoch = 24_300 / results["eager"]["images_per_second"]
    assert results["eager"]["seconds_per_epoch"] == pytest.approx(epoch)
    assert f"eager / reference throughput (images/s): {expected:.2f}x" in done.stdout


def _em_bench_refusal(capsys, *args: str) -> str:
    """benchmarks/em_throughput.py's argument checks, in this process: exit 2; its stderr."""
    from benchmarks import em_throughput

    with pytest.raises(SystemExit) as exited:
        em_throughput.main(list(args))
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_em_benchmark_rejects_unknown_implementations(capsys):
    assert "--impls: fastest unknown" in _em_bench_refusal(capsys, "--impls", "eager,fastest")


def test_em_benchmark_times_each_implementation_against_a_revision(tmp_path, monkeypatch, capsys):
    """--against REV: the workers run this tree and REV's exported source tree, and each
    implementation's throughput is printed as a multiple of its REV row's."""
    from benchmarks import em_throughput

    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    seen = []

    def rounds(n, impls, sources, passthrough):  # the workers' results, without the workers
        seen.extend([sources[0], (sources[1] / "capsnet" / "__init__.py").is_file()])
        row = {"device": "cpu", "peak_gpu_gib": None, "batch_size": 2, "peak_rss_gib": 0.1,
               "threads": 1, "torch": torch.__version__}  # fmt: skip
        return {
            "eager": [{**row, "impl": "eager", "seconds_per_step": 0.5}],
            "eager@HEAD": [{**row, "impl": "eager@HEAD", "seconds_per_step": 2.0}],
        }

    monkeypatch.setattr(em_throughput, "_rounds", rounds)
    out = tmp_path / "em.json"
    em_throughput.main(["--impls", "eager", "--against", "HEAD", "--json", str(out)])
    assert seen == [None, True]  # this tree, then REV's (exported while the workers ran)
    assert "eager / eager@HEAD throughput (images/s): 4.00x" in capsys.readouterr().out
    results = {r["impl"]: r for r in json.loads(out.read_text())}
    assert results["eager"]["ratio_vs_against"] == pytest.approx(4.0)


def test_em_benchmark_refuses_an_unknown_revision(capsys):
    err = _em_bench_refusal(capsys, "--impls", "eager", "--against", "no-such-revision")
    assert "--against no-such-revision: not a git revision" in err
