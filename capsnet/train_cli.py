"""The ``capsnet models`` and ``capsnet train`` commands."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from capsnet.cli_options import data_root_option, mirror_option


@click.command("models")
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


TRAIN_DATASETS = ("mnist", "expanded-mnist", "multimnist", "smallnorb")
AUGMENT_STRATEGIES = ("none", "shift", "rotate", "affine", "elastic")


@click.command("train")
@click.option("--model", "model_name", required=True, help="Registered model name.")
@click.option(
    "--dataset",
    type=click.Choice(TRAIN_DATASETS),
    default="mnist",
    show_default=True,
    help="Training data; the model's input size, channels and classes follow it.",
)
@click.option(
    "--subset",
    default="all",
    show_default=True,
    help="smallNORB viewpoint subset to train on (e.g. azimuth-familiar).",
)
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-3, show_default=True)
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option(
    "--loss",
    type=click.Choice(["auto", "margin", "cross-entropy", "spread"]),
    default="auto",
    show_default=True,
    help="auto: margin for dynamic-routing capsules, spread for EM, cross-entropy for CNNs.",
)
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
    help="Images held out from the end of the training set for validation.",
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
    help="Random shift augmentation in pixels, batched on the device (0: off).",
)
@click.option(
    "--augment",
    type=click.Choice(AUGMENT_STRATEGIES),
    default=None,
    help="An albumentations strategy with the settings of params.yaml `augment` "
    "(replaces --shift).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N, mps.")
@click.option(
    "--compile/--no-compile",
    "compile_routing",
    default=False,
    show_default=True,
    help="EM models: torch.compile the EM routing (a one-off compilation, then several "
    "times faster steps).",
)
@data_root_option()
@mirror_option
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for model.pt and metrics.json.",
)
def train_command(
    model_name,
    dataset,
    subset,
    epochs,
    batch_size,
    lr,
    weight_decay,
    loss,
    train_limit,
    val_size,
    test_limit,
    routing_iterations,
    shift_pixels,
    augment,
    seed,
    device,
    compile_routing,
    data_root,
    mirror,
    out,
):
    """Train a model; write OUT/model.pt and OUT/metrics.json (test accuracy included)."""
    import torch

    from capsnet import checkpoint, evaluate, models
    from capsnet.data.datasets import load, split_tail
    from capsnet.train import TrainConfig, fit, select_device

    select_device(device)  # an unavailable device fails before any work
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{out} exists and is not a directory", param_hint="--out")
    field_names = set(models.make_config(model_name).__dict__)
    if routing_iterations is not None and "routing_iterations" not in field_names:
        raise click.BadParameter(
            f"model {model_name!r} has no routing", param_hint="--routing-iterations"
        )
    if subset != "all" and dataset != "smallnorb":
        raise click.BadParameter("only smallnorb has viewpoint subsets", param_hint="--subset")
    progress = sys.stderr.isatty()
    options = {"subset": subset} if dataset == "smallnorb" else {}
    full = load(dataset, "train", data_root, mirror=mirror, progress=progress, **options)
    test = load(dataset, "test", data_root, mirror=mirror, progress=progress, **options)
    if test_limit is not None and test_limit < len(test):
        test = split_tail(test, len(test) - test_limit)[0]
    if val_size >= len(full):
        raise click.BadParameter(
            f"{val_size} >= {len(full)} training images", param_hint="--val-size"
        )
    train_set, val_set = split_tail(full, val_size, train_limit)
    if dataset == "smallnorb" and val_size:  # validate on centre crops, not augmented ones
        plain = load(dataset, "train", data_root, augment=False, **options)
        val_set = split_tail(plain, val_size)[1]
    if augment not in (None, "none", "shift") or (augment == "shift" and dataset != "mnist"):
        from capsnet.config import load_or_default
        from capsnet.data.augment import AugmentedDataset

        if not hasattr(train_set, "tensors"):
            raise click.BadParameter(
                f"--augment applies to image tensors; {dataset} augments itself",
                param_hint="--augment",
            )
        params = load_or_default("params.yaml" if Path("params.yaml").is_file() else None)
        train_set = AugmentedDataset(train_set, augment, params.augment, seed)
        shift_pixels = 0
    elif augment == "none":
        shift_pixels = 0
    sample, _ = test[0]  # (C, H, W)
    overrides = {"in_channels": sample.shape[0], "input_size": sample.shape[-1]}
    overrides["num_classes"] = 5 if dataset == "smallnorb" else 10
    overrides = {k: v for k, v in overrides.items() if k in field_names}
    if routing_iterations is not None:
        overrides["routing_iterations"] = routing_iterations
    config = TrainConfig(
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        loss=loss,
        seed=seed,
        device=device,
        shift_pixels=shift_pixels,
        compile=compile_routing,
    )
    torch.manual_seed(seed)
    model = models.build(model_name, **overrides)
    click.echo(
        f"training {model_name} ({models.count_parameters(model):,} parameters) on "
        f"{len(train_set)} {dataset} images for {epochs} epoch(s)",
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
    if dataset == "multimnist":
        test_result = evaluate.evaluate_multimnist(model.cpu(), test, config.eval_batch_size)
        test_result["accuracy"] = test_result["strict_accuracy"]
    else:
        test_result = evaluate.accuracy(model.cpu(), test, config.eval_batch_size, "cpu")
    metrics = {
        "model": model_name,
        "dataset": dataset,
        "parameters": models.count_parameters(model),
        "epochs": epochs,
        "train_images": len(train_set),
        "train_seconds": round(train_seconds, 3),
        "seconds_per_epoch": round(sum(r["seconds"] for r in history) / len(history), 3),
        "val_accuracy": history[-1].get("val_accuracy"),
        dataset: test_result,
        "history": history,
    }
    out.mkdir(parents=True, exist_ok=True)
    checkpoint.save(out / "model.pt", model, train_config=config.to_dict(), metrics=metrics)
    _write_json_atomic(out / "metrics.json", metrics)
    click.echo(
        f"test accuracy {test_result['accuracy']:.4f} on {test_result['n']} images; "
        f"wrote {out / 'model.pt'} and {out / 'metrics.json'}"
    )
