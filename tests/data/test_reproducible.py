"""Every data output has the same bytes whatever torch CPU kernel computes it (scalar,
AVX2, AVX-512) and however many threads: the outputs of a small build (every data stage,
the smallNORB stand-in rendered small) are made in subprocesses under
``ATEN_CPU_CAPABILITY=default``, ``=avx2`` and the native kernel, hashed, and compared with
each other and with the hashes committed below. The full build of params.yaml runs once
(native kernel, one thread: the code paths are the small build's) against its committed
hashes and dvc.lock.

Run as a script (``python test_reproducible.py MODE MIRROR OUT``) it builds and prints
the hashes as JSON; that is what the subprocesses do.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ANGLES = tuple(range(-180, 181, 5))  # every angle params.yaml rotates by is a multiple of 5
KERNELS = (
    {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"},
    {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"},
    {},  # the machine's best kernel (AVX-512 where present), torch's default threads
)
COUNT = {"subset": 200, "full": 2000}  # MNIST test digits rotated and rendered per mode
SYNTH_SIDE = 24  # the small build renders the smallNORB stand-in at this side
SYNTH_LIGHTINGS = 1  # and its first lighting (every view, every part of the renderer)

# sha256 of every file the data stages write and of the images computed when loaded;
# "dvc:<output>" is the md5 dvc.lock records for the output directory. "full" is
# params.yaml: update it (and rerun `dvc repro`) when its data section changes.
EXPECTED = {  # first 16 hex digits
    "subset": {
        "dvc:data/prepared/affnist": "c61b0c3f6bcf0589",
        "dvc:data/prepared/affnist-synth": "76442e2ac73c28f3",
        "dvc:data/prepared/mnist": "157efe1e788158d5",
        "dvc:data/prepared/multimnist": "1719919535f7b834",
        "dvc:data/prepared/smallnorb": "30e6b09990f61e13",
        "dvc:data/raw/affnist": "c61b0c3f6bcf0589",
        "dvc:data/raw/mnist": "86c1c7931e254c23",
        "expanded-mnist": "394c46032f9644da",
        "multimnist-render": "f453869bae6b0c39",
        "prepared/affnist-synth/test.pt": "94fb74699e266676",
        "prepared/affnist/DISABLED.txt": "a84b1f71d9e76f93",
        "prepared/mnist/test.pt": "5578b3f7668ad559",
        "prepared/mnist/train.pt": "338884e85ad544eb",
        "prepared/multimnist/test.pt": "7289b468ba4b6f3e",
        "prepared/multimnist/train.pt": "9e3382c8c7f79863",
        "prepared/smallnorb/test.pt": "e6d0212143f05e81",
        "prepared/smallnorb/train.pt": "6aea3f9d6ca37a26",
        "raw/affnist/DISABLED.txt": "a84b1f71d9e76f93",
        "raw/mnist/t10k-images-idx3-ubyte.gz": "1a1a05eab793c14b",
        "raw/mnist/t10k-labels-idx1-ubyte.gz": "b91679a0acfe4ba0",
        "raw/mnist/train-images-idx3-ubyte.gz": "0b367032e93c5d0c",
        "raw/mnist/train-labels-idx1-ubyte.gz": "1787548bbe0bff1e",
        "rotated-mnist": "26ff70ab139eb080",
        "smallnorb-synth-render": "0edc68b475f17aab",
    },
    "full": {
        "dvc:data/prepared/affnist": "c61b0c3f6bcf0589",
        "dvc:data/prepared/affnist-synth": "d781bbc67047e096",
        "dvc:data/prepared/mnist": "157efe1e788158d5",
        "dvc:data/prepared/multimnist": "1719919535f7b834",
        "dvc:data/prepared/smallnorb": "e19de8cd18318ec6",
        "dvc:data/raw/affnist": "c61b0c3f6bcf0589",
        "dvc:data/raw/mnist": "86c1c7931e254c23",
        "dvc:data/raw/smallnorb": "40438cab3d694fd6",
        "expanded-mnist": "71af76099e139398",
        "multimnist-render": "e1d6ecb621f5c0da",
        "prepared/affnist-synth/test.pt": "7c74fffc3d894c26",
        "prepared/affnist/DISABLED.txt": "a84b1f71d9e76f93",
        "prepared/mnist/test.pt": "5578b3f7668ad559",
        "prepared/mnist/train.pt": "338884e85ad544eb",
        "prepared/multimnist/test.pt": "7289b468ba4b6f3e",
        "prepared/multimnist/train.pt": "9e3382c8c7f79863",
        "prepared/smallnorb/test.pt": "db0bbe440ca33480",
        "prepared/smallnorb/train.pt": "133a8c4db9af36d5",
        "raw/affnist/DISABLED.txt": "a84b1f71d9e76f93",
        "raw/mnist/t10k-images-idx3-ubyte.gz": "1a1a05eab793c14b",
        "raw/mnist/t10k-labels-idx1-ubyte.gz": "b91679a0acfe4ba0",
        "raw/mnist/train-images-idx3-ubyte.gz": "0b367032e93c5d0c",
        "raw/mnist/train-labels-idx1-ubyte.gz": "1787548bbe0bff1e",
        "raw/smallnorb/MD5SUMS": "89448c14320dfce6",
        "raw/smallnorb/SOURCE.txt": "e207178ba85c9ced",
        "raw/smallnorb/smallnorb-5x01235x9x18x6x2x96x96-testing-cat.mat.gz": "7b3e413fed3285e6",
        "raw/smallnorb/smallnorb-5x01235x9x18x6x2x96x96-testing-dat.mat.gz": "57ab24de771c7f97",
        "raw/smallnorb/smallnorb-5x01235x9x18x6x2x96x96-testing-info.mat.gz": "2cbe873a68ba0da5",
        "raw/smallnorb/smallnorb-5x46789x9x18x6x2x96x96-training-cat.mat.gz": "7b3e413fed3285e6",
        "raw/smallnorb/smallnorb-5x46789x9x18x6x2x96x96-training-dat.mat.gz": "f20d19e050c1e77f",
        "raw/smallnorb/smallnorb-5x46789x9x18x6x2x96x96-training-info.mat.gz": "d7e3a994345c3281",
        "rotated-mnist": "f0c99c2d13d91d11",
    },
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _params(mode: str):
    """params.yaml ("full"), or the defaults with 200 affnist-synth digits and smallNORB on."""
    from capsnet import config
    from capsnet.config import (
        AffnistParams,
        AffnistSynthParams,
        DataParams,
        Params,
        SmallnorbParams,
    )

    if mode == "full":
        return config.load(REPO / "params.yaml")
    synth = AffnistSynthParams(limit=COUNT[mode])
    return Params(
        data=DataParams(affnist=AffnistParams(synth=synth), smallnorb=SmallnorbParams(enabled=True))
    )


def _write_smallnorb_raw(raw_dir: Path, n: int = 24) -> None:
    """The six smallNORB files with ``n`` examples of a fixed pixel pattern (no RNG, so the
    hashes do not hang on a generator's stream)."""
    import numpy as np
    from datahelpers import norb_info

    from capsnet.data import smallnorb
    from capsnet.data.formats import write_norb

    pixels = (np.arange(n * 2 * 96 * 96, dtype=np.int64) * 2654435761 % 251).astype(np.uint8)
    for split in ("train", "test"):
        write_norb(raw_dir / smallnorb.filename(split, "dat"), pixels.reshape(n, 2, 96, 96))
        write_norb(raw_dir / smallnorb.filename(split, "cat"), (np.arange(n) % 5).astype(np.int32))
        write_norb(raw_dir / smallnorb.filename(split, "info"), norb_info(n))
    (raw_dir / smallnorb.SOURCE_FILE).write_text(f"{smallnorb.SYNTH}\n")  # not the official files


def _dvc_dir_md5(directory: Path) -> str:
    """The md5 DVC records in dvc.lock for an output directory: of the JSON list of its
    files' md5s and relative paths."""
    entries = [
        {
            "md5": hashlib.md5(path.read_bytes()).hexdigest(),
            "relpath": path.relative_to(directory).as_posix(),
        }
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    ]
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"


def build(mode: str, mirror: Path, out: Path) -> dict[str, str]:
    """Run every data stage (`capsnet data download|prepare NAME`) of ``mode`` under ``out``
    (MNIST from ``mirror``; smallNORB as ``synthetic`` below says) and
    hash every file it writes, the rotated test digits, expanded MNIST and MultiMNIST
    renders; ``dvc:<output>`` keys hold each output directory's md5 as dvc.lock has it."""
    import torch

    from capsnet.data import affnist, load, mnist, rotate_images, stages

    params, count = _params(mode), COUNT[mode]
    root = out / "data"
    # smallNORB, when on: fixed-pattern official-format files written here ("subset"), or
    # what params.yaml asks for ("full": the smallnorb-synth stand-in, rendered offline)
    synthetic = params.data.smallnorb.enabled and mode != "full"
    for name in stages.DOWNLOADS:
        if name == "smallnorb" and synthetic:
            _write_smallnorb_raw(root / "raw" / "smallnorb")
        else:
            stages.download(name, params, root, mirror=str(mirror))
    for name in stages.PREPARES:
        stages.prepare(name, params, root)
    outputs = [
        path
        for path in sorted(root.glob("*/*"))
        if not (synthetic and path == root / "raw" / "smallnorb")
    ]
    hashes = {}
    for output in outputs:
        hashes[f"dvc:{output.relative_to(out).as_posix()}"] = _dvc_dir_md5(output)
        for path in sorted(output.rglob("*")):
            if path.is_file():
                hashes[path.relative_to(root).as_posix()] = _sha(path.read_bytes())
    images, _ = mnist.load_tensors(root, "test", download_missing=False)
    images = images[:count]  # (count, 28, 28)
    rotated = torch.stack([rotate_images(images, angle) for angle in ANGLES])  # (A, count, 28, 28)
    hashes["rotated-mnist"] = _sha(rotated.numpy().tobytes())
    hashes["expanded-mnist"] = _sha(affnist.expand(images).numpy().tobytes())
    multi = load("multimnist", "test", root, download=False).render(slice(0, count))[0]
    hashes["multimnist-render"] = _sha(multi.numpy().tobytes())
    if synthetic:  # the stand-in's renderer (the full build renders it at side 96)
        from capsnet.data import smallnorb_synth

        files = smallnorb_synth.write_raw(out / "smallnorb-synth", 0, SYNTH_SIDE, SYNTH_LIGHTINGS)
        hashes["smallnorb-synth-render"] = _sha(b"".join(p.read_bytes() for p in sorted(files)))
    hashes["kernel"] = torch.backends.cpu.get_cpu_capability()
    return hashes


def build_everywhere(
    mode: str, mnist_mirror: Path, tmp_path: Path, kernels=KERNELS
) -> list[dict[str, str]]:
    """``build`` in one subprocess per kernel, run side by side."""
    runs = []
    for k, kernel in enumerate(kernels):
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")
        }
        command = [sys.executable, __file__, mode, mnist_mirror, tmp_path / str(k)]
        runs.append(
            subprocess.Popen(
                [str(c) for c in command],
                env={**env, **kernel},
                cwd=HERE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=900)
        assert run.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout))
    return results


def _check(mode: str, results: list[dict[str, str]]) -> None:
    kernels = [r.pop("kernel") for r in results]
    for kernel, result in zip(kernels[1:], results[1:]):
        assert result == results[0], f"{kernel} differs from {kernels[0]}"
    assert {key: value[:16] for key, value in results[0].items()} == EXPECTED[mode]


def test_data_outputs_are_bit_identical_on_every_kernel(mnist_mirror, tmp_path):
    results = build_everywhere("subset", mnist_mirror, tmp_path)
    assert results[0]["kernel"] == "DEFAULT"
    _check("subset", results)


@pytest.mark.slow
def test_default_pipeline_data_outputs_have_the_committed_hashes(mnist_mirror, tmp_path):
    """The data outputs of params.yaml (all 10,000 affnist-synth digits) and the rotations
    the evaluation computes (its first 2,000 digits); dvc.lock records the same outputs."""
    # the native kernel on one thread: the bytes do not hang on the thread count (the
    # small build above compares one thread with the default), spare threads only spin
    results = build_everywhere("full", mnist_mirror, tmp_path, kernels=({"OMP_NUM_THREADS": "1"},))
    _check("full", results)
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    data_stages = {name: s for name, s in lock.items() if " capsnet data " in f" {s['cmd']}"}
    assert data_stages, "dvc.lock has no data stages"
    for name, stage in data_stages.items():
        for out in stage["outs"]:
            built = results[0].get(f"dvc:{out['path']}")
            assert built == out["md5"], (
                f"dvc.lock {name}: {out['path']} is not what the code makes; run `dvc repro`"
            )


def test_angles_cover_every_rotation_params_yaml_asks_for():
    from capsnet import config

    params = config.load(REPO / "params.yaml")
    evaluate = params.evaluate
    asked = {*evaluate.angles, *evaluate.equivariance.angles, evaluate.confusion_angle}
    assert asked | {params.sweep.rotation_angle} <= set(ANGLES)


if __name__ == "__main__":
    mode, mirror, out = sys.argv[1:]
    print(json.dumps(build(mode, Path(mirror), Path(out)), indent=1, sort_keys=True))
