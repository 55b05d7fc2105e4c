"""The ``capsnet models`` and ``capsnet train`` commands."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from capsnet.cli.declared import Command
from capsnet.cli.options import (
    SEED,
    FiniteFloat,
    count,
    data_root_option,
    field_default,
    mirror_option,
    output_option_check,
    params_option,
    train_default,
    usage_check,
)
from capsnet.config import FinalTrainConfig, SweepConfig, dataset_specs
from capsnet.config.sweep import LOSSES


class TrainingSet(click.Choice):
    """The registry's training sets, read as the option is parsed (datasets registered at
    run time included)."""

    def __init__(self):
        super().__init__(dataset_specs.TRAIN_DATASETS)

    @property
    def choices(self):
        return dataset_specs.TRAIN_DATASETS

    @choices.setter
    def choices(self, _value):
        pass


def known_model(name: str) -> None:
    """ConfigError unless ``name`` is a registered model."""
    from capsnet import models

    models.spec(name)


COMMANDS = (
    Command(
        "models",
        "models_command",
        "List the registered models with their parameter counts.",
    ),
    Command(
        "train",
        "train_command",
        "Train a model; write OUT/model.pt and OUT/metrics.json (test accuracy included).",
    ),
)


@click.command("models")
def models_command() -> None:
    """List the registered models with their parameter counts."""
    from capsnet import models

    for name in models.names():
        model = models.build(name)
        spec = models.spec(name)
        click.echo(f"{name:<18} {models.count_parameters(model):>12,}  {spec.description}")


#: capsnet.data.augment.STRATEGIES, named here so that `capsnet train --help` imports no
#: torch (tests/test_core_cli.py checks they agree).
AUGMENT_STRATEGIES = ("none", "shift", "rotate", "affine", "elastic")
#: capsnet.config.sweep.PRECISIONS (checked equal in tests/test_train.py).
PRECISIONS = ("auto", "bf16", "fp32")


@click.command("train")
@click.option(
    "--model", "model_name", required=True, callback=usage_check(known_model),
    help="Registered model name.",
)  # fmt: skip
@click.option(
    "--dataset",
    type=TrainingSet(),
    default=SweepConfig.dataset,
    show_default=True,
    help="Training data; the model's input size, channels and classes follow it.",
)
@click.option(
    "--subset",
    default="all",
    show_default=True,
    help="smallNORB viewpoint subset to train on (e.g. azimuth-familiar).",
)
@click.option("--epochs", type=count(), **train_default("epochs"))
@click.option("--batch-size", type=count(), **train_default("batch_size"))
@click.option("--lr", type=FiniteFloat(0, low_open=True), **train_default("lr"))
@click.option("--weight-decay", type=FiniteFloat(0), **train_default("weight_decay"))
@click.option(
    "--loss",
    type=click.Choice(LOSSES),
    **train_default("loss"),
    help="auto: margin for dynamic-routing capsules, spread for EM, cross-entropy for CNNs.",
)
@click.option(
    "--train-limit",
    type=count(),
    default=None,
    help="Train on the first N training images only.",
)
@click.option(
    "--val-size",
    type=count(0),
    default=field_default(FinalTrainConfig, "val_size"),
    show_default=True,
    help="Images held out from the end of the training set for validation.",
)
@click.option(
    "--test-limit",
    type=count(),
    default=None,
    help="Test on the first N test images only.",
)
@click.option("--routing-iterations", type=count(), default=None)
@click.option(
    "--detach-inner/--no-detach-inner",
    default=None,
    help="Dynamic routing: stop gradients through the votes in all but the last "
    "iteration (default: the model's, on).",
)
@click.option(
    "--augment",
    type=click.Choice(AUGMENT_STRATEGIES),
    default=None,
    help="Augmentation strategy (default: params.yaml augment.strategy, shift; none for "
    "smallnorb, which augments itself), with the settings of params.yaml `augment`.",
)
@click.option(
    "--shift",
    "shift_pixels",
    type=click.IntRange(min=0, max=8),
    default=None,
    help="Pixels of the shift strategy (default: params.yaml augment.shift.pixels, 2).",
)
@click.option("--seed", type=SEED, **train_default("seed"))
@click.option("--device", **train_default("device"), help="auto, cpu, cuda, cuda:N, mps.")
@click.option(
    "--compile/--no-compile",
    "compile_routing",
    **train_default("compile"),
    help="torch.compile models that offer it: CapsNet's whole forward (CUDA graphs on "
    "CUDA), the EM routing (a one-off compilation, then several times faster steps); "
    "a compiled run drops each epoch's partial last batch.",
)
@click.option(
    "--amp",
    type=click.Choice(PRECISIONS),
    **train_default("amp"),
    help="Precision: auto (bf16 autocast on CUDA and on CPUs with native bf16, fp32 "
    "elsewhere), bf16 (autocast wherever it exists) or fp32. Squash, routing softmax and "
    "losses stay fp32. Also used for the test score.",
)
@data_root_option()
@mirror_option
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    callback=output_option_check("dir"),
    help="Directory for model.pt and metrics.json.",
)
@params_option(
    "its data and augment sections, as `capsnet eval` and the stages read them; without the "
    "file, the built-in ones",
    default=None,
)
def train_command(
    params_path,
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
    detach_inner,
    shift_pixels,
    augment,
    seed,
    device,
    compile_routing,
    amp,
    data_root,
    mirror,
    out,
):
    """Train a model; write OUT/model.pt and OUT/metrics.json (test accuracy included)."""
    from capsnet.config import load_or_default
    from capsnet.training.device import select_device
    from capsnet.training.fit import TrainConfig
    from capsnet.training.run import RunSpec, train_run

    select_device(device)  # an unavailable device fails before any work
    check_run_dir(out)
    params = load_or_default(params_path)
    augment_params = _augment_params(params.augment, shift_pixels)
    spec = RunSpec(
        model=model_name,
        train=TrainConfig(
            epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay, loss=loss,
            seed=seed, device=device, compile=compile_routing, amp=amp,
        ),
        overrides=_model_overrides(model_name, routing_iterations, detach_inner),
        dataset=dataset,
        subset=subset,
        train_size=train_limit,
        val_size=val_size,
        augment=augment or _default_augment(dataset, augment_params),
        augment_params=augment_params,
        data_params=params.data,
        data_root=data_root,
        mirror=mirror,
    )  # fmt: skip

    result = train_run(spec, on_epoch=_report_epoch, progress=sys.stderr.isatty())
    metrics = _run_metrics(spec, result, test_limit)
    _save(out, result, metrics)
    test = metrics[dataset]
    click.echo(
        f"{model_name} ({metrics['parameters']:,} parameters) trained on "
        f"{result.train_images} {dataset} images; test accuracy {test['accuracy']:.4f} on "
        f"{test['n']} images; wrote {out / 'model.pt'} and {out / 'metrics.json'}"
    )


def _report_epoch(record: dict, state, model) -> None:
    """One line on stderr per epoch."""
    val = record.get("val_accuracy")
    click.echo(
        f"epoch {record['epoch']}: loss {record['train_loss']:.4f} "
        f"train acc {record['train_accuracy']:.4f}"
        + (f" val acc {val:.4f}" if val is not None else "")
        + f" ({record['seconds']:.1f} s)",
        err=True,
    )


def _model_overrides(
    model_name: str, routing_iterations: int | None, detach_inner: bool | None
) -> dict:
    from capsnet import models

    given = {"routing_iterations": routing_iterations, "detach_inner": detach_inner}
    overrides = {key: value for key, value in given.items() if value is not None}
    for key in overrides:
        if key not in models.config_fields(model_name):
            raise click.BadParameter(
                f"model {model_name!r} has no {key} setting",
                param_hint="--" + key.replace("_", "-"),
            )
    return overrides


def _augment_params(params, shift_pixels: int | None):
    """The params file's ``augment`` section ``params`` with ``--shift``."""
    import dataclasses

    if shift_pixels is None:
        return params
    return dataclasses.replace(params, shift=dataclasses.replace(params.shift, pixels=shift_pixels))


def _default_augment(dataset: str, augment_params) -> str:
    """params.yaml's augmentation strategy, or none for a dataset that augments itself."""
    return "none" if dataset_specs.get(dataset).self_augmenting else augment_params.strategy


def _run_metrics(spec, result, test_limit: int | None) -> dict:
    """metrics.json of a ``capsnet train`` run: the test score under the dataset's name."""
    from capsnet import models
    from capsnet.training import scoring as evaluate
    from capsnet.training.device import select_device
    from capsnet.training.run import load_test

    test = load_test(spec, test_limit)
    batch, amp = result.train_config.eval_batch_size, result.train_config.amp
    result.model.to(select_device(spec.train.device))  # scored where it trained
    scored = evaluate.score(result.model, spec.dataset, test, batch, amp=amp)
    scored["accuracy"] = scored[spec.data.headline_metric]
    result.model.cpu()
    history = result.history
    return {
        "model": spec.model,
        "dataset": spec.dataset,
        "parameters": models.count_parameters(result.model),
        "epochs": spec.train.epochs,
        "augment": spec.augment,
        "train_images": result.train_images,
        "train_seconds": round(result.train_seconds, 3),
        "seconds_per_epoch": round(sum(r["seconds"] for r in history) / len(history), 3),
        "val_accuracy": history[-1].get("val_accuracy"),
        spec.dataset: scored,
        **result.compile,
        "history": history,
    }


#: What ``capsnet train --out DIR`` writes: DIR is the run directory, replaced whole.
RUN_FILES = ("model.pt", "metrics.json")


def check_run_dir(out: Path) -> None:
    """Refuse an ``--out`` that holds anything besides a run's files: it is replaced whole."""
    from capsnet.cli.options import check_output

    check_output(out, "--out", own=RUN_FILES)


def _save(out: Path, result, metrics: dict) -> None:
    """OUT/model.pt and OUT/metrics.json, published together: built in a temporary sibling
    and swapped in for OUT in one step, so a kill leaves the old run or the new one."""
    from capsnet.io.files import atomic_write_json
    from capsnet.io.outputset import atomic_directory
    from capsnet.models import checkpoint

    check_run_dir(out)
    with atomic_directory(out, RUN_FILES) as tmp:
        model, metrics_file = (tmp / name for name in RUN_FILES)
        train_config = result.train_config.to_dict()
        checkpoint.save(
            model, result.model, train_config=train_config, metrics=metrics,
            extra={"data": result.data},
        )  # fmt: skip
        atomic_write_json(metrics_file, metrics)
