"""The novel-viewpoint experiment (Hinton, Sabour, Frosst 2018, section 5.2; SPEC 2.3).

For each kind (azimuth, elevation), the capsule model and the CNN are trained on the
familiar viewpoints of the smallNORB training set (``<kind>-familiar``: azimuths 300..40
degrees, or the three lowest elevations) with ``capsnet.train.fit``. After every epoch each
model's error is measured on the familiar and the novel viewpoints of the test set.

The paper compares the two on novel viewpoints at matched familiar error (it stopped
training the capsules when they matched the CNN's familiar error). ``select_matched`` does
this after the fact: the target is the larger of the two models' best familiar errors (the
level both reach), and each model is taken at its FIRST epoch whose familiar error is at or
below the target. The result names the chosen epochs, their familiar and novel errors, the
familiar-error gap that remains and whether it is within the tolerance.

``run(params, data_root)`` writes, atomically as one directory, ``<out_dir>/<kind>/<model>.pt``
(the selected weights, with the history and selection in the checkpoint's metrics)
and ``<out_dir>/viewpoints.json``, then ``<out_dir>.csv`` beside the directory (kind, model,
epoch, familiar_error, novel_error; a small file git keeps, so `dvc plots show` draws it on a
fresh clone). With smallNORB switched off it writes ``DISABLED.txt`` and ``viewpoints.json``
= {"disabled": reason}, never numbers, and the CSV's header.

torch only: no Ray, DVC or W&B here.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from capsnet.config import DATA_ROOT
from capsnet.errors import ConfigError, DataError

RESULTS_FILE = "viewpoints.json"
CSV_COLUMNS = ("kind", "model", "epoch", "familiar_error", "novel_error")
# Test error on the novel viewpoints at matched familiar error (paper section 5.2, SPEC 2.3).
PAPER_NOVEL_ERROR = {
    "azimuth": {"cnn": 0.20, "capsules": 0.135},
    "elevation": {"cnn": 0.178, "capsules": 0.123},
}
PAPER_NOTE = (
    "Hinton, Sabour, Frosst 2018, section 5.2: smallNORB test error on novel viewpoints of "
    "the baseline CNN and the capsules at matched familiar-viewpoint error"
)
RULE = (
    "target = the larger of the models' best familiar test errors; each model is taken at "
    "its first epoch whose familiar error is <= target"
)

Log = Callable[[str], None]
#: Calls ``fn(*args)`` somewhere and returns its value (the caller's choice of device).
Runner = Callable[..., Any]


def _here(fn: Callable, *args):
    return fn(*args)


# --- the matching rule (pure) -------------------------------------------------------------------


def select_matched(
    histories: Mapping[str, Sequence[Mapping[str, Any]]], tolerance: float = 0.0
) -> dict[str, Any]:
    """The matched pair of epochs for per-model histories.

    ``histories``: {model or role: [{"epoch", "familiar_error", "novel_error"}, ...]} in
    epoch order. Returns {"target_familiar_error", "gap", "tolerance", "matched", "models":
    {key: {"epoch", "familiar_error", "novel_error", "best_familiar_error"}}}, where
    target = max over models of their minimum familiar error, each model's epoch is the
    first whose familiar error <= target, gap = the spread of the chosen familiar errors and
    matched = gap <= tolerance. ValueError for no models, an empty history or a NaN error.
    """
    if not histories:
        raise ValueError("select_matched needs at least one model history")
    best: dict[str, float] = {}
    for key, history in histories.items():
        errors = [float(record["familiar_error"]) for record in history]
        if not errors:
            raise ValueError(f"{key}: empty history (no epoch was measured)")
        if any(math.isnan(e) for e in errors):
            raise ValueError(f"{key}: a familiar error is NaN (empty test subset?)")
        best[key] = min(errors)
    target = max(best.values())
    chosen: dict[str, dict[str, Any]] = {}
    for key, history in histories.items():
        index = next(i for i, r in enumerate(history) if float(r["familiar_error"]) <= target)
        record = history[index]
        novel = record.get("novel_error")
        chosen[key] = {
            "epoch": int(record.get("epoch", index + 1)),
            "familiar_error": float(record["familiar_error"]),
            "novel_error": None if novel is None else float(novel),
            "best_familiar_error": best[key],
        }
    familiar = [c["familiar_error"] for c in chosen.values()]
    gap = max(familiar) - min(familiar)
    return {
        "target_familiar_error": target,
        "gap": gap,
        "tolerance": float(tolerance),
        "matched": bool(gap <= tolerance + 1e-12),
        "models": chosen,
    }


def candidate_epochs(familiar_errors: Sequence[float]) -> list[int]:
    """1-based epochs that ``select_matched`` can ever choose: those whose familiar error is
    a new strict minimum (an epoch at or above an earlier one is never the first <= any
    target). Only these epochs' weights need keeping."""
    out, low = [], math.inf
    for epoch, error in enumerate(familiar_errors, start=1):
        if error < low:
            out.append(epoch)
            low = error
    return out


# --- data -------------------------------------------------------------------------------------


def disabled_reason(params, data_root: str | Path) -> str | None:
    """Why the experiment cannot run on this params file and data root, or None."""
    from capsnet.io import DISABLED_MARKER, is_disabled

    if not params.data.smallnorb.enabled:
        return (
            "smallnorb is switched off (data.smallnorb.enabled: false in params.yaml); "
            "no novel-viewpoint experiment was run"
        )
    prepared = Path(data_root) / "prepared" / "smallnorb"
    if is_disabled(prepared):
        marker = (prepared / DISABLED_MARKER).read_text().strip()
        return f"{prepared} holds no data ({marker}); run `dvc repro prepare_smallnorb`"
    return None


def kind_spec(params, data_root: str | Path, kind: str, role: str):
    """The RunSpec of ``role`` (capsules or cnn) on the familiar viewpoints of ``kind``:
    random crops of the familiar training subset (first ``train_limit``), no validation."""
    from capsnet.run import RunSpec
    from capsnet.train import TrainConfig

    settings = params.viewpoints
    return RunSpec(
        model=settings.model_name(role),
        train=TrainConfig(
            epochs=settings.epochs, batch_size=settings.batch_size, lr=settings.lr,
            weight_decay=getattr(settings.weight_decay, role), seed=settings.seed,
            device=settings.device, compile=settings.compile,
            amp=settings.amp or TrainConfig.amp,
        ),
        overrides=dict(getattr(settings.overrides, role)),
        dataset="smallnorb",
        subset=f"{kind}-familiar",
        channels=settings.channels,
        train_size=settings.train_limit,
        val_size=0,
        smallnorb=params.data.smallnorb,
        data_root=data_root,
    )  # fmt: skip


def load_tests(spec, kind: str, limit: int | None) -> dict[str, Any]:
    """{"familiar", "novel"}: the first ``limit`` familiar and novel test items of ``kind``."""
    from capsnet.run import load_test

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
            models.spec(name)
        except ConfigError as exc:
            raise ConfigError(f"params: viewpoints.{role}: {exc}") from None
        try:
            models.make_config(name, (1, 32, 5), **getattr(settings.overrides, role))
        except ConfigError as exc:
            raise ConfigError(f"params: viewpoints.overrides.{role}: {exc}") from None


def _error(model, dataset, batch_size: int, device) -> float:
    from capsnet.evaluate import accuracy

    return 1.0 - accuracy(model, dataset, batch_size, device)["accuracy"]


def train_tracked(spec, split, tests: Mapping[str, Any], log: Log, label: str):
    """Train ``spec`` through ``capsnet.run``; after each epoch measure the error on
    tests["familiar"] and tests["novel"]. Returns (RunResult, history, {epoch: CPU
    state_dict}) keeping the weights of every epoch ``select_matched`` could choose
    (``candidate_epochs``)."""
    from capsnet.run import train_run
    from capsnet.train import select_device

    config = spec.train
    device = select_device(config.device)
    history: list[dict[str, Any]] = []
    states: dict[int, dict[str, torch.Tensor]] = {}
    best = math.inf

    def on_epoch(record: dict, state, model) -> None:
        nonlocal best
        started = time.perf_counter()
        familiar = _error(model, tests["familiar"], config.eval_batch_size, device)
        novel = _error(model, tests["novel"], config.eval_batch_size, device)
        epoch = int(record["epoch"])
        history.append(
            {
                "epoch": epoch,
                "familiar_error": familiar,
                "novel_error": novel,
                "train_loss": float(record["train_loss"]),
                "train_accuracy": float(record["train_accuracy"]),
                "seconds": float(record["seconds"]),
                "eval_seconds": time.perf_counter() - started,
            }
        )
        if familiar < best:  # a candidate for the match: keep a CPU copy of the weights
            best = familiar
            states[epoch] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        log(
            f"{label} epoch {epoch}/{config.epochs}: familiar error {familiar:.4f}, "
            f"novel error {novel:.4f} ({record['seconds']:.1f} s)"
        )

    result = train_run(spec, split, on_epoch=on_epoch)
    return result, history, states


def run_kind(params, data_root: str | Path, kind: str, out_dir: Path, log: Log,
             runner: Runner | None = None) -> dict:  # fmt: skip
    """Train both models on ``kind`` (each through ``runner``: in this process, or where
    the caller sends it, e.g. a GPU worker), select the matched epochs, save both
    checkpoints under ``out_dir/<kind>/``; returns this kind's entry of viewpoints.json."""
    from capsnet.run import load_split

    settings = params.viewpoints
    specs = {role: kind_spec(params, data_root, kind, role) for role in ("capsules", "cnn")}
    split = load_split(specs["capsules"])  # the same familiar images for both models
    tests = load_tests(specs["capsules"], kind, settings.test_limit)
    data = {"train": split.train, **tests}
    log(
        f"[{kind}] {len(data['train'])} familiar training images; test: "
        f"{len(data['familiar'])} familiar, {len(data['novel'])} novel"
    )
    trained: dict[str, dict[str, Any]] = {}
    for role, spec in specs.items():
        label = f"[{kind}] {spec.model}"
        result, history, states = (runner or _here)(train_tracked, spec, split, tests, log, label)
        trained[role] = {
            "model": result.model, "config": result.train_config, "history": history,
            "states": states, "data": result.data,
        }  # fmt: skip

    selection = select_matched({r: t["history"] for r, t in trained.items()}, settings.tolerance)
    models_entry = {
        role: _save_selected(t, role, selection, kind, settings, out_dir, len(split.train))
        for role, t in trained.items()
    }
    caps, cnn = selection["models"]["capsules"], selection["models"]["cnn"]
    log(
        f"[{kind}] matched at familiar error {selection['target_familiar_error']:.4f} "
        f"(gap {selection['gap']:.4f}, {'within' if selection['matched'] else 'outside'} "
        f"tolerance {settings.tolerance:g}): novel error capsules {caps['novel_error']:.4f} "
        f"(epoch {caps['epoch']}), CNN {cnn['novel_error']:.4f} (epoch {cnn['epoch']})"
    )
    return {
        "train_subset": f"{kind}-familiar",
        "familiar_subset": f"{kind}-familiar",
        "novel_subset": f"{kind}-novel",
        "train_size": len(data["train"]),
        "familiar_test_size": len(data["familiar"]),
        "novel_test_size": len(data["novel"]),
        "models": models_entry,
        "selection": selection,
        "paper_novel_error": PAPER_NOVEL_ERROR[kind],
    }


def _save_selected(trained: dict, role: str, selection: dict, kind: str, settings, out_dir,
                   train_size: int) -> dict[str, Any]:  # fmt: skip
    """Load the selected epoch's weights, save ``<kind>/<model>.pt``; return its entry."""
    from capsnet import checkpoint

    model, chosen = trained["model"], selection["models"][role]
    name = settings.model_name(role)
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
        "model": name,
        "checkpoint": relative,
        "config": _plain(vars(model.config)),
        "train_config": trained["config"].to_dict(),
        "epochs": settings.epochs,
        "history": trained["history"],
    }


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# --- outputs ------------------------------------------------------------------------------------


def csv_path(out_dir: str | Path) -> Path:
    """The per-epoch CSV of ``out_dir``: ``<out_dir>.csv``, beside the directory."""
    out = Path(out_dir)
    return out.with_name(out.name + ".csv")


def csv_text(kinds: Mapping[str, Mapping[str, Any]]) -> str:
    """The CSV of ``csv_path``: one row per (kind, model, epoch); only the header without
    results."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for kind, entry in kinds.items():
        for model in entry["models"].values():
            for record in model["history"]:
                writer.writerow(
                    [
                        kind,
                        model["model"],
                        record["epoch"],
                        f"{record['familiar_error']:.6f}",
                        f"{record['novel_error']:.6f}",
                    ]
                )
    return buffer.getvalue()


def _write_text(path: Path, text: str) -> Path:
    from capsnet.io import atomic_write_bytes

    atomic_write_bytes(path, text.encode())
    return path


def _json(payload) -> str:
    return json.dumps(payload, indent=2) + "\n"


def write_disabled(out_dir: str | Path, reason: str) -> Path:
    """``out_dir`` holding only DISABLED.txt, viewpoints.json {"disabled": reason} and the
    header of ``<out_dir>.csv`` (DVC needs the outputs to exist), swapped in atomically."""
    from capsnet.io import DISABLED_MARKER, atomic_directory

    with atomic_directory(out_dir) as tmp:
        _write_text(tmp / DISABLED_MARKER, reason.rstrip() + "\n")
        _write_text(tmp / RESULTS_FILE, _json({"disabled": reason}))
    _write_text(csv_path(out_dir), csv_text({}))
    return Path(out_dir)


def run(params, data_root: str | Path = DATA_ROOT, log: Log | None = None,
        runner: Runner | None = None) -> dict[str, Any]:  # fmt: skip
    """The experiment for a ``config.Params`` (section ``viewpoints``); writes
    ``viewpoints.out_dir`` as one atomic directory and returns viewpoints.json's content.
    ``runner(fn, *args)`` runs each model's training (default: in this process)."""
    from capsnet.config import to_dict
    from capsnet.io import atomic_directory

    say = log or (lambda line: None)
    settings = params.viewpoints
    reason = disabled_reason(params, data_root)
    if reason is not None:
        write_disabled(settings.out_dir, reason)
        return {"disabled": reason}
    check_models(settings)
    started = time.perf_counter()
    with atomic_directory(settings.out_dir) as tmp:
        kinds = {
            kind: run_kind(params, data_root, kind, tmp, say, runner) for kind in settings.kinds
        }
        payload = {
            "experiment": "novel viewpoints (smallNORB; Hinton et al. 2018, section 5.2)",
            "rule": RULE,
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
        _write_text(tmp / RESULTS_FILE, _json(payload))
    _write_text(csv_path(settings.out_dir), csv_text(kinds))
    say(f"viewpoints: wrote {settings.out_dir}")
    return payload


def read_results(out_dir: str | Path) -> tuple[dict | None, str | None]:
    """(viewpoints.json content, None), or (None, why there are no results) for a missing,
    switched-off or unreadable ``out_dir``."""
    from capsnet.errors import CapsnetError
    from capsnet.io import DISABLED_MARKER, is_disabled, read_json

    out = Path(out_dir)
    if not out.is_dir():
        return None, f"{out} not found (run `capsnet viewpoints` or `dvc repro viewpoints`)"
    if is_disabled(out):
        return None, (out / DISABLED_MARKER).read_text().strip()
    path = out / RESULTS_FILE
    try:
        payload = read_json(path)
    except CapsnetError as exc:
        return None, str(exc)
    if not isinstance(payload, dict) or not isinstance(payload.get("kinds"), dict):
        return None, f"{path}: no per-kind results"
    return payload, None
