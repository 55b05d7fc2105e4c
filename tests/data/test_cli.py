"""`capsnet data ...`: every bad input ends in one line naming the file or key, a non-zero
exit, and no output left behind."""

from __future__ import annotations

import gzip
import zipfile

import numpy as np
import pytest
import torch
from datahelpers import files_under, write_affnist_mirror, write_smallnorb_raw

from capsnet.data import affnist, mnist
from capsnet.data.formats import write_idx


def params_file(tmp_path, text: str = ""):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def assert_one_line_failure(result, *needles: str):
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    monkeypatch.setattr(mnist, "OFFICIAL_BASES", (str(tmp_path / "no-official") + "/",))
    monkeypatch.setattr(affnist, "OFFICIAL_BASE", str(tmp_path / "no-official") + "/")
    monkeypatch.delenv("CAPSNET_MIRROR", raising=False)


def test_prepare_mnist_ok(cli, tiny_root, tmp_path):
    result = cli(
        "data", "prepare", "mnist", "--data-root", tiny_root, "--params", params_file(tmp_path)
    )
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tiny_root / "prepared" / "mnist").iterdir()) == [
        "test.pt",
        "train.pt",
    ]


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-300])


def _wrong_magic(path):
    write_idx(path, torch.zeros(60, dtype=torch.uint8))  # a label file where images belong


def _count_mismatch(path):
    write_idx(path.with_name("train-labels-idx1-ubyte.gz"), torch.zeros(59, dtype=torch.uint8))


def _label_out_of_range(path):
    write_idx(
        path.with_name("train-labels-idx1-ubyte.gz"), torch.full((60,), 12, dtype=torch.uint8)
    )


@pytest.mark.parametrize(
    ("damage", "needles"),
    [
        (_truncate, ["train-images-idx3-ubyte.gz", "truncated or corrupt gzip"]),
        (_wrong_magic, ["train-images-idx3-ubyte.gz", "IDX magic 2049, expected 2051"]),
        (_count_mismatch, ["train-images-idx3-ubyte.gz", "60 images but 59 labels"]),
        (_label_out_of_range, ["train-labels-idx1-ubyte.gz", "label 12 out of range"]),
    ],
)
def test_bad_mnist_files(cli, tiny_root, tmp_path, damage, needles):
    damage(tiny_root / "raw" / "mnist" / "train-images-idx3-ubyte.gz")
    result = cli(
        "data", "prepare", "mnist", "--data-root", tiny_root, "--params", params_file(tmp_path)
    )
    assert_one_line_failure(result, *needles)
    assert not (tiny_root / "prepared").exists() or not files_under(tiny_root / "prepared")


def test_md5_mismatch_on_download(cli, tmp_path, no_network):
    mirror = tmp_path / "mirror" / "mnist"
    mirror.mkdir(parents=True)
    for name in mnist.RAW_MD5:
        (mirror / f"{name}.gz").write_bytes(gzip.compress(b"not mnist"))
    result = cli(
        "data",
        "download",
        "mnist",
        "--data-root",
        tmp_path / "data",
        "--mirror",
        tmp_path / "mirror",
        "--params",
        params_file(tmp_path),
    )
    assert_one_line_failure(result, "train-images-idx3-ubyte.gz", "MD5 mismatch", "CAPSNET_MIRROR")
    assert not files_under(tmp_path / "data")


def test_mnist_download_from_mirror(cli, tmp_path, mnist_mirror, no_network):
    result = cli(
        "data",
        "download",
        "mnist",
        "--data-root",
        tmp_path / "data",
        "--mirror",
        mnist_mirror,
        "--params",
        params_file(tmp_path),
    )
    assert result.exit_code == 0, result.stderr
    assert len(files_under(tmp_path / "data" / "raw" / "mnist")) == 4


REAL = "data:\n  affnist:\n    source: real\n"


def test_corrupt_zip_download(cli, tmp_path, no_network):
    mirror = write_affnist_mirror(tmp_path / "mirror", batches=2)
    archive = mirror / "affnist" / "test_batches.zip"
    data = bytearray(archive.read_bytes())
    data[60:70] = b"\0" * 10
    archive.write_bytes(bytes(data))
    result = cli(
        "data",
        "download",
        "affnist",
        "--data-root",
        tmp_path / "data",
        "--mirror",
        mirror,
        "--params",
        params_file(tmp_path, REAL),
    )
    assert_one_line_failure(result, "test_batches.zip", "corrupt zip")
    assert not files_under(tmp_path / "data")


def test_zip_slip_download(cli, tmp_path, no_network):
    mirror = tmp_path / "mirror" / "affnist"
    mirror.mkdir(parents=True)
    with zipfile.ZipFile(mirror / "test_batches.zip", "w") as archive:
        archive.writestr("test_batches/1.mat", b"x")
        archive.writestr("../../evil.mat", b"x")
    result = cli(
        "data",
        "download",
        "affnist",
        "--data-root",
        tmp_path / "data",
        "--mirror",
        tmp_path / "mirror",
        "--params",
        params_file(tmp_path, REAL),
    )
    assert_one_line_failure(
        result, "test_batches.zip", "'../../evil.mat'", "would be extracted outside"
    )
    assert not list(tmp_path.rglob("evil.mat"))
    assert not list((tmp_path / "data").rglob("*.mat"))


def test_mat_without_affnist_fields(cli, tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    raw = tmp_path / "data" / "raw" / "affnist" / "test_batches"
    raw.mkdir(parents=True)
    for k in range(1, 33):
        scipy_io.savemat(raw / f"{k}.mat", {"affNISTdata": {"pixels": np.zeros((1600, 1))}})
    result = cli(
        "data",
        "prepare",
        "affnist",
        "--data-root",
        tmp_path / "data",
        "--params",
        params_file(tmp_path, REAL),
    )
    assert_one_line_failure(result, "1.mat", "affNISTdata lacks field(s) image, label_int")
    assert not (tmp_path / "data" / "prepared").exists()


def test_smallnorb_header_dims_disagree(cli, tmp_path):
    raw = write_smallnorb_raw(tmp_path / "data" / "raw" / "smallnorb", n=4, side=8)
    from capsnet.data import smallnorb

    path = raw / smallnorb.filename("train", "dat")
    payload = bytearray(gzip.decompress(path.read_bytes()))
    payload[8:12] = (5).to_bytes(4, "little")
    path.write_bytes(gzip.compress(bytes(payload)))
    result = cli(
        "data",
        "prepare",
        "smallnorb",
        "--data-root",
        tmp_path / "data",
        "--params",
        params_file(tmp_path, "data:\n  smallnorb:\n    enabled: true\n    size: 8\n    crop: 8\n"),
    )
    assert_one_line_failure(result, "training-dat.mat.gz", "header dims [5, 2, 8, 8]")
    assert not (tmp_path / "data" / "prepared").exists()


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("data:\n  cifar:\n    enabled: true\n", ["params.yaml: data.cifar: unknown key"]),
        ("augment:\n  strategy: blur\n", ["params.yaml: augment.strategy: 'blur' unknown"]),
        (
            "data:\n  multimnist:\n    shift: -2\n",
            ["params.yaml: data.multimnist.shift: must be >= 0, got -2"],
        ),
    ],
)
def test_bad_params(cli, tiny_root, tmp_path, text, needles):
    result = cli(
        "data",
        "prepare",
        "multimnist",
        "--data-root",
        tiny_root,
        "--params",
        params_file(tmp_path, text),
    )
    assert_one_line_failure(result, *needles)
    assert not (tiny_root / "prepared").exists()


def test_unknown_dataset_argument(cli, tmp_path):
    result = cli("data", "prepare", "cifar", "--data-root", tmp_path)
    assert result.exit_code != 0 and "cifar" in result.stderr


@pytest.mark.parametrize(
    ("dataset", "extra"),
    [
        ("multimnist", []),
        ("rotated-mnist", ["--angle", "35"]),
        ("affnist-synth", []),
        ("mnist", ["--augment", "elastic"]),
        ("expanded-mnist", ["--split", "train"]),
    ],
)
def test_show_writes_png(cli, tiny_root, tmp_path, dataset, extra):
    pytest.importorskip("matplotlib")
    mnist.prepare(tiny_root / "raw" / "mnist", tiny_root / "prepared" / "mnist")
    out = tmp_path / f"{dataset}.png"
    result = cli(
        "data",
        "show",
        dataset,
        "--out",
        out,
        "--data-root",
        tiny_root,
        "--count",
        "6",
        "--params",
        params_file(tmp_path),
        *extra,
    )
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_old_root_spelling_works_and_help_shows_data_root(cli, tiny_root, tmp_path):
    result = cli("data", "prepare", "mnist", "--root", tiny_root, "--params", params_file(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert (tiny_root / "prepared" / "mnist" / "train.pt").is_file()
    shown = cli("data", "prepare", "--help").stdout
    assert "--data-root DIRECTORY" in shown and "--root" not in shown
    assert "env var: CAPSNET_DATA; default: data" in " ".join(shown.split())


def test_data_root_from_the_environment(cli, tiny_root, tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSNET_DATA", str(tiny_root))
    result = cli("data", "prepare", "mnist", "--params", params_file(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert (tiny_root / "prepared" / "mnist" / "test.pt").is_file()


def test_mirror_from_params_then_environment_then_option(
    cli, tmp_path, mnist_mirror, no_network, monkeypatch
):
    """data.mirror is used when neither --mirror nor $CAPSNET_MIRROR is set; each of those
    wins over it (an empty mirror fails naming itself)."""
    params = params_file(tmp_path, f"data:\n  mirror: {mnist_mirror}\n")
    empty = tmp_path / "empty-mirror"

    def download(root, *extra):
        args = ("data", "download", "mnist", "--data-root", tmp_path / root, "--params", params)
        return cli(*args, *extra)

    result = download("from-params")
    assert result.exit_code == 0, result.stderr
    assert len(files_under(tmp_path / "from-params" / "raw" / "mnist")) == 4
    monkeypatch.setenv("CAPSNET_MIRROR", str(empty))
    assert_one_line_failure(download("from-env"), str(empty))
    monkeypatch.setenv("CAPSNET_MIRROR", str(mnist_mirror))
    assert_one_line_failure(download("from-option", "--mirror", empty), str(empty))


@pytest.mark.parametrize("verb", ["download", "prepare"])
def test_a_switched_off_data_stage_does_not_import_torch(tmp_path, verb):
    """A data stage that only writes DISABLED.txt costs no torch import (3-5 CPU-s in each
    `dvc repro`)."""
    import subprocess
    import sys

    (tmp_path / "params.yaml").write_text("data:\n  smallnorb:\n    enabled: false\n")
    code = (
        "import sys\nfrom capsnet.cli import main\n"
        f"sys.argv = ['capsnet', 'data', '{verb}', 'smallnorb', '--data-root', 'data']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    folder = "raw" if verb == "download" else "prepared"
    assert (tmp_path / "data" / folder / "smallnorb" / "DISABLED.txt").is_file()


def test_show_affnist_falls_back_to_the_stand_in_as_eval_does(cli, tiny_root, tmp_path, no_network):
    """No real affNIST here and no network: `capsnet eval --dataset affnist` scores
    affnist-synth; `capsnet data show affnist` shows it too, and says so."""
    pytest.importorskip("matplotlib")
    mnist.prepare(tiny_root / "raw" / "mnist", tiny_root / "prepared" / "mnist")
    out = tmp_path / "affnist.png"
    result = cli("data", "show", "affnist", "--out", out, "--data-root", tiny_root, "--count", "4",
                 "--params", params_file(tmp_path))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "real affNIST not prepared" in result.stdout
    assert "showing affnist-synth, the stand-in `capsnet eval` scores instead" in result.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_show_smallnorb_names_the_classes_and_the_stand_in(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from capsnet import config
    from capsnet.data import show as shown
    from capsnet.data import stages

    root = tmp_path / "data"
    write_smallnorb_raw(root / "raw" / "smallnorb", n=10, side=48)
    params = config.Params(data=config.DataParams(smallnorb=config.SmallnorbParams(enabled=True)))
    stages.prepare("smallnorb", params, root)
    labels, titles = [], []
    real_label = shown._label
    monkeypatch.setattr(shown, "_label", lambda *a: labels.append(real_label(*a)) or labels[-1])
    import matplotlib.figure

    real_suptitle = matplotlib.figure.Figure.suptitle

    def suptitle(self, text, **kwargs):
        titles.append(text)
        return real_suptitle(self, text, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", suptitle)
    shown.show("smallnorb", tmp_path / "n.png", count=5, params=params, root=root)
    assert labels == ["0 animal", "1 human", "2 airplane", "3 truck", "4 car"]
    assert titles == ["smallnorb-test-all (smallnorb-synth: the stand-in for smallnorb)"]
