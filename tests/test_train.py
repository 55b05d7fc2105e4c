import warnings

import pytest
import torch
from clihelpers import invoke_cli

from capsnet import models
from capsnet.data.datasets import TensorImageDataset, load
from capsnet.io.errors import ConfigError
from capsnet.models import checkpoint
from capsnet.nn import losses
from capsnet.training import scoring as evaluate
from capsnet.training.device import mark_step, select_device
from capsnet.training.fit import TrainConfig, check_steps, compile_record, compute_loss, fit


@pytest.fixture(scope="module")
def mnist_small(mnist_root):
    train = load("mnist", "train", mnist_root, download=False)
    test = load("mnist", "test", mnist_root, download=False)
    return train, test


def test_overfits_a_64_image_batch_to_100_percent(mnist_small):
    train, _ = mnist_small
    images, labels = train.tensors
    batch = TensorImageDataset(images[:64], labels[:64])
    torch.manual_seed(0)
    model = models.build("capsnet-small")
    config = TrainConfig(epochs=25, batch_size=64, lr=3e-3, progress=False)  # 100% from 15
    fit(model, batch, None, config)
    assert evaluate.accuracy(model, batch)["accuracy"] == 1.0


def test_training_is_repeatable_on_cpu_with_a_seed(mnist_small):
    train, _ = mnist_small
    data = train.subset(256)
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        model = models.build("lenet5")
        history = fit(
            model,
            data,
            data,
            TrainConfig(epochs=2, batch_size=32, seed=3, augment="shift", progress=False),
        )
        runs.append((history, model.state_dict()))
    assert [r["train_loss"] for r in runs[0][0]] == [r["train_loss"] for r in runs[1][0]]
    for key, value in runs[0][1].items():
        assert torch.equal(value, runs[1][1][key]), key


def test_history_records_and_callback(mnist_small):
    train, test = mnist_small
    seen = []
    torch.manual_seed(0)
    model = models.build("lenet5")
    history = fit(
        model,
        train.subset(512),
        test.subset(200),
        TrainConfig(epochs=2, batch_size=64, progress=False),
        on_epoch=lambda record, state: seen.append((record["epoch"], state.epoch)),
    )
    assert seen == [(1, 1), (2, 2)]
    assert [r["epoch"] for r in history] == [1, 2]
    for record in history:
        assert {"train_loss", "train_accuracy", "val_accuracy", "lr", "seconds"} <= set(record)
        assert 0.0 <= record["val_accuracy"] <= 1.0
    # Adam lr decays as 0.96 ** (step / 2000): 16 steps after two epochs of 8 batches
    assert history[-1]["lr"] == pytest.approx(1e-3 * 0.96 ** (16 / 2000))


def test_check_steps_are_evenly_spaced_within_an_epoch():
    assert check_steps(254, 1) == {}
    assert check_steps(8, 4) == {2: 0.25, 4: 0.5, 6: 0.75}
    assert check_steps(254, 8) == {round(k * 254 / 8): k / 8 for k in range(1, 8)}
    assert check_steps(3, 8) == {1: 0.25, 2: 0.5}  # one check per step at most, none at the end
    assert check_steps(1, 4) == {}


def test_checks_within_epochs_see_the_model_mid_training_and_change_nothing(mnist_small):
    """``on_check`` runs at the fractional epochs, sees weights that differ from the epoch
    ends', gets the model back in training mode, and the run trains bit for bit as one
    without checks: a model with dropout, and checks that draw from the global generator
    as a DataLoader does for its base seed."""
    train, test = mnist_small
    data = train.subset(256)  # 8 steps an epoch
    config = TrainConfig(epochs=2, batch_size=32, seed=3, augment="shift", progress=False)
    shape = {"in_channels": 1, "input_size": 28, "num_classes": 10}

    def build():
        torch.manual_seed(7)
        return models.build("smallnorb-cnn", **shape)  # dropout 0.5 before its classifier

    plain = build()
    fit(plain, data, None, config)
    model = build()
    assert any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    seen = []

    def check(epoch):
        torch.rand(())  # a draw from the global generator, as DataLoader(...) makes
        seen.append((epoch, evaluate.accuracy(model, test.subset(64))["accuracy"]))
        model.eval()  # fit puts it back in training mode

    def at_end(record, state):
        seen.append((record["epoch"], evaluate.accuracy(model, test.subset(64))["accuracy"]))
        assert model.training

    fit(model, data, None, config, on_epoch=at_end, checks_per_epoch=4, on_check=check)
    assert [epoch for epoch, _ in seen] == [0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2]
    assert len({accuracy for _, accuracy in seen}) > 1  # measured while the weights moved
    for key, value in plain.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key
    with pytest.raises(ConfigError, match="checks_per_epoch must be at least 1, got 0"):
        fit(models.build("lenet5"), data, None, config, checks_per_epoch=0)


def test_an_epochs_seconds_leave_out_the_checks_within_it(mnist_small, monkeypatch):
    """Each check moves fit's clock on by 100 s: the epoch's ``seconds`` stay the training
    time, ``check_seconds`` take the 300 s of its three checks."""
    import types

    from capsnet.training import fit as fit_module

    offset = [0.0]
    real = fit_module.time.perf_counter
    monkeypatch.setattr(
        fit_module, "time", types.SimpleNamespace(perf_counter=lambda: real() + offset[0])
    )

    def check(epoch):
        offset[0] += 100.0

    train, _ = mnist_small
    config = TrainConfig(epochs=2, batch_size=32, progress=False)
    history = fit(models.build("lenet5"), train.subset(256), None, config, checks_per_epoch=4,
                  on_check=check)  # fmt: skip
    for record in history:
        assert 300.0 <= record["check_seconds"] < 300.0 + 100.0
        assert 0 < record["seconds"] < 100.0
    plain = fit(models.build("lenet5"), train.subset(256), None, config)
    assert all("check_seconds" not in record for record in plain)


def test_resume_continues_where_a_run_stopped(mnist_small):
    train, _ = mnist_small
    data = train.subset(128)
    config = TrainConfig(epochs=2, batch_size=32, progress=False)
    torch.manual_seed(0)
    straight = models.build("lenet5")
    full = fit(straight, data, None, config)

    torch.manual_seed(0)
    first = models.build("lenet5")
    states = []
    fit(
        first,
        data,
        None,
        TrainConfig(epochs=1, batch_size=32, progress=False),
        on_epoch=lambda record, state: states.append(state),
    )
    resumed = fit(first, data, None, config, resume=states[0])
    assert [r["epoch"] for r in resumed] == [1, 2]
    assert resumed[1]["train_loss"] == pytest.approx(full[1]["train_loss"], rel=1e-5)


def test_train_save_load_eval_reproduces_accuracy_exactly(tmp_path, mnist_small):
    train, test = mnist_small
    torch.manual_seed(0)
    model = models.build("capsnet-small", routing_iterations=2)
    config = TrainConfig(epochs=1, batch_size=64, progress=False)
    fit(model, train.subset(192), None, config)
    before = evaluate.accuracy(model, test.subset(100))
    path = checkpoint.save(
        tmp_path / "m.pt", model, train_config=config.to_dict(), metrics={"mnist": before}
    )
    loaded, meta = checkpoint.load(path)
    after = evaluate.accuracy(loaded, test.subset(100))
    assert after == before
    assert meta["metrics"]["mnist"] == before
    assert meta["model_config"]["routing_iterations"] == 2
    assert meta["train_config"]["batch_size"] == 64


def test_rotation_sweep_at_zero_equals_upright(mnist_small):
    _, test = mnist_small
    torch.manual_seed(0)
    model = models.build("lenet5")
    data = test.subset(200)
    sweep = evaluate.rotation_sweep(model, data, [0, 360, 35])
    upright = evaluate.accuracy(model, data)["accuracy"]
    assert sweep["n"] == 200
    assert sweep["accuracy"]["0"] == upright
    assert sweep["accuracy"]["360"] == upright


def test_margin_loss_used_for_capsules_and_cross_entropy_for_cnns():
    torch.manual_seed(0)
    images = torch.rand(2, 1, 28, 28)
    targets = torch.tensor([1, 2])
    config = TrainConfig(progress=False)
    caps = models.build("capsnet-small")
    cnn = models.build("lenet5")
    caps_out = caps(images, targets)
    caps_loss = compute_loss(caps, caps_out, images, targets, config)
    lengths, one_hot = caps_out.scores, torch.nn.functional.one_hot(targets, 10).float()
    present = one_hot * (0.9 - lengths).clamp_min(0) ** 2  # (B, 10)
    absent = 0.5 * (1 - one_hot) * (lengths - 0.1).clamp_min(0) ** 2  # (B, 10)
    margin = (present + absent).sum(dim=1).mean()
    torch.testing.assert_close(margin, losses.margin_loss(lengths, targets))
    squared_error = (caps_out.reconstruction - images).pow(2).sum(dim=(1, 2, 3))  # (B,)
    reconstruction = 0.0005 * squared_error.mean()
    assert reconstruction > 1e-4  # the decoder term is part of the loss, not negligible
    torch.testing.assert_close(caps_loss, margin + reconstruction)
    cnn_out = cnn(images)
    cnn_loss = compute_loss(cnn, cnn_out, images, targets, config)
    torch.testing.assert_close(cnn_loss, torch.nn.functional.cross_entropy(cnn_out.scores, targets))


def test_select_device():
    assert select_device("cpu").type == "cpu"
    assert select_device("auto").type in ("cpu", "cuda", "mps")


def test_split_tail_keeps_in_memory_sets_and_slices_others(mnist_small):
    from capsnet.data.datasets import Slice, split_tail

    train, _ = mnist_small
    data = train.subset(100)
    head, tail = split_tail(data, 30, head_limit=50)
    assert hasattr(head, "tensors") and len(head) == 50 and len(tail) == 30
    assert torch.equal(tail.tensors[0], data.tensors[0][70:])

    class Epochs(torch.utils.data.Dataset):
        def __init__(self):
            self.epoch = None

        def __len__(self):
            return 10

        def __getitem__(self, i):
            return i

        def set_epoch(self, epoch):
            self.epoch = epoch

    base = Epochs()
    head, tail = split_tail(base, 4)
    assert isinstance(head, Slice) and [head[i] for i in range(len(head))] == list(range(6))
    assert [tail[i] for i in range(len(tail))] == [6, 7, 8, 9]
    head.set_epoch(3)
    assert base.epoch == 3
    with pytest.raises(IndexError):
        head[6]


def test_train_command_on_multimnist_writes_strict_accuracy(tmp_path, mnist_root):
    import json

    from click.testing import CliRunner

    from capsnet.cli import main

    out = tmp_path / "mm"
    result = CliRunner().invoke(
        main,
        [
            "train",
            "--model",
            "capsnet-small",
            "--dataset",
            "multimnist",
            "--train-limit",
            "64",
            "--val-size",
            "32",
            "--test-limit",
            "40",
            "--batch-size",
            "32",
            "--data-root",
            str(mnist_root),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dataset"] == "multimnist"
    assert set(metrics["multimnist"]) >= {"strict_accuracy", "at_least_one", "half_credit", "n"}
    assert metrics["multimnist"]["n"] == 40
    from capsnet.models import checkpoint

    model, _ = checkpoint.load(out / "model.pt")
    assert model.config.input_size == 36  # MultiMNIST canvas: 28 + 2 * pad


def test_compile_switches_on_compiled_routing_of_models_that_have_it(monkeypatch):
    """TrainConfig.compile calls compile_routing() on EM models (the compiled path itself is
    tested in test_em.py) and leaves models without routing to compile untouched."""
    calls = []
    em = models.build("em-capsnet-small", A=8, B=4, C=4, D=4, input_size=24, num_classes=5)
    monkeypatch.setattr(em, "compile_routing", lambda enabled=True: calls.append(enabled))
    data = TensorImageDataset(torch.zeros(4, 1, 24, 24, dtype=torch.uint8), torch.arange(4) % 5)
    fit(em, data, None, TrainConfig(epochs=1, batch_size=4, compile=True, progress=False))
    assert calls == [True]
    fit(em, data, None, TrainConfig(epochs=1, batch_size=4, progress=False))
    assert calls == [True]  # off by default
    lenet = models.build("lenet5", num_classes=5, input_size=24)
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("torch.compile called"))
    before = {k: v.clone() for k, v in lenet.state_dict().items()}
    history = fit(
        lenet, data, None, TrainConfig(epochs=1, batch_size=4, compile=True, progress=False)
    )
    assert len(history) == 1 and history[0]["train_loss"] > 0
    assert any(not torch.equal(before[k], v) for k, v in lenet.state_dict().items())  # trained


@pytest.mark.parametrize("compiles", [True, False])
def test_the_history_records_whether_routing_ran_compiled(monkeypatch, compiles):
    """A run asking for compiled routing records in every epoch what ran: compiled, or
    eager with the error that made it fall back (the checkpoint's metrics carry both)."""
    import capsnet.nn.routing.em as em

    def steps(device_type):
        if not compiles:
            raise OSError("no C++ compiler")
        return em.em_step, em.em_last_step  # what compiled_steps compiles, run eagerly

    monkeypatch.setattr(em, "compiled_steps", steps)
    model = models.build("em-capsnet-small", A=8, B=4, C=4, D=4, input_size=24, num_classes=5)
    data = TensorImageDataset(torch.zeros(4, 1, 24, 24, dtype=torch.uint8), torch.arange(4) % 5)
    config = TrainConfig(epochs=2, batch_size=4, compile=True, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        history = fit(model, data, None, config)
    ran = [{k: r[k] for k in ("compiled", "compile_fallback") if k in r} for r in history]
    expected = {"compiled": True} if compiles else {
        "compiled": False, "compile_fallback": "OSError: no C++ compiler"}  # fmt: skip
    assert ran == [expected, expected]
    assert compile_record(model, config) == expected
    eager = fit(model, data, None, TrainConfig(epochs=1, batch_size=4, progress=False))
    assert "compiled" not in eager[0]  # nothing asked to compile: nothing recorded


def compiling_in_process():
    """Inductor compiles in this process (no pool of compile workers) inside the block,
    through its own ``config.patch``: pytest's monkeypatch would undo the setting with
    ``delattr`` (it lives in no ``__dict__``), which hides it, and every later compile in
    the process fails ("compile_threads does not exist") and falls back to eager."""
    return torch._inductor.config.patch(compile_threads=1)


@pytest.fixture
def inductor_in_process():
    with compiling_in_process():
        yield


def test_compiling_in_process_leaves_inductor_settings_readable():
    before = torch._inductor.config.compile_threads
    with compiling_in_process():
        assert torch._inductor.config.compile_threads == 1
    assert torch._inductor.config.compile_threads == before


def test_a_compiled_capsnet_trains_through_fit_and_recompiles_nothing_in_its_second_epoch(
    monkeypatch, inductor_in_process
):
    """CapsNet compiled whole (mode "default" on the CPU) through fit: the partial last
    batch is dropped (one training shape), every step passes its marker, the validation
    compiles its own graph in the first epoch, and the second epoch compiles nothing."""
    from torch._dynamo.utils import counters

    from capsnet.training import fit as train

    torch._dynamo.reset()
    counters.clear()
    tiny = {"conv_channels": 4, "conv_kernel": 3, "primary_types": 2, "primary_dim": 4,
            "primary_kernel": 3, "class_dim": 4, "decoder_hidden": (8,),
            "routing_iterations": 1}  # fmt: skip
    torch.manual_seed(0)
    model = models.build("capsnet-small", (1, 10, 3), **tiny)
    data = TensorImageDataset(torch.randint(0, 256, (7, 1, 10, 10), dtype=torch.uint8),
                              torch.arange(7) % 3)  # fmt: skip
    steps, seen = [], []  # step markers; (markers, graphs compiled) around each validation

    def scored(*args, **kwargs):
        seen.append((len(steps), counters["stats"]["unique_graphs"]))
        result = train_accuracy(*args, **kwargs)
        seen.append((len(steps), counters["stats"]["unique_graphs"]))
        return result

    train_accuracy = train.accuracy
    monkeypatch.setattr(train, "accuracy", scored)
    for module in (train, evaluate):  # fit's and predict's step markers
        monkeypatch.setattr(module, "mark_step", lambda device: steps.append(device))
    config = TrainConfig(epochs=2, batch_size=3, compile=True, progress=False, amp="fp32")
    history = fit(model, data, data, config)
    # 7 images in batches of 3: 2 training steps an epoch (the partial batch dropped), then
    # 1 validation batch, each behind its step marker
    assert [markers for markers, _ in seen] == [2, 3, 5, 6]
    first_train, after_val, second_train, second_val = [graphs for _, graphs in seen]
    assert first_train > 0  # the training step ran compiled
    assert after_val > first_train  # eval mode and no_grad: the validation's own graph
    assert second_train == second_val == after_val  # the second epoch: no recompile
    assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in history)


def test_steps_are_marked_for_cuda_graphs_on_cuda_only(monkeypatch):
    """Off CUDA the mark is skipped: there are no CUDA graphs, and it would import Inductor."""
    calls = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append(1))
    for device in ("cpu", "meta", "cuda"):
        mark_step(torch.device(device))
    assert calls == [1]


def test_time_budget_ends_training_early_but_never_before_one_epoch(mnist_small):
    train, test = mnist_small
    histories = {}
    for budget in (1e-9, 1e9):
        torch.manual_seed(0)
        config = TrainConfig(epochs=3, batch_size=64, time_budget=budget, progress=False)
        histories[budget] = fit(models.build("lenet5"), train.subset(128), test.subset(64), config)
    assert [r["epoch"] for r in histories[1e-9]] == [1]
    assert [r["epoch"] for r in histories[1e9]] == [1, 2, 3]  # epochs stays the upper bound


def test_time_budget_stops_at_the_epoch_nearest_the_budget(monkeypatch):
    import capsnet.training.fit as train_module

    clock = {"now": 0.0}
    monkeypatch.setattr(train_module.time, "perf_counter", lambda: clock["now"])
    # epochs of 4 s: stopping at 8 s is 2 s short of a 10 s budget, a third epoch 2 s over;
    # the rule stops once another epoch would end no nearer, i.e. when now + 4 / 2 >= 10
    for now, spent in ((4.0, False), (7.9, False), (8.0, True), (12.0, True)):
        clock["now"] = now
        assert train_module._budget_spent(10.0, 0.0, now - 4.0) is spent, now
    assert train_module._budget_spent(None, 0.0, 0.0) is False


@pytest.mark.parametrize("budget", [0.0, -1.0, float("inf"), float("nan")])
def test_time_budget_must_be_positive_and_finite(budget):
    from capsnet.io.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train\.time_budget must be > 0 seconds"):
        TrainConfig(time_budget=budget)


def test_bf16_autocast_keeps_squash_routing_softmax_and_losses_in_fp32():
    """CPU autocast stands in for CUDA's: the products run in bf16, the outputs that
    training reads are fp32 and close to an fp32 run of the same weights."""
    from capsnet.nn.layers import fused_dynamic_routing
    from capsnet.nn.routing import dynamic_routing

    torch.manual_seed(0)
    model = models.build("capsnet-small")
    images, targets = torch.rand(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    config = TrainConfig(progress=False)
    reference = model(images, targets)
    reference_loss = compute_loss(model, reference, images, targets, config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.conv1(images).dtype == torch.bfloat16  # autocast is really on
        output = model(images, targets)
        loss = compute_loss(model, output, images, targets, config)
        u = torch.rand(2, 16, 8)  # (B, n_in, d_in)
        weight = torch.rand(16, 3, 4, 8) / 8  # (n_in, n_out, d_out, d_in)
        v, c = fused_dynamic_routing(u, weight, 3, True, 2)
        v_ref, c_ref = dynamic_routing(torch.einsum("bik,ijdk->bijd", u, weight), 3)
    assert {output.scores.dtype, output.poses.dtype, loss.dtype} == {torch.float32}
    assert {v.dtype, c.dtype, v_ref.dtype, c_ref.dtype} == {torch.float32}
    torch.testing.assert_close(c.sum(-1), torch.ones(2, 16))  # softmax over parents, fp32
    torch.testing.assert_close(output.scores, reference.scores, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(loss, reference_loss, atol=2e-2, rtol=2e-2)


def test_precision_is_auto_by_default_bf16_only_where_the_cpu_has_it(monkeypatch):
    from capsnet.cli.train_commands import PRECISIONS as CLI_PRECISIONS
    from capsnet.config.sweep import PRECISIONS
    from capsnet.io.errors import ConfigError
    from capsnet.training import device as policy

    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert TrainConfig().amp == "auto"
    assert PRECISIONS == CLI_PRECISIONS == ("auto", "bf16", "fp32")
    with pytest.raises(ConfigError, match=r"train\.amp 'off' unknown; choose one of auto, "):
        TrainConfig(amp="off")
    for native in (True, False):
        monkeypatch.setattr(policy, "cpu_native_bf16", lambda native=native: native)
        expected = "bf16" if native else "fp32"
        assert policy.effective_precision(cpu, "auto") == expected
        assert policy.effective_precision(cpu, None) == expected  # TrainConfig's auto
        assert policy.effective_precision(cpu, "bf16") == "bf16"  # asked for: emulated or not
        assert policy.effective_precision(cpu, "fp32") == "fp32"
        assert policy.effective_precision(meta, "bf16") == "fp32"  # no autocast there
        with policy.autocast(cpu, "auto"):
            assert torch.is_autocast_enabled("cpu") is native


def test_native_cpu_bf16_needs_avx512_kernels_the_flags_and_the_accuracy_check(monkeypatch):
    from capsnet.training import device as policy

    assert policy.bf16_matches_fp32()  # the check itself holds for real autocast here

    def native(capability: str, flags: set[str], accurate: bool = True) -> bool:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        monkeypatch.setattr(policy, "_cpu_flags", lambda: flags)
        monkeypatch.setattr(policy, "bf16_matches_fp32", lambda: accurate)
        policy.cpu_native_bf16.cache_clear()
        try:
            return policy.cpu_native_bf16()
        finally:
            policy.cpu_native_bf16.cache_clear()

    assert native("AVX512", {"avx512f", "avx512_bf16"})
    assert native("AVX512", {"amx_bf16"})
    assert not native("AVX512", {"avx512f"})  # AVX-512 without bf16: emulated
    assert not native("AVX2", {"avx512_bf16", "amx_bf16"})  # ATEN_CPU_CAPABILITY=avx2
    assert not native("AVX512", {"avx512_bf16"}, accurate=False)


def test_amp_reaches_the_run_from_the_params_sections():
    from capsnet.config import FinalTrainConfig, SweepConfig
    from capsnet.training.run import section_spec

    sweep = SweepConfig()
    assert section_spec(FinalTrainConfig(), sweep).train.amp == TrainConfig().amp
    assert section_spec(FinalTrainConfig(amp="fp32"), sweep).train.amp == "fp32"
    assert section_spec(SweepConfig(amp="fp32"), sweep).train.amp == "fp32"


def test_a_diverging_run_raises_naming_the_epoch_and_lr_and_saves_nothing(mnist_small):
    from capsnet.io.errors import TrainingDiverged

    train, _ = mnist_small
    torch.manual_seed(0)
    saved = []
    config = TrainConfig(epochs=2, batch_size=32, lr=1e30, progress=False)
    with pytest.raises(TrainingDiverged) as info:
        fit(models.build("lenet5"), train.subset(128), None, config, on_epoch=saved.append)
    message = str(info.value)
    assert message.startswith("training diverged in epoch 1: ") and "(lr 1e+30)" in message
    assert "\n" not in message and saved == []


def test_train_command_with_a_huge_lr_exits_1_with_one_line(tmp_path, mnist_root):
    out = tmp_path / "run"
    done = invoke_cli(
        "train", "--model", "lenet5", "--lr", "1e30", "--train-limit", "256",
        "--val-size", "64", "--batch-size", "64", "--data-root", mnist_root,
        "--device", "cpu", "--out", out,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith("epoch")]
    assert len(lines) == 1 and lines[0].startswith("Error: training diverged in epoch 1: ")
    assert not out.exists()


def test_resident_and_loader_paths_see_every_item_once_per_epoch(mnist_small, monkeypatch):
    """An in-memory set (rendered from resident tensors) and the same items through the
    DataLoader path each give every item exactly once per epoch, shuffled."""
    from torch.utils.data import Dataset

    import capsnet.training.fit as train_module

    class Items(Dataset):  # the same items, without ``tensors``
        def __init__(self, base):
            self.base = base

        def __len__(self):
            return len(self.base)

        def __getitem__(self, index):
            return self.base[index]

    train, _ = mnist_small
    data = train.subset(80)
    seen = []
    real = train_module.train_step

    def spy(model, batch, *args):
        seen.append(batch[0].flatten(1).sum(1))  # (B,) one number per image
        return real(model, batch, *args)

    monkeypatch.setattr(train_module, "train_step", spy)
    expected = data.tensors[0].flatten(1).float().div(255).sum(1)  # (N,)
    for dataset in (data, Items(data)):
        seen.clear()
        config = TrainConfig(epochs=1, batch_size=32, progress=False)
        fit(models.build("lenet5"), dataset, None, config)
        assert [len(s) for s in seen] == [32, 32, 16]
        order = torch.cat(seen)
        torch.testing.assert_close(order.sort().values, expected.sort().values)
        assert not torch.allclose(order, expected)  # shuffled


def test_resume_restores_the_augmentation_stream(mnist_small):
    train, _ = mnist_small
    data = train.subset(96)
    config = TrainConfig(epochs=2, batch_size=32, augment="affine", progress=False)
    torch.manual_seed(0)
    full = fit(models.build("lenet5"), data, None, config)
    torch.manual_seed(0)
    first = models.build("lenet5")
    states = []
    once = TrainConfig(epochs=1, batch_size=32, augment="affine", progress=False)
    fit(first, data, None, once, on_epoch=lambda record, state: states.append(state))
    resumed = fit(first, data, None, config, resume=states[0])
    assert resumed[1]["train_loss"] == pytest.approx(full[1]["train_loss"], rel=1e-5)


@pytest.mark.parametrize(("dataset", "augment"), [("smallnorb", "none"), ("mnist", "shift")])
def test_capsnet_train_defaults_smallnorb_to_its_own_augmentation(
    dataset, augment, tmp_path, monkeypatch
):
    """The documented `capsnet train --dataset smallnorb ...` commands run as written:
    smallNORB augments itself, so without --augment the run gets none (MNIST: shift)."""
    from click.testing import CliRunner

    from capsnet.cli import main
    from capsnet.training import run

    monkeypatch.chdir(tmp_path)  # no params.yaml: the dataclass defaults
    seen = {}

    def stop(spec, **_):
        run.check(spec)
        seen["augment"] = spec.augment
        raise SystemExit(0)

    monkeypatch.setattr(run, "train_run", stop)
    args = ["train", "--model", "smallnorb-cnn", "--dataset", dataset, "--out", "out"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert seen == {"augment": augment}


def test_capsnet_train_checkpoint_records_the_smallnorb_standardisation(tmp_path):
    """The checkpoint of a smallNORB run records data.smallnorb.standardize (the
    evaluation compares it); other datasets record nothing."""
    from capsnet.cli.train_commands import _save
    from capsnet.config import DataParams, SmallnorbParams
    from capsnet.models import checkpoint
    from capsnet.training import run

    plain = DataParams(smallnorb=SmallnorbParams(standardize=False))
    spec = run.RunSpec("smallnorb-cnn", dataset="smallnorb", data_params=plain)
    assert spec.data_record() == {"standardize": False}
    assert run.RunSpec("lenet5").data_record() == {}
    result = run.RunResult(models.build("lenet5"), [], 0.0, TrainConfig(), 1, data={"x": 1})
    _save(tmp_path / "run", result, {"epochs": 1})
    _, meta = checkpoint.load(tmp_path / "run" / "model.pt")
    assert meta["extra"]["data"] == {"x": 1}


def test_capsnet_train_reads_the_params_files_data_section_as_capsnet_eval_does(tmp_path):
    """`capsnet train --params` trains smallNORB with the file's data.smallnorb (here crop 20,
    unstandardised) and records it; `capsnet eval` with the same file scores the model on
    the same images (the same accuracy), and with the built-in settings refuses it."""
    import json

    from click.testing import CliRunner

    from capsnet import config
    from capsnet.cli import main
    from capsnet.data import stages
    from capsnet.models import checkpoint

    params = tmp_path / "p.yaml"
    params.write_text(
        "data:\n  smallnorb:\n    source: synth\n    size: 24\n    crop: 20\n"
        "    standardize: false\n    synth: {side: 16, lightings: 1}\n"
    )
    root = tmp_path / "data"
    stages.download("smallnorb", config.load(params), root)
    stages.prepare("smallnorb", config.load(params), root)
    common = ["--device", "cpu", "--data-root", str(root)]
    args = ["train", "--model", "smallnorb-cnn", "--dataset", "smallnorb", "--epochs", "1"]
    args += ["--batch-size", "32", "--train-limit", "64", "--val-size", "0", "--test-limit", "40"]
    run = tmp_path / "run"
    trained = CliRunner().invoke(main, [*args, *common, "--params", str(params), "--out", str(run)])
    assert trained.exit_code == 0, trained.output
    model, meta = checkpoint.load(run / "model.pt")
    assert model.config.input_size == 20 and meta["extra"]["data"] == {"standardize": False}
    own = json.loads((run / "metrics.json").read_text())["smallnorb"]

    scored = tmp_path / "scored.json"
    args = ["eval", str(run / "model.pt"), "--dataset", "smallnorb", "--limit", "40", *common]
    same = CliRunner().invoke(main, [*args, "--params", str(params), "--out", str(scored)])
    assert same.exit_code == 0, same.output
    (entry,) = json.loads(scored.read_text()).values()
    assert entry["smallnorb"]["n"] == own["n"] == 40
    assert entry["smallnorb"]["accuracy"] == pytest.approx(own["accuracy"])
    default = tmp_path / "default.yaml"
    default.write_text("data:\n  smallnorb:\n    size: 24\n    crop: 20\n")
    refused = CliRunner().invoke(main, [*args, "--params", str(default)])
    assert refused.exit_code == 1 and "data.smallnorb.standardize" in refused.output


def test_capsnet_train_refuses_a_bad_params_file_before_writing_anything(tmp_path):
    """`capsnet train --params`: a missing file or a bad data setting is one line naming it,
    and the run directory is never made."""
    from clihelpers import assert_one_line_error, invoke_cli

    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  smallnorb:\n    crop: 64\n")  # larger than size 48
    out = tmp_path / "run"
    args = ["train", "--model", "lenet5", "--epochs", "1", "--device", "cpu", "--out", out]
    assert_one_line_error(invoke_cli(*args, "--params", bad), "bad.yaml", "crop")
    assert_one_line_error(invoke_cli(*args, "--params", tmp_path / "gone.yaml"), "gone.yaml")
    assert not out.exists()
