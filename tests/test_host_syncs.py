"""No host sync and no host-to-device copy per training step, counted without a GPU.

``fit`` runs on the meta device (model, resident data, every draw) under ``HostTraffic``,
which records each op a CUDA run would pay for on the host: a read of a device value
(``.item()``, ``.tolist()``, a copy to the CPU, a data-dependent shape such as
``nonzero``) and every copy of host data to the device (``torch.tensor(list,
device=...)``, ``.to(device)`` of a CPU tensor, a CPU tensor mixed into a device op).
What happens between the second and the last step marker of an epoch (the first step may
fill per-device caches) is per-step work: it must record nothing, on every registered
training set under every augmentation.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from capsnet import models
from capsnet.config import STRATEGIES
from capsnet.config.dataset_specs import TRAIN_DATASETS
from capsnet.training import fit as train

META = torch.device("meta")
aten = torch.ops.aten
PACKAGE = str(Path(train.__file__).parent)
#: ops that read a device value or a data-dependent size back to the host
SYNC_OPS = {
    aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten._unique2,
    aten.unique_dim, aten.unique_consecutive, aten._linalg_check_errors, aten.is_nonzero,
    aten.equal,
}  # fmt: skip
#: ops that index with a boolean mask: its count of True values is read on the host
MASK_INDEX_OPS = {aten.index, aten.index_put, aten.index_put_}
HOST_DATA_FACTORIES = {torch.tensor, torch.as_tensor, torch.Tensor.new_tensor}


def _where() -> str:
    """The innermost capsnet/ frame of the current stack: file:line."""
    frame = sys._getframe(1)
    while frame is not None and not frame.f_code.co_filename.startswith(PACKAGE):
        frame = frame.f_back
    if frame is None:
        return "outside capsnet/"
    path = Path(frame.f_code.co_filename).relative_to(Path(PACKAGE).parent)
    return f"{path}:{frame.f_lineno}"


def _on_device(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type != "cpu"


class HostTraffic:
    """Context manager recording (kind, op, where) for every host sync and host-to-device
    copy of ops on a non-CPU device; ``step`` counts ``mark_step`` calls (``fit``'s and
    ``predict``'s step markers) and each record carries the step it happened in. On the meta
    device a read returns ones, so training goes on past it."""

    def __init__(self):
        self.events: list[tuple[int, str, str, str]] = []
        self.step = 0
        traffic = self

        class Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return traffic._dispatch(func, args, kwargs or {})

        class Function(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func in HOST_DATA_FACTORIES:
                    traffic._factory(func, args, kwargs)
                return func(*args, **kwargs)

        self._modes = (Function(), Dispatch())

    def record(self, kind: str, op) -> None:
        self.events.append((self.step, kind, str(op), _where()))

    def mark_step(self) -> None:
        self.step += 1

    def between_steps(self, first: int, last: int) -> list[tuple[str, str, str]]:
        """The records after step marker ``first`` and before marker ``last``."""
        return [e[1:] for e in self.events if first <= e[0] < last]

    def _factory(self, func, args, kwargs) -> None:
        device = kwargs.get("device")
        if func is torch.Tensor.new_tensor and device is None:
            device = args[0].device
        data = args[1] if func is torch.Tensor.new_tensor else (args[0] if args else None)
        if device is None or torch.device(device).type == "cpu":
            return
        if isinstance(data, torch.Tensor) and data.device == torch.device(device):
            return
        self.record("host-to-device copy", func.__name__)

    def _dispatch(self, func, args, kwargs):
        packet = func.overloadpacket
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_device = [t for t in tensors if _on_device(t)]
        if packet is aten._to_copy:
            source, target = args[0].device, torch.device(kwargs.get("device") or args[0].device)
            return self._copy(func, source, target, args, kwargs, args[0])
        if packet is aten.copy_:
            return self._copy(func, args[1].device, args[0].device, args, kwargs, args[0])
        if on_device and packet in MASK_INDEX_OPS and any(
            t.dtype in (torch.bool, torch.uint8) for t in tree_leaves(args[1])
            if isinstance(t, torch.Tensor)
        ):  # fmt: skip
            self.record("host sync", f"{packet} with a boolean mask")
        elif on_device and packet in SYNC_OPS:
            self.record("host sync", packet)
            if packet is aten._local_scalar_dense and args[0].device == META:
                return True if args[0].dtype == torch.bool else 1
        elif on_device and any(t.device.type == "cpu" and t.dim() > 0 for t in tensors):
            self.record("host tensor in a device op", packet)
        return func(*args, **kwargs)

    def _copy(self, func, source, target, args, kwargs, like):
        if source.type == "cpu" and target.type != "cpu":
            self.record("host-to-device copy", func.overloadpacket)
        elif source.type != "cpu" and target.type == "cpu":
            self.record("host sync", func.overloadpacket)
            if source == META:  # the host reads ones
                dtype = kwargs.get("dtype") or like.dtype
                out = torch.ones(like.shape, dtype=dtype)
                return args[0].copy_(out) if func.overloadpacket is aten.copy_ else out
        return func(*args, **kwargs)

    def __enter__(self):
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class _MetaGenerator(torch.Generator):
    """torch.Generator for the meta device, which has none: a CPU generator (the meta
    kernels ignore it) that reports the meta device, as a CUDA generator reports CUDA."""

    def __new__(cls, device="cpu"):
        meta = torch.device(device).type == "meta"
        generator = super().__new__(cls, "cpu" if meta else device)
        generator._meta = meta
        return generator

    @property
    def device(self) -> torch.device:
        return META if self._meta else super().device


@pytest.fixture
def on_meta(monkeypatch):
    """``fit`` trains on the meta device with a device generator; a HostTraffic records
    it, its step counter driven by fit's step markers."""
    from capsnet.training import scoring

    traffic = HostTraffic()
    marker = train.mark_step

    def mark_step(device):
        traffic.mark_step()
        marker(device)

    monkeypatch.setattr(train, "select_device", lambda name="auto": META)
    monkeypatch.setattr(torch, "Generator", _MetaGenerator)
    for module in (train, scoring):
        monkeypatch.setattr(module, "mark_step", mark_step)
    return traffic


def _data_root(tmp_path: Path, n: int) -> Path:
    """A data root with ``n`` prepared MNIST training digits and smallNORB training images
    (random pixels): what every registered training set loads from."""
    from capsnet.data.store import save_prepared

    g = torch.Generator().manual_seed(0)
    root = tmp_path / "data"
    save_prepared(
        root / "prepared" / "mnist" / "train.pt",
        {
            "images": torch.randint(0, 256, (n, 28, 28), generator=g, dtype=torch.uint8),
            "labels": torch.arange(n) % 10,
        },
        dataset="mnist", split="train", count=n,
    )  # fmt: skip
    save_prepared(
        root / "prepared" / "smallnorb" / "train.pt",
        {
            "images": torch.randint(0, 256, (n, 2, 48, 48), generator=g, dtype=torch.uint8),
            "labels": torch.arange(n) % 5,
            "info": torch.zeros(n, 4, dtype=torch.int64),
        },
        dataset="smallnorb", split="train", size=48, count=n, source="smallnorb-synth",
    )  # fmt: skip
    return root


#: the model each training set is trained with here: its family's small variant, with a
#: decoder where the set reconstructs (MultiMNIST: each digit from its own capsule)
MODEL = {"smallnorb": ("em-capsnet-small", {})}
DEFAULT_MODEL = ("capsnet-small", {"decoder": True})
STEPS, BATCH = 3, 4


#: every training set once, every strategy on the set whose digits move with their merge
#: (the stacked path, which covers the plain one); smallNORB augments itself
CASES = sorted({(d, "none") for d in TRAIN_DATASETS} | {("multimnist", s) for s in STRATEGIES})


@pytest.mark.parametrize(("dataset", "strategy"), CASES)
def test_a_training_step_neither_syncs_nor_copies_from_the_host(
    on_meta, tmp_path, dataset, strategy
):
    model, overrides = MODEL.get(dataset, DEFAULT_MODEL)
    _assert_no_host_traffic(on_meta, tmp_path, dataset, strategy, model, overrides)


def _assert_no_host_traffic(traffic, tmp_path, dataset, strategy, model, overrides) -> None:
    """Train ``model`` on ``STEPS`` batches of ``dataset`` through ``train_run`` on the meta
    device; nothing recorded between the second and the last step marker."""
    from capsnet.training.run import RunSpec, train_run

    config = train.TrainConfig(
        epochs=1, batch_size=BATCH, progress=False, amp="fp32", compile=False
    )
    spec = RunSpec(
        model, config, overrides, dataset, train_size=None, val_size=0,
        augment=strategy, data_root=_data_root(tmp_path, STEPS * BATCH),
    )  # fmt: skip
    with traffic:
        result = train_run(spec, to_cpu=False)
    assert next(result.model.parameters()).device == META
    assert traffic.step == STEPS
    per_step = traffic.between_steps(2, STEPS)  # the first step may fill device caches
    assert not per_step, "per training step:\n" + "\n".join(
        f"  {kind}: {op} at {where} ({n}x)" for (kind, op, where), n in Counter(per_step).items()
    )


def _other_model_classes() -> list[str]:
    """One registered model of each class the training sets above do not train."""
    covered = {models.spec(name).model_cls for name, _ in [*MODEL.values(), DEFAULT_MODEL]}
    first = {}
    for name in models.names():
        first.setdefault(models.spec(name).model_cls, name)
    return [name for cls, name in first.items() if cls not in covered]


@pytest.mark.parametrize("name", _other_model_classes())
def test_no_other_model_syncs_or_copies_from_the_host_in_a_training_step(on_meta, tmp_path, name):
    """The other model classes (the conv-net baselines), trained on MNIST with shifts."""
    _assert_no_host_traffic(on_meta, tmp_path, "mnist", "shift", name, {})
