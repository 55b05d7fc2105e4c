import os
import pickle
import time
import warnings
import zipfile

import numpy as np
import pytest
import torch
from clihelpers import assert_one_line_error, invoke_cli
from torch import nn

from capsnet import models
from capsnet.io.errors import CapsnetError, CheckpointError
from capsnet.models import checkpoint
from capsnet.models.capsnet import CapsNet


def test_round_trip_carries_config_and_metadata(tmp_path):
    torch.manual_seed(0)
    model = models.build("capsnet-small", routing_iterations=4)
    path = checkpoint.save(
        tmp_path / "c.pt",
        model,
        train_config={"epochs": 3},
        metrics={"mnist": {"accuracy": 0.5, "n": 10}},
    )
    loaded, meta = checkpoint.load(path)
    assert meta["model_name"] == "capsnet-small"
    assert loaded.config == model.config
    assert meta["train_config"] == {"epochs": 3}
    assert meta["metrics"]["mnist"]["n"] == 10
    assert meta["capsnet_version"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key])
    assert not loaded.training


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path):
    model = models.build("lenet5")
    checkpoint.save(tmp_path / "a.pt", model)
    checkpoint.save(tmp_path / "a.pt", model)  # overwrite in place
    assert sorted(os.listdir(tmp_path)) == ["a.pt"]


def test_save_failure_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = checkpoint.save(tmp_path / "a.pt", models.build("lenet5"))
    before = path.read_bytes()

    def broken_save(obj, fh):
        fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(path, models.build("lenet5"))
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["a.pt"]


def test_saved_file_mode_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = checkpoint.save(tmp_path / "m.pt", models.build("lenet5"))
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        checkpoint.load(tmp_path / "nope.pt")


@pytest.mark.parametrize("fraction", [0.001, 0.5, 0.99])
def test_truncated_file(tmp_path, fraction):
    path = checkpoint.save(tmp_path / "t.pt", models.build("lenet5"))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(CheckpointError, match=r"t\.pt: truncated: the zip archive ends"):
        checkpoint.load(path)


def test_truncated_legacy_format(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.zeros(100)}, path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(CheckpointError, match=r"legacy\.pt: truncated: the file ends early"):
        checkpoint.load(path)


def test_damaged_member_fails_its_crc(tmp_path):
    path = checkpoint.save(tmp_path / "d.pt", models.build("lenet5"))
    with zipfile.ZipFile(path) as archive:
        biggest = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    start = biggest.header_offset + 30 + len(biggest.filename.encode()) + len(biggest.extra)
    data[start + biggest.file_size // 2] ^= 0xFF  # one bit pattern flipped inside the weights
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"damaged: member {biggest.filename} fails"):
        checkpoint.load(path)


@pytest.mark.parametrize(
    "content, reason",
    [
        (bytes(range(7, 256)) * 20, "unknown bytes, neither a zip archive nor a pickle"),
        (b"model: capsnet\nepochs: 3\n", "a text file"),
        (b"", "an empty file"),
        (b"\x80\x00" + bytes(100), "unknown bytes"),
    ],
    ids=["random", "text", "empty", "pickle-like"],
)
def test_not_a_checkpoint_at_all(tmp_path, content, reason):
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(path)
    assert str(info.value).startswith(f"{path}: not a capsnet checkpoint: {reason}")
    assert "Python objects" not in str(info.value)


class _Scripted(nn.Module):
    def forward(self, x):
        return x + 1


def test_torchscript_archive_is_foreign_without_torch_hint(tmp_path):
    path = tmp_path / "scripted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated; its archives still exist
        torch.jit.save(torch.jit.script(_Scripted()), path)
    with pytest.raises(CheckpointError, match="not a capsnet checkpoint: a TorchScript") as info:
        checkpoint.load(path)
    assert "weights_only" not in str(info.value)


def test_numpy_files_are_foreign(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3))
    np.savez(tmp_path / "b.npz", a=np.zeros(3))
    with pytest.raises(CheckpointError, match=r"not a capsnet checkpoint: a NumPy \.npy array"):
        checkpoint.load(tmp_path / "a.npy")
    with pytest.raises(CheckpointError, match=r"not a capsnet checkpoint: a NumPy \.npz archive"):
        checkpoint.load(tmp_path / "b.npz")


class _Payload:
    """Unpickling this runs code: it must never happen when loading a checkpoint."""

    marker = None

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickle_payload_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "payload-ran"
    _Payload.marker = marker
    path = tmp_path / "evil.pt"
    torch.save({"format": "capsnet-checkpoint", "evil": _Payload()}, path)
    with pytest.raises(CheckpointError, match="refused: it carries Python objects"):
        checkpoint.load(path)
    assert not marker.exists()


class _Custom:
    """A harmless class: still refused, since a checkpoint holds no Python objects."""


def test_custom_class_is_refused(tmp_path):
    path = checkpoint.save(tmp_path / "c.pt", models.build("lenet5"))
    payload = torch.load(path, weights_only=True)
    payload["metrics"] = {"mnist": _Custom()}
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"refused: it carries Python objects \(.*_Custom\)"):
        checkpoint.load(path)


def test_plain_python_pickle_is_never_unpickled(tmp_path):
    marker = tmp_path / "payload-ran"
    _Payload.marker = marker
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps({"evil": _Payload()}, protocol=4))
    with pytest.raises(CheckpointError, match="not a capsnet checkpoint: a plain Python pickle"):
        checkpoint.load(path)
    assert not marker.exists()


def test_foreign_architecture(tmp_path):
    path = checkpoint.save(tmp_path / "f.pt", models.build("lenet5"))
    payload = torch.load(path, weights_only=True)
    payload["model_name"] = "capsnet-small"
    payload["model_config"] = models.make_config("capsnet-small").__dict__
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="asks model 'capsnet-small' for 1,280,720 weights"):
        checkpoint.load(path)


def test_plain_state_dict_is_not_a_capsnet_checkpoint(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save(models.build("lenet5").state_dict(), path)
    with pytest.raises(CheckpointError, match="not a capsnet checkpoint: a plain state_dict of 10"):
        checkpoint.load(path)


def test_other_programs_checkpoint(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"epoch": 3, "state_dict": models.build("lenet5").state_dict()}, path)
    with pytest.raises(CheckpointError, match="no 'capsnet-checkpoint' header; keys: epoch"):
        checkpoint.load(path)


def test_unknown_model_name_in_checkpoint(tmp_path):
    path = checkpoint.save(tmp_path / "u.pt", models.build("lenet5"))
    payload = torch.load(path, weights_only=True)
    payload["model_name"] = "resnet-9000"
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="unknown model 'resnet-9000'"):
        checkpoint.load(path)


def _edited(tmp_path, name="lenet5", **changes):
    """A saved checkpoint of ``name`` with header entries replaced by ``changes``."""
    path = checkpoint.save(tmp_path / "e.pt", models.build(name))
    payload = torch.load(path, weights_only=True)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(payload.get(key), dict):
            payload[key] = {**payload[key], **value}
        else:
            payload[key] = value
    torch.save(payload, path)
    return path


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model_name": 5}, "model_name is an int, expected a string"),
        ({"format_version": "1"}, "format version '1' is not supported"),
        ({"model_config": [1, 2]}, "'model_config' is a list, expected a dict"),
        ({"metrics": [0.5]}, "'metrics' is a list, expected a dict"),
        ({"train_config": "epochs=3"}, "'train_config' is a str, expected a dict"),
        ({"capsnet_version": 1}, "'capsnet_version' is an int, expected a str"),
        ({"metrics": {"w": torch.zeros(2)}}, "'metrics' holds values other than"),
        (
            {"model_config": {"input_size": "28"}},
            "model_config.input_size = '28' is not a valid int",
        ),
        (
            {"model_config": {"input_size": 28.0}},
            "model_config.input_size = 28.0 is not a valid int",
        ),
        ({"model_config": {"num_classes": True}}, "model_config.num_classes = True is not a valid"),
        ({"model_config": {"input_size": 2**70}}, "model_config.input_size = 11805916"),
        ({"model_config": {"depth": 3}}, "has no config field(s) depth"),
        ({"state_dict": {"fc3.bias": [0.0] * 10}}, "state_dict entry 'fc3.bias' is a list"),
    ],
)
def test_badly_typed_header(tmp_path, changes, message):
    path = _edited(tmp_path, **changes)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(path)
    assert str(info.value).startswith(f"{path}: "), info.value
    assert message in str(info.value)


def test_non_finite_config_float_is_refused(tmp_path):
    path = _edited(tmp_path, "baseline-cnn", model_config={"dropout": float("nan")})
    with pytest.raises(CheckpointError, match=r"model_config.dropout = nan is not a valid float"):
        checkpoint.load(path)


def test_config_rejected_by_its_dataclass(tmp_path):
    path = _edited(tmp_path, model_config={"input_size": 4})
    with pytest.raises(CheckpointError, match="input_size must be >= 12 for LeNet5"):
        checkpoint.load(path)


@pytest.fixture
def no_real_capsnet(monkeypatch):
    """CapsNet may be built on the meta device only: a real build fails the test."""
    init = CapsNet.__init__

    def guarded(self, config):
        assert torch.get_default_device().type == "meta", "a CapsNet was built for real"
        init(self, config)

    monkeypatch.setattr(CapsNet, "__init__", guarded)


def test_huge_config_with_tiny_weights_fails_fast_without_building(tmp_path, no_real_capsnet):
    with torch.device("meta"):
        model = models.build("capsnet-small")
    payload = {
        "format": checkpoint.FORMAT,
        "format_version": checkpoint.FORMAT_VERSION,
        "model_name": "capsnet-small",
        "model_config": {**vars(model.config), "conv_channels": 10**6, "primary_types": 10**4},
        "state_dict": {"conv1.weight": torch.zeros(4, 1, 9, 9)},
    }
    path = tmp_path / "huge.pt"
    torch.save(payload, path)
    assert path.stat().st_size < 4096
    start = time.perf_counter()
    with pytest.raises(
        CheckpointError, match=r"asks model 'capsnet-small' for [\d,]{17,} weights "
    ):
        checkpoint.load(path)
    assert time.perf_counter() - start < 5.0


def test_config_too_big_for_torch_is_one_error(tmp_path, request):
    path = _edited(tmp_path, "capsnet-small", model_config={"conv_channels": 2**62})
    request.getfixturevalue("no_real_capsnet")
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(path)
    assert "capsnet-small" in str(info.value)


def test_missing_and_mismatched_weights_are_named(tmp_path):
    path = checkpoint.save(tmp_path / "w.pt", models.build("lenet5"))
    payload = torch.load(path, weights_only=True)
    payload["state_dict"]["fc3.weight"] = torch.zeros(84, 10)
    payload["state_dict"]["extra.weight"] = torch.zeros(5000)
    del payload["state_dict"]["fc3.bias"]
    torch.save(payload, path)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(path)
    message = str(info.value)
    assert "missing fc3.bias" in message
    assert "unexpected extra.weight" in message
    assert "shape mismatch in fc3.weight" in message


def test_dtype_mismatch_is_named(tmp_path):
    path = checkpoint.save(tmp_path / "w.pt", models.build("lenet5"))
    payload = torch.load(path, weights_only=True)
    payload["state_dict"]["fc3.bias"] = payload["state_dict"]["fc3.bias"].double()
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"dtype mismatch in fc3\.bias"):
        checkpoint.load(path)


def test_expanded_view_cannot_claim_more_than_it_stores(tmp_path):
    path = checkpoint.save(tmp_path / "v.pt", models.build("lenet5"))
    payload = torch.load(path, weights_only=True)
    payload["state_dict"]["fc1.weight"] = torch.zeros(1).expand(120, 400)  # stride (0, 0)
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"weight fc1\.weight claims 48,000 values"):
        checkpoint.load(path)


def test_non_finite_weights_are_refused(tmp_path):
    model = models.build("lenet5")
    with torch.no_grad():
        model.fc2.bias[3] = float("nan")
    path = checkpoint.save(tmp_path / "n.pt", model)
    with pytest.raises(CheckpointError, match=r"weight fc2\.bias holds NaN or infinite values"):
        checkpoint.load(path)


def test_every_error_is_a_capsnet_error_naming_the_file(tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(CapsnetError, match=f"^{path}: "):
        checkpoint.load(path)


def test_cli_eval_bad_checkpoints_one_line_exit_1(tmp_path, monkeypatch):
    """In this process (tests/test_core_cli.py runs an exit 1 through the real entry
    point)."""
    monkeypatch.chdir(tmp_path)  # no params.yaml
    scripted = tmp_path / "scripted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(_Scripted()), scripted)
    huge = _edited(tmp_path, "lenet5", model_config={"input_size": 10**6})
    cases = [(scripted, "TorchScript"), (huge, "weights but the file holds")]
    for path, fragment in cases:
        result = invoke_cli("eval", path)
        assert_one_line_error(result, path.name, fragment)
        assert result.returncode == 1
        assert "weights_only" not in result.stderr


class _MetaFills(torch.overrides.TorchFunctionMode):
    """Records the weight fills asked of meta tensors."""

    def __init__(self):
        super().__init__()
        self.fills = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        name = getattr(func, "__name__", "")
        if name in ("normal_", "uniform_") and any(t.is_meta for t in tensors):
            self.fills.append(name)
        return func(*args, **kwargs)


@pytest.mark.parametrize("name", ["capsnet-small", "em-capsnet-small"])
def test_the_meta_model_that_checks_a_file_fills_no_weights(tmp_path, name):
    """The meta-device build that checks a file's weights draws no initial values (normal_
    on meta tensors runs a Python reference kernel that imports torch._dynamo, about 2 CPU-s
    a process); the model built for the weights is initialised as always."""
    path = checkpoint.save(tmp_path / "m.pt", models.build(name))
    with _MetaFills() as recorded:
        model, _ = checkpoint.load(path)
    assert recorded.fills == []
    assert all(not p.is_meta for p in model.parameters())
