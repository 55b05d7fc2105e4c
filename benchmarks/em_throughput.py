"""em-capsnet training-step throughput and peak memory: vectorised vs the loop reference.

Implementations: ``compiled`` (EMCapsNet.compile_routing: the routing steps of
capsnet.nn.routing.em_routing compiled with torch.compile, the fast path), ``eager`` (the same
routing run eagerly, each block of windows recomputed in the backward pass) and
``reference`` (benchmarks/em_reference.py: a Python loop over positions, plain autograd).
Each runs in its own subprocess (so peak RSS is its own), interleaved over ``--rounds``
rounds in the same invocation, on identical weights and data; the warm-up steps (and the
compilation) are not timed. The table reports the median seconds per step and images/s
over the rounds, the largest peak RSS, and each implementation's throughput (images/s) as a
multiple of the reference's.

The loop reference keeps every position's temporaries for the backward pass (about 0.55 GiB
per image at 32x32: 17.6 GiB at batch 32), so ``--reference-batch-size`` lets it run on a
smaller batch where memory is short; the ratio then compares images/s at two batch sizes,
and the output says so. ``--threads`` sets torch's intra-op threads in every worker (1 on a
shared, loaded machine: with 2 threads and other jobs on both cores every parallel op
waits for a descheduled thread).

    python benchmarks/em_throughput.py --batch-size 32 --in-channels 2 --threads 1 \
        --steps 2 --warmup 1 --rounds 3 --impls compiled,eager,reference

``--against REV`` also times each implementation as the git revision REV has it (its
source tree exported to a temporary folder; rows ``<impl>@REV``), alternating with this
tree's in every round, and prints each implementation's throughput as a multiple of its
REV counterpart's: a before / after measured in one run. The shapes of the default
smallNORB run (params.yaml ``smallnorb_sweep``, ``smallnorb_train``, ``viewpoints``):

    python benchmarks/em_throughput.py --model em-capsnet-small --in-channels 2 \
        --batch-size 32 --iterations 2 --threads 1 --impls compiled,eager \
        --against e8ec4ce --steps 3 --warmup 1 --rounds 3

``--device cuda`` runs the steps on a GPU and adds each implementation's peak GPU memory;
the table also gives seconds per epoch of 24,300 images (a smallNORB training set).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("compiled", "eager", "reference")
EPOCH_IMAGES = 24_300  # smallNORB training images


def _worker(args: argparse.Namespace) -> dict:
    import torch

    sys.path.insert(0, str(args.source or ROOT))
    from benchmarks.em_reference import ReferenceEMCapsNet
    from capsnet import models
    from capsnet.nn import losses

    torch.set_num_threads(args.threads)
    if args.worker == "reference":
        args.batch_size = args.reference_batch_size or args.batch_size
    torch.manual_seed(0)
    model = models.build(
        args.model,
        in_channels=args.in_channels,
        input_size=args.input_size,
        num_classes=args.num_classes,
        routing_iterations=args.iterations,
        routing_scope=args.routing_scope,
    )
    device = torch.device(args.device)
    model.to(device)
    if args.worker == "compiled":
        model.compile_routing()
    net = ReferenceEMCapsNet(model) if args.worker == "reference" else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=2e-7)
    g = torch.Generator().manual_seed(1)
    shape = (args.batch_size, args.in_channels, args.input_size, args.input_size)
    x = torch.rand(shape, generator=g).to(device)
    y = torch.randint(0, args.num_classes, (args.batch_size,), generator=g).to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step() -> None:  # no host sync inside: the timer syncs around all steps
        out = net(x)
        loss = losses.spread_loss(out.scores, y, 0.2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = (time.perf_counter() - started) / args.steps
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    gpu_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {
        "impl": args.worker + (f"@{args.against}" if args.source else ""),
        "device": str(device),
        "peak_gpu_gib": gpu_gib,
        "batch_size": args.batch_size,
        "seconds_per_step": seconds,
        "images_per_second": args.batch_size / seconds,
        "peak_rss_gib": peak_kib / 2**20,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def _export(revision: str, folder: Path, parser: argparse.ArgumentParser) -> Path:
    """The source tree of git ``revision`` exported under ``folder`` (exits 2 naming an
    unknown revision)."""
    archive = folder / "source.tar"
    done = subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), revision, "capsnet", "benchmarks"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        parser.error(f"--against {revision}: not a git revision of {ROOT}")
    source = folder / "source"
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")
    return source


def _rounds(rounds: int, impls, sources, passthrough) -> dict[str, list[dict]]:
    """Every implementation from every source tree (None: this one) in its own worker
    process, alternating within each of ``rounds`` rounds -> results per row label."""
    runs: dict[str, list[dict]] = {}
    for round_ in range(rounds):
        for impl in impls:
            for source in sources:
                cmd = [sys.executable, str(Path(__file__).resolve()), *passthrough,
                       "--worker", impl]  # fmt: skip
                if source is not None:
                    cmd += ["--source", str(source)]
                done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                runs.setdefault(result["impl"], []).append(result)
                print(f"round {round_ + 1}: {result['impl']} done", file=sys.stderr)
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="em-capsnet")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--in-channels", type=int, default=1, choices=(1, 2))
    parser.add_argument("--input-size", type=int, default=32)
    parser.add_argument("--num-classes", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument(
        "--routing-scope",
        default="global",
        choices=("global", "window"),
        help="EM assignments normalised over all windows a child feeds, or per window",
    )
    parser.add_argument("--steps", type=int, default=2, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument(
        "--impls",
        default="compiled,reference",
        help="comma-separated, from compiled, eager, reference (timed in this order)",
    )
    parser.add_argument(
        "--reference-batch-size", type=int, default=None, help="default: --batch-size"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu or cuda[:N] (peak GPU memory too); any torch device for the workers",
    )
    parser.add_argument("--rounds", type=int, default=1, help="interleaved runs of each impl")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--against", default=None, help="git revision to time each implementation against"
    )
    parser.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args)))
        return

    impls = tuple(name.strip() for name in args.impls.split(",") if name.strip())
    unknown = [name for name in impls if name not in IMPLS]
    if unknown or not impls:
        parser.error(f"--impls: {', '.join(unknown) or 'none'} unknown; choose from {IMPLS}")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--device {args.device}: no CUDA device is available here")
    if "compiled" in impls and args.warmup < 1:
        parser.error("--warmup must be >= 1 with the compiled implementation (compilation)")
    passthrough = list(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="em-throughput-") as tmp:
        sources = [None]
        if args.against:
            sources.append(_export(args.against, Path(tmp), parser))
        runs = _rounds(args.rounds, impls, sources, passthrough)

    results = []
    for rs in runs.values():
        seconds = statistics.median(r["seconds_per_step"] for r in rs)
        batch = rs[0]["batch_size"]
        results.append(
            {
                **rs[0],
                "seconds_per_step": seconds,
                "images_per_second": batch / seconds,
                "peak_rss_gib": max(r["peak_rss_gib"] for r in rs),
                "all_seconds_per_step": [r["seconds_per_step"] for r in rs],
            }
        )
    first = results[0]
    on_gpu = first["peak_gpu_gib"] is not None
    print(
        f"{args.model}, {args.in_channels}x{args.input_size}x{args.input_size}, "
        f"{args.iterations} EM iterations, routing scope {args.routing_scope}, "
        f"{first['device']}, {first['threads']} threads, "
        f"torch {first['torch']}, median of {args.rounds} round(s) x {args.steps} step(s)"
    )
    gpu_head = " peak GPU memory (GiB) |" if on_gpu else ""
    print(
        f"| implementation | batch | s / step | images / s | s / epoch | peak RSS (GiB) |{gpu_head}"
    )
    print("|---|---:|---:|---:|---:|---:|" + ("---:|" if on_gpu else ""))
    for r in results:
        r["seconds_per_epoch"] = EPOCH_IMAGES / r["images_per_second"]
        gpu = f" {max(x['peak_gpu_gib'] for x in runs[r['impl']]):.2f} |" if on_gpu else ""
        print(
            f"| {r['impl']} | {r['batch_size']} | {r['seconds_per_step']:.2f} "
            f"| {r['images_per_second']:.2f} | {r['seconds_per_epoch']:.0f} "
            f"| {r['peak_rss_gib']:.2f} |{gpu}"
        )
    print(f"s / epoch: {EPOCH_IMAGES:,} images (a smallNORB training set) / images per second")
    reference = next((r for r in results if r["impl"] == "reference"), None)
    for r in results:
        if reference is not None and r is not reference:
            r["ratio_vs_reference"] = r["images_per_second"] / reference["images_per_second"]
            print(
                f"{r['impl']} / reference throughput (images/s): {r['ratio_vs_reference']:.2f}x"
                + ("" if r["batch_size"] == reference["batch_size"] else " (different batches)")
            )
    for r in results:
        before = next((b for b in results if b["impl"] == f"{r['impl']}@{args.against}"), None)
        if before is not None:
            r["ratio_vs_against"] = r["images_per_second"] / before["images_per_second"]
            print(
                f"{r['impl']} / {before['impl']} throughput (images/s): "
                f"{r['ratio_vs_against']:.2f}x"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
