"""The ``capsnet`` command line (click)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from capsnet.errors import CapsnetError

DEFAULT_ANGLES = "0,15,30,35,45,60,90,180"


class CapsnetGroup(click.Group):
    """A click group whose user errors end as one line on stderr, never a traceback."""

    def main(self, args=None, prog_name=None, **extra):
        try:
            rv = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"Error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)
        except CapsnetError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=CapsnetGroup)
@click.version_option(package_name="capsnet-pipeline")
def main() -> None:
    """Capsule networks: train, evaluate and benchmark models, prepare data."""


@main.command("models")
def models_command() -> None:
    """List the registered models with their parameter counts."""
    from capsnet import models

    for name in models.names():
        model = models.build(name)
        spec = models.spec(name)
        click.echo(f"{name:<18} {models.count_parameters(model):>12,}  {spec.description}")


def _write_json_atomic(path: Path, payload) -> None:
    from capsnet.data.sources import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=False) + "\n").encode())


def _parse_angles(ctx, param, value: str | None):
    if value is None:
        return None
    try:
        angles = [float(a) for a in value.split(",") if a.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of degrees") from None
    if not angles:
        raise click.BadParameter("no angles given")
    return angles


@main.command("train")
@click.option("--model", "model_name", required=True, help="Registered model name.")
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-3, show_default=True)
@click.option(
    "--train-limit",
    type=click.IntRange(min=1),
    default=None,
    help="Train on the first N training images only.",
)
@click.option(
    "--val-size",
    type=click.IntRange(min=0),
    default=5000,
    show_default=True,
    help="Images held out from the end of the MNIST training set for validation.",
)
@click.option(
    "--test-limit",
    type=click.IntRange(min=1),
    default=None,
    help="Test on the first N test images only.",
)
@click.option("--routing-iterations", type=click.IntRange(min=1), default=None)
@click.option(
    "--shift",
    "shift_pixels",
    type=click.IntRange(min=0, max=8),
    default=2,
    show_default=True,
    help="Random shift augmentation in pixels (0: off).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N, mps.")
@click.option(
    "--data-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Data directory (default: $CAPSNET_DATA or ./data).",
)
@click.option("--mirror", default=None, help="Dataset mirror (default: $CAPSNET_MIRROR).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for model.pt and metrics.json.",
)
def train_command(
    model_name,
    epochs,
    batch_size,
    lr,
    train_limit,
    val_size,
    test_limit,
    routing_iterations,
    shift_pixels,
    seed,
    device,
    data_root,
    mirror,
    out,
):
    """Train a model on MNIST; write OUT/model.pt and OUT/metrics.json."""
    import torch

    from capsnet import checkpoint, evaluate, models
    from capsnet.data.datasets import TensorImageDataset, load
    from capsnet.train import TrainConfig, fit, select_device

    select_device(device)  # an unavailable device fails before any work
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{out} exists and is not a directory", param_hint="--out")
    overrides = {}
    if routing_iterations is not None:
        if "routing_iterations" not in {f for f in models.make_config(model_name).__dict__}:
            raise click.BadParameter(
                f"model {model_name!r} has no routing", param_hint="--routing-iterations"
            )
        overrides["routing_iterations"] = routing_iterations
    config = TrainConfig(
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        device=device,
        shift_pixels=shift_pixels,
    )
    torch.manual_seed(seed)
    model = models.build(model_name, **overrides)
    progress = sys.stderr.isatty()
    full = load("mnist", "train", data_root, mirror=mirror, progress=progress)
    test = load("mnist", "test", data_root, mirror=mirror, progress=progress).subset(test_limit)
    images, labels = full.tensors
    if val_size >= images.shape[0]:
        raise click.BadParameter(
            f"{val_size} >= {images.shape[0]} training images", param_hint="--val-size"
        )
    cut = images.shape[0] - val_size
    train_set = TensorImageDataset(images[:cut], labels[:cut], "mnist-train").subset(train_limit)
    val_set = TensorImageDataset(images[cut:], labels[cut:], "mnist-val") if val_size else None
    click.echo(
        f"training {model_name} ({models.count_parameters(model):,} parameters) on "
        f"{len(train_set)} images for {epochs} epoch(s)",
        err=True,
    )

    def report(record, state):
        val = record.get("val_accuracy")
        click.echo(
            f"epoch {record['epoch']}: loss {record['train_loss']:.4f} "
            f"train acc {record['train_accuracy']:.4f}"
            + (f" val acc {val:.4f}" if val is not None else "")
            + f" ({record['seconds']:.1f} s)",
            err=True,
        )

    started = time.perf_counter()
    history = fit(model, train_set, val_set, config, on_epoch=report)
    train_seconds = time.perf_counter() - started
    test_result = evaluate.accuracy(model.cpu(), test, config.eval_batch_size, "cpu")
    metrics = {
        "model": model_name,
        "parameters": models.count_parameters(model),
        "epochs": epochs,
        "train_images": len(train_set),
        "train_seconds": round(train_seconds, 3),
        "seconds_per_epoch": round(sum(r["seconds"] for r in history) / len(history), 3),
        "val_accuracy": history[-1].get("val_accuracy"),
        "mnist": test_result,
        "history": history,
    }
    out.mkdir(parents=True, exist_ok=True)
    checkpoint.save(out / "model.pt", model, train_config=config.to_dict(), metrics=metrics)
    _write_json_atomic(out / "metrics.json", metrics)
    click.echo(
        f"test accuracy {test_result['accuracy']:.4f} on {test_result['n']} images; "
        f"wrote {out / 'model.pt'} and {out / 'metrics.json'}"
    )


def _checkpoint_names(paths: list[Path]) -> list[str]:
    """Readable unique names: the file stem, or its folder for a generic 'model.pt'."""
    names = [
        p.parent.name if p.stem in ("model", "checkpoint") and p.parent.name else p.stem
        for p in paths
    ]
    if len(set(names)) != len(names):
        names = [str(p) for p in paths]
    return names


@main.command("eval")
@click.argument("checkpoints", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--dataset", type=click.Choice(["mnist"]), default="mnist", show_default=True)
@click.option(
    "--angles",
    callback=_parse_angles,
    default=None,
    help=f"Also evaluate on MNIST rotated by these degrees, e.g. {DEFAULT_ANGLES}.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Evaluate on the first N test images only.",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=500, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--data-root", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--mirror", default=None)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the results as JSON here.",
)
def eval_command(checkpoints, dataset, angles, limit, batch_size, device, data_root, mirror, out):
    """Evaluate CHECKPOINT(s) side by side on MNIST (and rotated MNIST with --angles)."""
    from capsnet import checkpoint, evaluate
    from capsnet.data.datasets import load
    from capsnet.train import select_device

    device = select_device(device)
    loaded = [checkpoint.load(path, map_location="cpu") for path in checkpoints]  # fail early
    test = load(dataset, "test", data_root, mirror=mirror, progress=sys.stderr.isatty())
    test = test.subset(limit)
    results = {}
    for name, path, (model, meta) in zip(_checkpoint_names(list(checkpoints)), checkpoints, loaded):
        model.to(device)
        entry = {
            "model": meta["model_name"],
            "checkpoint": str(path),
            "mnist": evaluate.accuracy(model, test, batch_size, device),
        }
        if angles:
            entry["rotated-mnist"] = evaluate.rotation_sweep(
                model, test, angles, batch_size, device
            )
        results[name] = entry
    _print_table(results, angles)
    if out is not None:
        _write_json_atomic(out, results)
        click.echo(f"wrote {out}")


def _print_table(results: dict, angles) -> None:
    header = ["checkpoint", "model", "mnist"] + [f"{a:g}°" for a in (angles or [])]
    rows = []
    for name, entry in results.items():
        row = [name, entry["model"], f"{entry['mnist']['accuracy']:.4f}"]
        for angle in angles or []:
            row.append(f"{entry['rotated-mnist']['accuracy'][f'{angle:g}']:.4f}")
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))


def _register_lazy_groups() -> None:
    """Attach command groups that live beside the code they drive."""
    try:
        from capsnet.data.cli import data_group
    except ModuleNotFoundError as exc:  # the data extras are optional
        if exc.name not in ("capsnet.data.cli", "albumentations", "scipy", "matplotlib"):
            raise
    else:
        main.add_command(data_group)


_register_lazy_groups()
