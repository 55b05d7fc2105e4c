"""Prepared files are checked when loaded: keys, dtypes, shapes, value ranges and meta.

Every malformed file fails through the loader a user runs, in one line naming the file,
what is wrong and the command that rebuilds it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from clihelpers import assert_one_line_error, invoke_cli
from datahelpers import write_affnist_mirror, write_smallnorb_raw, write_tiny_mnist

from capsnet import models
from capsnet.config.dataset_specs import PREPARES
from capsnet.data import affnist, load, mnist, multimnist, smallnorb
from capsnet.data.store import load_prepared, prepared_spec, save_prepared
from capsnet.io.errors import DataError
from capsnet.models import checkpoint

SPLIT = "test"


@pytest.fixture(scope="module")
def good_root(tmp_path_factory) -> Path:
    """A data root with every dataset prepared by its real prepare function, tiny."""
    base = tmp_path_factory.mktemp("prepared")
    root = base / "data"
    prepared = root / "prepared"
    write_tiny_mnist(root / "raw" / "mnist")
    mnist.prepare(root / "raw" / "mnist", prepared / "mnist")
    multimnist.build(
        root, prepared / "multimnist", seed=0, shift=2, pad=2, merge="sum-clip",
        train_pairs_per_digit=2, test_pairs_per_digit=2,
    )  # fmt: skip
    affnist.build_synth(root, prepared / "affnist-synth", seed=0)
    mirror = write_affnist_mirror(base / "mirror", per_batch=1)
    affnist.prepare(mirror / "staging", prepared / "affnist")
    write_smallnorb_raw(root / "raw" / "smallnorb", n=10)
    smallnorb.prepare(root / "raw" / "smallnorb", prepared / "smallnorb", size=48)
    return root


@pytest.fixture
def root(good_root, tmp_path) -> Path:
    """A fresh copy of the good root, for a test to damage."""
    return Path(shutil.copytree(good_root, tmp_path / "data"))


def load_dataset(name: str, root: Path):
    """What training and evaluation do: the dataset by name, no download."""
    options = {} if name == "smallnorb" else {"download": False}
    return load(name, SPLIT, root, **options)


def prepared_file(root: Path, name: str) -> Path:
    return root / "prepared" / name / f"{SPLIT}.pt"


def rewrite(root: Path, name: str, change) -> Path:
    """Apply ``change(tensors, meta)`` to the prepared file of ``name``; returns its path."""
    path = prepared_file(root, name)
    payload = torch.load(path, weights_only=True)
    tensors, meta = payload["tensors"], payload["meta"]
    change(tensors, meta)
    save_prepared(path, tensors, **meta)
    return path


def assert_names_file_and_fix(error: DataError, path: Path, name: str, *fragments: str) -> None:
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, message
    root = path.parent.parent.parent
    assert message.endswith(f"; rebuild it with `capsnet data prepare {name} --data-root {root}`")


def test_every_prepared_file_fits_its_spec(good_root):
    for name in PREPARES:
        spec = prepared_spec(name)
        for path in sorted((good_root / "prepared" / name).glob("*.pt")):
            tensors, _ = load_prepared(path)  # checked against the registry's spec
            assert set(tensors) >= {k for k, s in spec.tensors.items() if s.required}
        assert len(load_dataset(name, good_root)) > 0


def _set(key, value):
    def change(tensors, meta):
        tensors[key] = value(tensors[key]) if callable(value) else value

    return change


def _drop(key):
    return lambda tensors, meta: tensors.pop(key)


def _meta(key, value):
    def change(tensors, meta):
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value

    return change


CASES = [
    ("mnist", _drop("labels"), ["tensor 'labels' is missing"]),
    ("mnist", _set("images", lambda t: t.float()), ["tensor 'images' is float32, expected uint8"]),
    ("mnist", _set("labels", lambda t: t.int()), ["tensor 'labels' is int32, expected int64"]),
    ("mnist", _set("images", lambda t: t[:, :, :27]), ["has shape (40, 28, 27)", "(40, 28, 28)"]),
    ("mnist", _set("labels", lambda t: t[:-1]), ["tensor 'labels' has shape (39,)", "(40,)"]),
    ("mnist", _set("labels", lambda t: t.clone().fill_(10)), ["'labels' holds 10, outside 0..9"]),
    ("mnist", _set("labels", lambda t: t - 1), ["'labels' holds -1, outside 0..9"]),
    ("mnist", _meta("dataset", "affnist"), ["it holds 'affnist' data, not 'mnist'"]),
    (
        "affnist",
        _set("images", lambda t: t[:, :28, :28]),
        ["has shape (32, 28, 28)", "(32, 40, 40)"],
    ),
    ("affnist", _set("labels", lambda t: t + 10), ["'labels' holds 10, outside 0..9"]),
    (
        "affnist-synth",
        _set("affine", lambda t: t.double()),
        ["'affine' is float64, expected float32"],
    ),
    ("affnist-synth", _drop("images"), ["tensor 'images' is missing"]),
    (
        "smallnorb",
        _set("images", lambda t: t[:, :1]),
        ["has shape (10, 1, 48, 48)", "(10, 2, 48, 48)"],
    ),
    ("smallnorb", _set("labels", lambda t: t + 1), ["'labels' holds 5, outside 0..4"]),
    ("smallnorb", _drop("info"), ["tensor 'info' is missing"]),
    ("smallnorb", _set("info", lambda t: t[:, :3]), ["tensor 'info' has shape (10, 3)", "(10, 4)"]),
    (
        "smallnorb",
        _set("info", lambda t: t.index_fill(1, torch.tensor([2]), 36)),
        ["'info' column 2 (azimuth) holds 36, outside 0..34"],
    ),
    ("multimnist", _set("shifts", lambda t: t * 3), ["'shifts' holds", "outside -2..2"]),
    ("multimnist", _set("pairs", lambda t: t - 1), ["'pairs' holds -1, outside 0.."]),
    ("multimnist", _set("pairs", lambda t: t[:, :1]), ["tensor 'pairs' has shape (80, 1)"]),
    ("multimnist", _meta("shift", None), ["meta field 'shift' is missing"]),
    ("multimnist", _meta("shift", "2"), ["meta shift = '2' is not an int"]),
    ("multimnist", _meta("merge", "mean"), ["meta merge = 'mean' is not one of"]),
    ("multimnist", _set("pairs", lambda t: t + 1000), ["recipe indexes past the 40 MNIST test"]),
]


@pytest.mark.parametrize(
    "name, change, fragments", CASES, ids=[f"{c[0]}-{c[2][0][:28]}" for c in CASES]
)
def test_malformed_file_is_one_line_naming_file_and_fix(root, name, change, fragments):
    path = rewrite(root, name, change)
    with pytest.raises(DataError) as info:
        load_dataset(name, root)
    assert_names_file_and_fix(info.value, path, name, *fragments)


def test_empty_file_holds_no_items(root):
    path = rewrite(
        root, "mnist", lambda t, m: t.update(images=t["images"][:0], labels=t["labels"][:0])
    )
    with pytest.raises(DataError) as info:
        load_dataset("mnist", root)
    assert_names_file_and_fix(info.value, path, "mnist", "it holds no items (N = 0)")


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"\x00\x01\x02 not a file of tensors" * 10, "not a prepared data file: unknown bytes"),
        (b"", "not a prepared data file: an empty file"),
        ("truncated", "truncated: the zip archive ends before its directory"),
        (torch.zeros(3), "not a prepared data file (no 'tensors' dict)"),
        ({"tensors": {"images": [1, 2]}, "meta": {}}, "tensors entry 'images' is a list"),
        (
            {"tensors": {"images": torch.zeros(1, dtype=torch.uint8).expand(10**6, 28, 28)}},
            "tensor 'images' claims 784,000,000 values that the file does not hold",
        ),
    ],
    ids=["random", "empty", "truncated", "bare-tensor", "list-entry", "expanded-view"],
)
def test_unreadable_file(root, content, fragment):
    path = prepared_file(root, "mnist")
    if content == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(DataError) as info:
        load_dataset("mnist", root)
    assert_names_file_and_fix(info.value, path, "mnist", fragment)


def test_missing_smallnorb_file_names_the_command(root):
    path = prepared_file(root, "smallnorb")
    path.unlink()
    with pytest.raises(DataError) as info:
        load_dataset("smallnorb", root)
    assert_names_file_and_fix(info.value, path, "smallnorb", "prepared file not found")


def test_damaged_real_affnist_is_an_error_not_a_fallback(root):
    path = rewrite(root, "affnist", _set("labels", lambda t: t + 10))
    with pytest.raises(DataError) as info:
        affnist.evaluation_set(root)
    assert_names_file_and_fix(info.value, path, "affnist", "'labels' holds")


def test_cli_eval_on_a_bad_prepared_file_one_line_exit_1(root, tmp_path, monkeypatch):
    path = rewrite(root, "mnist", _set("labels", lambda t: t + 20))
    model = checkpoint.save(tmp_path / "lenet5.pt", models.build("lenet5"))
    monkeypatch.chdir(tmp_path)
    result = invoke_cli("eval", model, "--dataset", "mnist", "--data-root", root)
    assert_one_line_error(result, str(path), "outside 0..9", "capsnet data prepare mnist")
    assert result.returncode == 1
