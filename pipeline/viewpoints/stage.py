"""The DVC ``viewpoints`` stage: the novel-viewpoint experiment (Hinton et al. 2018) for the params
section ``viewpoints``; the matching rule and the results' format are
``capsnet.evaluation.viewpoint_matching``.

For each kind (azimuth, elevation), the capsule model and the CNN are trained on the
familiar viewpoints of the smallNORB training set with ``capsnet.training.run.train_run``; after
every epoch (and ``viewpoints.checks_per_epoch`` times in all per epoch, evenly spaced) each
model's error is measured on the familiar and the novel test viewpoints, and
``select_matched`` picks the checks compared.

``run(params, data_root)`` writes ``viewpoints.out_dir`` (replaced whole) and
``<out_dir>.csv`` as one unit (``capsnet.io.outputset.OutputSet``); with smallNORB switched
off, DISABLED.txt, viewpoints.json ``{"disabled": reason}`` and the CSV's header
(``capsnet.io.outputset.write_disabled``).
Then one W&B run per kind, seed and model (``track``), with the smallNORB sweep's W&B
settings (offline unless an API key is configured: ``pipeline.tracking``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from capsnet.config import DATA_ROOT, ROLE_CAPSULES, dataset_specs
from capsnet.evaluation.viewpoint_matching import (
    CSV_COLUMNS,
    OUT_DIR_FILES,
    PAPER_NOTE,
    PAPER_NOVEL_ERROR,
    RESULTS_FILE,
    RULES,
    csv_path,
    select_matched,
)
from capsnet.io import outputset
from capsnet.io.errors import ConfigError, DataError
from capsnet.io.files import atomic_write_text, run_name

Log = Callable[[str], None]
#: Calls ``fn(*args)`` somewhere and returns its value (the caller's choice of device).
Runner = Callable[..., Any]


def _here(fn: Callable, *args):
    return fn(*args)


# --- data -------------------------------------------------------------------------------------


def kind_spec(params, data_root: str | Path, kind: str, role: str, seed: int | None = None):
    """The RunSpec of ``role`` (capsules or cnn) on the familiar viewpoints of ``kind``:
    random crops of the familiar training subset (first ``train_limit``), no validation;
    ``seed`` (default ``viewpoints.seed``) seeds the run."""
    from capsnet.config.sweep import schedule
    from capsnet.training.fit import TrainConfig
    from capsnet.training.run import RunSpec

    settings = params.viewpoints
    return RunSpec(
        model=settings.model_name(role),
        train=TrainConfig(
            epochs=settings.epochs_of(role), batch_size=settings.batch_size,
            lr=settings.lr_of(role),
            weight_decay=getattr(settings.weight_decay, role),
            seed=settings.seed if seed is None else seed,
            device=settings.device, compile=settings.compile,
            amp=settings.amp or TrainConfig.amp, **schedule(settings),
        ),
        overrides=dict(getattr(settings.overrides, role)),
        dataset=dataset_specs.viewpoint_dataset(),
        subset=f"{kind}-familiar",
        channels=settings.channels,
        train_size=settings.train_limit,
        val_size=0,
        data_params=params.data,
        data_root=data_root,
    )  # fmt: skip


def load_tests(spec, kind: str, limit: int | None) -> dict[str, Any]:
    """{"familiar", "novel"}: the first ``limit`` familiar and novel test items of ``kind``."""
    from capsnet.training.run import load_test

    tests = {w: load_test(spec, limit, subset=f"{kind}-{w}") for w in ("familiar", "novel")}
    for which, dataset in tests.items():
        if len(dataset) == 0:
            raise DataError(f"smallnorb {kind}: the {which} viewpoint subset is empty")
    return tests


# --- training -----------------------------------------------------------------------------------


def check_models(settings) -> None:
    """Fail early, naming the params key, on an unknown model or a bad override."""
    from capsnet import models

    for role in ("capsules", "cnn"):
        name = settings.model_name(role)
        try:
            wrong = models.role_problem(name, role, ROLE_CAPSULES[role])
        except ConfigError as exc:
            raise ConfigError(f"params: viewpoints.{role}: {exc}") from None
        if wrong is not None:
            raise ConfigError(f"params: viewpoints.{role}: {wrong}")
        try:
            models.make_config(name, (1, 32, 5), **getattr(settings.overrides, role))
        except ConfigError as exc:
            raise ConfigError(f"params: viewpoints.overrides.{role}: {exc}") from None


def _error(model, dataset, batch_size: int, device) -> float:
    from capsnet.training.scoring import accuracy

    return 1.0 - accuracy(model, dataset, batch_size, device)["accuracy"]


def epoch_label(epoch: float) -> int | float:
    """A check's epoch as results store it: an int at an epoch's end, else the fraction of
    training done rounded to 4 places (1.125: an eighth into the second epoch)."""
    return int(epoch) if float(epoch).is_integer() else round(float(epoch), 4)


def train_tracked(spec, split, tests: Mapping[str, Any], log: Log, label: str,
                  checks_per_epoch: int = 1):  # fmt: skip
    """Train ``spec`` through ``capsnet.training.run``; at ``checks_per_epoch`` evenly spaced
    checks in every epoch, the last at its end, measure the error on tests["familiar"], and
    on tests["novel"] at an epoch's end and at every check a match could choose (None at
    the others: the novel error is never compared there). Returns (RunResult, history,
    {epoch: CPU state_dict}) keeping the weights of every check ``select_matched`` could
    choose (each new best familiar error, ``candidate_epochs``); a check within an epoch has
    a fractional epoch (``epoch_label``) and no training loss or accuracy."""
    from capsnet.training.device import select_device
    from capsnet.training.run import train_run

    config = spec.train
    device = select_device(config.device)
    history: list[dict[str, Any]] = []
    states: dict[int | float, dict[str, torch.Tensor]] = {}
    best = math.inf

    def measure(epoch: float, model, record: dict | None = None) -> None:
        nonlocal best
        started = time.perf_counter()
        familiar = _error(model, tests["familiar"], config.eval_batch_size, device)
        candidate = familiar < best
        novel = None  # measured where it can be compared: a candidate, or an epoch's end
        if candidate or record is not None:
            novel = _error(model, tests["novel"], config.eval_batch_size, device)
        epoch = epoch_label(epoch)
        entry: dict[str, Any] = {"epoch": epoch, "familiar_error": familiar, "novel_error": novel}
        if record is not None:
            entry |= {
                "train_loss": float(record["train_loss"]),
                "train_accuracy": float(record["train_accuracy"]),
                "seconds": float(record["seconds"]),  # training alone, not the checks
            }
            if "check_seconds" in record:
                entry["check_seconds"] = float(record["check_seconds"])
        history.append(entry | {"eval_seconds": time.perf_counter() - started})
        if candidate:  # a candidate for the match: keep a CPU copy of the weights
            best = familiar
            states[epoch] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        if record is not None:
            log(
                f"{label} epoch {epoch}/{config.epochs}: familiar error {familiar:.4f}, "
                f"novel error {novel:.4f} ({record['seconds']:.1f} s)"
            )

    result = train_run(
        spec, split, on_epoch=lambda record, state, model: measure(record["epoch"], model, record),
        checks_per_epoch=checks_per_epoch, on_check=measure,
    )  # fmt: skip
    return result, history, states


def run_kind(params, data_root: str | Path, kind: str, out_dir: Path, log: Log,
             runner: Runner | None = None) -> dict[str, dict]:  # fmt: skip
    """Train both models on ``kind`` with each of ``viewpoints.seeds`` seeds (each model
    through ``runner``: in this process, or where the caller sends it, e.g. a GPU worker),
    select the matched epochs per seed, save the checkpoints under ``out_dir/<kind>/``;
    returns viewpoints.json's entries of this kind, keyed ``kind`` for the first seed and
    ``kind@seed<k>`` for the others (``run_name``)."""
    from capsnet.training.run import load_split

    settings = params.viewpoints
    seeds = settings.seed_list()
    specs = {role: kind_spec(params, data_root, kind, role) for role in ("capsules", "cnn")}
    split = load_split(specs["capsules"])  # the same familiar images for both models, all seeds
    tests = load_tests(specs["capsules"], kind, settings.test_limit)
    data = {"train": split.train, **tests}
    log(
        f"[{kind}] {len(data['train'])} familiar training images; test: "
        f"{len(data['familiar'])} familiar, {len(data['novel'])} novel"
        + (f"; seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else "")
    )
    sizes = {
        "train_size": len(data["train"]),
        "familiar_test_size": len(data["familiar"]),
        "novel_test_size": len(data["novel"]),
    }
    entries = {}
    for seed in seeds:
        key = run_name(kind, "", seed, seeds[0])
        seeded = {r: kind_spec(params, data_root, kind, r, seed) for r in ("capsules", "cnn")}
        entries[key] = _run_seed(settings, kind, key, seed, seeded, split, tests, out_dir, log,
                                 runner) | sizes  # fmt: skip
    return entries


def _run_seed(settings, kind: str, key: str, seed: int, specs: dict, split, tests, out_dir: Path,
              log: Log, runner: Runner | None) -> dict:  # fmt: skip
    """Both models of one seed on ``kind``: trained, matched, saved; the entry of ``key``."""
    trained: dict[str, dict[str, Any]] = {}
    for role, spec in specs.items():
        label = f"[{key}] {spec.model}"
        checks = getattr(settings.checks_per_epoch, role)
        result, history, states = (runner or _here)(
            train_tracked, spec, split, tests, log, label, checks
        )
        trained[role] = {
            "model": result.model, "config": result.train_config, "history": history,
            "states": states, "data": result.data,
        }  # fmt: skip

    histories = {r: t["history"] for r, t in trained.items()}
    selection = select_matched(histories, settings.tolerance, settings.match)
    names = {r: run_name(settings.model_name(r), "", seed, settings.seed) for r in trained}
    models_entry = {
        role: _save_selected(
            t, role, selection, kind, settings, out_dir, len(split.train), names[role]
        )
        for role, t in trained.items()
    }
    caps, cnn = selection["models"]["capsules"], selection["models"]["cnn"]
    log(
        f"[{key}] {'matched' if selection['matched'] else 'NOT matched'} at "
        f"{selection['target_familiar_error']:.2%} (gap {selection['gap']:.2%} of "
        f"{settings.tolerance:.2%}): novel capsules {caps['novel_error']:.2%} "
        f"(epoch {caps['epoch']}), CNN {cnn['novel_error']:.2%} (epoch {cnn['epoch']})"
    )
    return {
        "kind": kind,
        "seed": seed,
        "train_subset": f"{kind}-familiar",
        "familiar_subset": f"{kind}-familiar",
        "novel_subset": f"{kind}-novel",
        "models": models_entry,
        "selection": selection,
        "paper_novel_error": PAPER_NOVEL_ERROR[kind],
    }


def _save_selected(trained: dict, role: str, selection: dict, kind: str, settings, out_dir,
                   train_size: int, name: str) -> dict[str, Any]:  # fmt: skip
    """Load the selected epoch's weights, save ``<kind>/<name>.pt`` (``name``: the model's,
    with the seed after "@" but for the first); return its entry."""
    from capsnet.config import to_dict
    from capsnet.models import checkpoint

    model, chosen = trained["model"], selection["models"][role]
    model.load_state_dict(trained["states"][chosen["epoch"]])
    relative = f"{kind}/{name}.pt"
    metrics = {
        "experiment": "viewpoints", "kind": kind, "role": role, "epoch": chosen["epoch"],
        "familiar_error": chosen["familiar_error"], "novel_error": chosen["novel_error"],
        "history": trained["history"], "selection": selection,
    }  # fmt: skip
    extra = {"train_subset": f"{kind}-familiar", "channels": settings.channels}
    extra |= {"data": trained["data"]}
    checkpoint.save(
        out_dir / relative, model, train_config=trained["config"].to_dict(), metrics=metrics,
        extra={**extra, "train_size": train_size},
    )  # fmt: skip
    return {
        "model": settings.model_name(role),
        "checkpoint": relative,
        "config": to_dict(model.config),
        "train_config": trained["config"].to_dict(),
        "epochs": settings.epochs_of(role),
        "checks_per_epoch": getattr(settings.checks_per_epoch, role),
        "history": trained["history"],
    }


# --- outputs ------------------------------------------------------------------------------------


def csv_text(kinds: Mapping[str, Mapping[str, Any]]) -> str:
    """The CSV of ``csv_path``: one row per (kind, seed, model, epoch); only the header
    without results."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for entry in kinds.values():
        for model in entry["models"].values():
            for record in model["history"]:
                writer.writerow(
                    [
                        entry["kind"],
                        entry["seed"],
                        model["model"],
                        record["epoch"],
                        f"{record['familiar_error']:.6f}",
                        _csv_number(record.get("novel_error")),
                    ]
                )
    return buffer.getvalue()


def _csv_number(value) -> str:
    """A CSV cell: the error to 6 places, empty where it was not measured."""
    return "" if value is None else f"{value:.6f}"


def write_disabled(out_dir: str | Path, reason: str) -> Path:
    """``out_dir`` holding only DISABLED.txt and viewpoints.json {"disabled": reason}, and
    the header of ``<out_dir>.csv`` (DVC needs the outputs to exist), published as one unit."""
    out = Path(out_dir)
    header = {csv_path(out): csv_text({})}
    return outputset.write_disabled(out, reason, [out / RESULTS_FILE], header, own=OUT_DIR_FILES)


#: What each viewpoints W&B run's summary holds from its selection (and ``matched``).
SUMMARY_KEYS = ("target_familiar_error", "gap", "tolerance", "matched")


def track(kinds: Mapping[str, Mapping[str, Any]], rule: str, wandb, experiment: str) -> list[str]:
    """One W&B run per entry of ``kinds`` (a kind and seed) and model, job_type
    "viewpoints" in group ``<experiment>/viewpoints`` (``wandb``: a ``WandbConfig``): its
    per-check history (epoch, familiar and novel error, ...) one row per check, and in its
    summary the check selected, the match verdict (SUMMARY_KEYS) and the paper's novel
    error. Returns the run ids; none when W&B is disabled."""
    from pipeline import provenance, tracking

    mode = tracking.prepare_environment(wandb.mode)
    if mode == "disabled":
        return []
    ids, dataset = [], dataset_specs.viewpoint_dataset()
    try:
        for key, entry in kinds.items():
            selection = entry["selection"]
            for role, model in entry["models"].items():
                config = {
                    "dataset": dataset, "kind": entry["kind"], "seed": entry["seed"],
                    "entry": key, "role": role, "model": model["model"], "rule": rule,
                    "checkpoint": model["checkpoint"], "epochs": model["epochs"],
                    "checks_per_epoch": model["checks_per_epoch"],
                }  # fmt: skip
                content = {"history": model["history"], "selection": selection}
                run = tracking.start_run(
                    wandb.project, experiment, f"viewpoints-{key}-{model['model']}", mode,
                    wandb.dir, config, job_type="viewpoints",
                    content=provenance.content_hash(content),
                )  # fmt: skip
                for check, record in enumerate(model["history"]):
                    run.log(dict(record), step=check)  # an epoch may be fractional
                chosen = selection["models"][role]
                run.summary.update(
                    {k: selection[k] for k in SUMMARY_KEYS}
                    | {
                        "selected_" + k: chosen[k]
                        for k in ("epoch", "familiar_error", "novel_error")
                    }
                    | {"paper_novel_error": entry["paper_novel_error"].get(role)}
                )
                ids.append(run.id)
                run.finish()
    finally:
        tracking.finish_all([])
    return ids


def run(params, data_root: str | Path = DATA_ROOT, log: Log | None = None,
        runner: Runner | None = None) -> dict[str, Any]:  # fmt: skip
    """The experiment for a ``config.Params`` (section ``viewpoints``); writes
    ``viewpoints.out_dir`` and its CSV as one unit and returns viewpoints.json's content.
    ``runner(fn, *args)`` runs each model's training (default: in this process)."""
    from capsnet.config import to_dict
    from capsnet.data.stages import why_off

    say = log or (lambda line: None)
    settings = params.viewpoints
    reason = why_off(params, dataset_specs.viewpoint_dataset(), data_root)
    if reason is not None:
        write_disabled(settings.out_dir, reason)
        return {"disabled": reason}
    check_models(settings)
    started = time.perf_counter()
    with outputset.OutputSet() as outputs:  # the directory and its CSV land together
        table = csv_path(settings.out_dir)
        outputset.refuse_target(table)  # before any training
        tmp = outputs.directory(settings.out_dir, OUT_DIR_FILES)
        kinds = {
            key: entry
            for kind in settings.kinds
            for key, entry in run_kind(params, data_root, kind, tmp, say, runner).items()
        }
        payload = {
            "experiment": "novel viewpoints (smallNORB; Hinton et al. 2018, section 5.2)",
            "rule": RULES[settings.match],
            "settings": to_dict(settings),
            "data": {
                "crop": params.data.smallnorb.crop,
                "brightness": params.data.smallnorb.brightness,
                "contrast": params.data.smallnorb.contrast,
            },
            "paper": {"note": PAPER_NOTE, "novel_error": PAPER_NOVEL_ERROR},
            "kinds": kinds,
            "seconds": time.perf_counter() - started,
        }
        atomic_write_text(tmp / RESULTS_FILE, json.dumps(payload, indent=2) + "\n")
        outputs.file(table, csv_text(kinds))
    say(f"viewpoints: wrote {settings.out_dir}")
    norb = params.smallnorb_sweep
    runs = track(kinds, payload["rule"], norb.wandb, norb.name)
    if runs:
        from pipeline.tracking import workspace_path

        say(f"viewpoints: {len(runs)} W&B run(s) under {workspace_path(norb.wandb.dir) / 'wandb'}")
    return payload
