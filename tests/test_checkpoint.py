import os

import pytest
import torch

from capsnet import checkpoint, models
from capsnet.errors import CheckpointError


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


def test_truncated_file(tmp_path):
    path = checkpoint.save(tmp_path / "t.pt", models.build("lenet5"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or not a PyTorch checkpoint"):
        checkpoint.load(path)


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
    with pytest.raises(CheckpointError, match="refused to load"):
        checkpoint.load(path)
    assert not marker.exists()


def test_foreign_architecture(tmp_path):
    path = checkpoint.save(tmp_path / "f.pt", models.build("lenet5"))
    payload = torch.load(path, weights_only=True)
    payload["model_name"] = "capsnet-small"
    payload["model_config"] = models.make_config("capsnet-small").__dict__
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="weights do not fit model 'capsnet-small'"):
        checkpoint.load(path)


def test_plain_state_dict_is_not_a_capsnet_checkpoint(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save(models.build("lenet5").state_dict(), path)
    with pytest.raises(CheckpointError, match="not a capsnet checkpoint"):
        checkpoint.load(path)


def test_unknown_model_name_in_checkpoint(tmp_path):
    path = checkpoint.save(tmp_path / "u.pt", models.build("lenet5"))
    payload = torch.load(path, weights_only=True)
    payload["model_name"] = "resnet-9000"
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="unknown model 'resnet-9000'"):
        checkpoint.load(path)
