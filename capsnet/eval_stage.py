"""The evaluation stage (issue 5): checkpoints x datasets -> one JSON schema, CSV and figures.

``evaluate_checkpoints(paths, datasets, options)`` returns
{"<name>": {"model", "checkpoint", "mnist": {"accuracy", "n"}, "rotated-mnist": {"n",
"accuracy": {"<angle>": x}}, "affnist": {"source", "accuracy", "n"}, "multimnist":
{"strict_accuracy", "at_least_one", "half_credit", "n"}, "robustness": {...},
"equivariance": {...}}}; a dataset that does not fit a model is {"skipped": reason}.
Several checkpoints of one model (seeds) add an entry with the mean of every number and
the standard deviations under "std". ``write_outputs(results, out_dir)`` writes
metrics.json, rotation.csv and the PNG figures, each atomically.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from capsnet import evaluate
from capsnet.errors import CapsnetError, DataError

SMALLNORB_CLASSES = 5
MNIST_CLASSES = 10


@dataclass
class EvalOptions:
    """What to evaluate and how; mirrors params.yaml ``evaluate`` (capsnet/eval_config.py)."""

    angles: Sequence[float] = (0.0, 15.0, 30.0, 35.0, 45.0, 60.0, 90.0, 135.0, 180.0)
    limit: int | None = None
    batch_size: int = evaluate.EVAL_BATCH_SIZE
    device: str | torch.device = "cpu"
    data_root: str | Path | None = None
    mirror: str | None = None
    robustness: bool = False
    epsilons: Sequence[float] = (0.05, 0.1, 0.2, 0.3)
    bim_steps: int = 10
    robustness_limit: int | None = 500
    equivariance: bool = False
    equivariance_angles: Sequence[float] = (-60.0, -45.0, -30.0, -15.0, 0.0, 15.0, 30.0, 45.0, 60.0)
    equivariance_limit: int | None = 300
    confusion_angle: float = 35.0
    figure_examples: int = 8
    log: Callable[[str], None] | None = field(default=None, repr=False)

    @classmethod
    def from_params(cls, params, data_root=None, mirror=None, **overrides) -> EvalOptions:
        """From an ``EvaluateParams`` (params.yaml ``evaluate``)."""
        values = dict(
            angles=tuple(params.angles),
            limit=params.limit,
            batch_size=params.batch_size,
            device=params.device,
            data_root=data_root,
            mirror=mirror,
            robustness=params.robustness.enabled,
            epsilons=tuple(params.robustness.epsilons),
            bim_steps=params.robustness.bim_steps,
            robustness_limit=params.robustness.limit,
            equivariance=params.equivariance.enabled,
            equivariance_angles=tuple(params.equivariance.angles),
            equivariance_limit=params.equivariance.limit,
            confusion_angle=params.confusion_angle,
            figure_examples=params.figure_examples,
        )
        values.update(overrides)
        return cls(**values)

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)


def checkpoint_names(paths: Sequence[str | Path]) -> list[str]:
    """Readable unique names: the file stem, or its folder for a generic 'model.pt'."""
    paths = [Path(p) for p in paths]
    names = [
        p.parent.name if p.stem in ("model", "checkpoint") and p.parent.name else p.stem
        for p in paths
    ]
    if len(set(names)) != len(names):
        names = [str(p) for p in paths]
    return names


# --- datasets ---------------------------------------------------------------------------------


class _Datasets:
    """Test sets loaded once and shared by every checkpoint: name -> (dataset, extra info)."""

    def __init__(self, options: EvalOptions):
        self.options = options
        self.root = Path(options.data_root) if options.data_root is not None else None
        self._cache: dict[tuple, tuple[Any, dict]] = {}

    def _load(self, name: str, **kwargs):
        from capsnet.data.datasets import load

        return load(
            name,
            "test",
            self.root,
            mirror=self.options.mirror,
            progress=sys.stderr.isatty(),
            **kwargs,
        )

    def get(self, name: str, channels: int = 1) -> tuple[Any, dict]:
        """(TensorImageDataset limited to ``options.limit``, info) for an evaluation name."""
        key = (name, channels if name.startswith("smallnorb") else 1)
        if key in self._cache:
            return self._cache[key]
        limit = self.options.limit
        info: dict[str, Any] = {}
        if name in ("mnist", "rotated-mnist"):
            dataset = self._load("mnist").subset(limit)  # rotations are applied in memory
        elif name == "affnist":
            from capsnet.data import affnist

            dataset, source = affnist.evaluation_set(
                self.root if self.root is not None else _default_root(), mirror=self.options.mirror
            )
            dataset, info = dataset.subset(limit), {"source": source}
        elif name == "affnist-synth":
            dataset, info = self._load("affnist-synth").subset(limit), {"source": "affnist-synth"}
        elif name == "expanded-mnist":
            dataset = self._load("expanded-mnist").subset(limit)
        elif name == "multimnist":
            dataset = self._load("multimnist").materialize(limit)
        elif name.startswith("smallnorb"):
            subset = name[len("smallnorb-") :] if name != "smallnorb" else "all"
            dataset = self._load("smallnorb", subset=subset, channels=tuple(range(channels)))
            dataset, info = dataset.subset(limit), {"subset": subset}
        else:
            from capsnet.eval_config import EVAL_DATASETS

            raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(EVAL_DATASETS)}")
        self._cache[key] = (dataset, info)
        return dataset, info


def _default_root() -> Path:
    from capsnet.data.datasets import DEFAULT_ROOT

    return DEFAULT_ROOT


def _image_shape(name: str) -> tuple[int, int] | None:
    """(size, classes) a dataset needs, known without loading it (None: ask the data)."""
    if name in ("mnist", "rotated-mnist"):
        return 28, MNIST_CLASSES
    if name in ("affnist", "affnist-synth", "expanded-mnist"):
        return 40, MNIST_CLASSES
    return None


def model_fit(model, name: str, dataset=None) -> str | None:
    """Why ``model`` cannot take dataset ``name`` (image size, channels, classes), or None."""
    config = model.config
    size, channels = int(config.input_size), int(config.in_channels)
    classes = int(config.num_classes)
    if dataset is not None:
        _, need_channels, need_size, width = dataset.tensors[0].shape  # (N, C, H, W)
        if width != need_size:
            return f"images are {need_size}x{width}, the model takes square {size}x{size}"
        need_classes = (
            SMALLNORB_CLASSES
            if name.startswith("smallnorb")
            else int(dataset.tensors[1].shape[-1])
            if dataset.tensors[1].dim() == 2
            else MNIST_CLASSES
        )
    else:
        need_size, need_classes = _image_shape(name)
        need_channels = 1
    reasons = []
    if need_size != size:
        reasons.append(f"images are {need_size}x{need_size}, the model takes {size}x{size}")
    if need_channels != channels and not name.startswith("smallnorb"):
        reasons.append(f"images have {need_channels} channel(s), the model {channels}")
    if need_classes != classes:
        reasons.append(f"{need_classes} classes, the model has {classes}")
    return "; ".join(reasons) or None


# --- evaluation --------------------------------------------------------------------------------


def evaluate_checkpoints(
    paths: Sequence[str | Path],
    datasets: Sequence[str],
    options: EvalOptions | None = None,
    names: Sequence[str] | None = None,
) -> dict[str, dict]:
    """Evaluate every checkpoint on every dataset; see the module docstring for the schema.

    All checkpoints are loaded (and so validated) before any data is read. ``names``: the
    entry names (default ``checkpoint_names(paths)``).
    """
    from capsnet import checkpoint

    options = options or EvalOptions()
    device = torch.device(options.device)
    loaded = [checkpoint.load(path, map_location="cpu") for path in paths]  # fail early
    data = _Datasets(options)
    results: dict[str, dict] = {}
    names = list(names) if names is not None else checkpoint_names(paths)
    for name, path, (model, meta) in zip(names, paths, loaded):
        model.to(device)
        options.say(f"evaluating {name} ({meta['model_name']})")
        entry: dict[str, Any] = {"model": meta["model_name"], "checkpoint": str(path)}
        for dataset_name in datasets:
            entry[dataset_name] = _evaluate_one(model, dataset_name, data, options, device)
        if options.robustness:
            entry["robustness"] = _robustness(model, data, options, device)
        if options.equivariance:
            entry["equivariance"] = _equivariance(model, data, options, device)
        results[name] = entry
        model.cpu()
    configs = {
        name: json.dumps(meta["model_config"], sort_keys=True, default=str)
        for name, (_, meta) in zip(results, loaded)
    }
    results.update(aggregate_seeds(results, configs))
    return results


def _evaluate_one(model, name: str, data: _Datasets, options: EvalOptions, device) -> dict:
    known = _image_shape(name)
    if known is not None:
        reason = model_fit(model, name)
        if reason is not None:
            return {"skipped": reason}
    channels = int(model.config.in_channels)
    try:
        dataset, info = data.get(name, channels)
    except DataError as exc:
        if not name.startswith("smallnorb"):
            raise
        return {"skipped": f"no data: {exc}"}
    reason = model_fit(model, name, dataset)
    if reason is not None:
        return {"skipped": reason, **info}
    if name == "rotated-mnist":
        return evaluate.rotation_sweep(model, dataset, options.angles, options.batch_size, device)
    if name == "multimnist":
        return evaluate.evaluate_multimnist(model, dataset, options.batch_size, device)
    return {**info, **evaluate.accuracy(model, dataset, options.batch_size, device)}


def _robustness(model, data: _Datasets, options: EvalOptions, device) -> dict:
    reason = model_fit(model, "mnist")
    if reason is not None:
        return {"skipped": f"MNIST does not fit: {reason}"}
    dataset, _ = data.get("mnist")
    result = evaluate.robustness(
        model,
        dataset.subset(options.robustness_limit),
        epsilons=tuple(options.epsilons),
        bim_steps=options.bim_steps,
        batch_size=min(options.batch_size, 200),
        device=device,
    )
    return {"attack": "untargeted L-inf", "bim_steps": options.bim_steps, **result}


def _equivariance(model, data: _Datasets, options: EvalOptions, device) -> dict:
    reason = model_fit(model, "mnist")
    if reason is not None:
        return {"skipped": f"MNIST does not fit: {reason}"}
    dataset, _ = data.get("mnist")
    result = evaluate.pose_equivariance(
        model,
        dataset.subset(options.equivariance_limit),
        options.equivariance_angles,
        options.batch_size,
        device,
    )
    return result if result is not None else {"skipped": "the model has no capsule poses"}


# --- several checkpoints of one model ---------------------------------------------------------


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _combine(values: list) -> tuple[Any, Any]:
    """(mean tree, std tree) of equally shaped JSON values; (None, None) where they differ."""
    first = values[0]
    if all(_is_number(v) for v in values):
        clean = [float(v) for v in values]
        if any(math.isnan(v) for v in clean):
            return float("nan"), float("nan")
        return statistics.fmean(clean), statistics.stdev(clean) if len(clean) > 1 else 0.0
    if isinstance(first, dict) and all(isinstance(v, dict) for v in values):
        if "skipped" in first or any("skipped" in v for v in values):
            return (
                ({"skipped": first["skipped"]}, None)
                if all(v == first for v in values)
                else ({"skipped": "skipped for some of the checkpoints"}, None)
            )
        means, stds = {}, {}
        for key in first:
            if key == "n" and all(v.get("n") == first["n"] for v in values):
                means["n"] = first["n"]
                continue
            if not all(key in v for v in values):
                continue
            mean, std = _combine([v[key] for v in values])
            if mean is not None:
                means[key] = mean
            if std is not None:
                stds[key] = std
        return means, stds or None
    if isinstance(first, list) and all(
        isinstance(v, list) and len(v) == len(first) for v in values
    ):
        pairs = [_combine([v[i] for v in values]) for i in range(len(first))]
        if all(m is not None for m, _ in pairs):
            stds = [s for _, s in pairs]
            return [m for m, _ in pairs], stds if all(s is not None for s in stds) else None
        return None, None
    if all(v == first for v in values):
        return first, None
    return None, None


def aggregate_seeds(
    results: dict[str, dict], configs: dict[str, str] | None = None
) -> dict[str, dict]:
    """For each model with several checkpoints of one config (``configs``: name -> model
    config as text; seeds differ only in weights): {"<model>" or "<model> (mean)": entry},
    holding the mean of every number, the deviations under "std" and "checkpoints"."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, entry in results.items():
        if "checkpoint" in entry:
            key = (entry["model"], (configs or {}).get(name, ""))
            groups.setdefault(key, []).append(name)
    out = {}
    for (model, _), names in groups.items():
        if len(names) < 2:
            continue
        entries = [results[n] for n in names]
        body = {k: v for k, v in entries[0].items() if k not in ("model", "checkpoint")}
        means, stds = {}, {}
        for key in body:
            if all(key in e for e in entries):
                mean, std = _combine([e[key] for e in entries])
                if mean is not None:
                    means[key] = mean
                if std is not None:
                    stds[key] = std
        key, i = model, 1
        while key in results or key in out:  # a checkpoint name, or another config's mean
            key, i = (f"{model} (mean)" if i == 1 else f"{model} (mean {i})"), i + 1
        out[key] = {
            "model": model,
            "checkpoints": [entries[i]["checkpoint"] for i in range(len(entries))],
            "seeds": len(entries),
            **means,
            "std": stds,
        }
    return out


# --- the novel-viewpoint experiment -----------------------------------------------------------

VIEWPOINTS_KEY = "viewpoints"  # metrics.json's section (not a checkpoint entry)


def evaluate_viewpoints(viewpoints_dir: str | Path, options: EvalOptions) -> dict:
    """metrics.json's "viewpoints" section from ``capsnet viewpoints``'s output directory.

    For each kind, both selected checkpoints are evaluated on the familiar and the novel
    test subsets (``options.limit`` applies). Returns {"rule", "paper", "kinds": {kind:
    {"models": {"capsules"|"cnn": {"model", "checkpoint", "epoch", "familiar_error",
    "familiar_n", "novel_error", "novel_n", "paper_novel_error"}}, "target_familiar_error",
    "gap", "tolerance", "matched", "selection", "paper_novel_error"}}}; {"skipped": reason}
    when the experiment did not run (missing or switched-off directory), and a kind whose
    test data is unavailable is {"skipped": reason}.
    """
    from capsnet import checkpoint, viewpoints

    payload, reason = viewpoints.read_results(viewpoints_dir)
    if payload is None:
        options.say(f"viewpoints: skipped: {reason}")
        return {"skipped": reason}
    device = torch.device(options.device)
    data = _Datasets(options)
    kinds: dict[str, dict] = {}
    for kind, entry in payload["kinds"].items():
        options.say(f"viewpoints: evaluating {kind}")
        selection = entry["selection"]
        paper = entry.get("paper_novel_error") or viewpoints.PAPER_NOVEL_ERROR.get(kind, {})
        models: dict[str, dict] = {}
        try:
            for role, info in entry["models"].items():
                path = Path(viewpoints_dir) / info["checkpoint"]
                model, meta = checkpoint.load(path, map_location="cpu")
                model.to(device)
                result: dict[str, Any] = {
                    "model": meta["model_name"],
                    "checkpoint": str(path),
                    "epoch": meta.get("metrics", {}).get("epoch"),
                }
                for which in ("familiar", "novel"):
                    name = f"smallnorb-{kind}-{which}"
                    dataset, _ = data.get(name, int(model.config.in_channels))
                    unfit = model_fit(model, name, dataset)
                    if unfit is not None:
                        raise DataError(f"{path}: {unfit}")
                    scored = evaluate.accuracy(model, dataset, options.batch_size, device)
                    result[f"{which}_error"] = 1.0 - scored["accuracy"]
                    result[f"{which}_n"] = scored["n"]
                result["paper_novel_error"] = paper.get(role)
                models[role] = result
                model.cpu()
        except DataError as exc:
            kinds[kind] = {"skipped": str(exc)}
            continue
        familiar = [m["familiar_error"] for m in models.values()]
        gap = max(familiar) - min(familiar)
        tolerance = float(selection.get("tolerance", 0.0))
        kinds[kind] = {
            "models": models,
            "target_familiar_error": selection["target_familiar_error"],
            "gap": gap,
            "tolerance": tolerance,
            "matched": bool(gap <= tolerance + 1e-12),
            "selection": selection,  # at training time, on viewpoints.test_limit images
            "paper_novel_error": paper,
        }
    return {"rule": viewpoints.RULE, "paper": viewpoints.PAPER_NOTE, "kinds": kinds}


def viewpoint_lines(section: dict | None) -> list[str]:
    """Summary lines for metrics.json's "viewpoints" section (none when absent)."""
    if not isinstance(section, dict):
        return []
    if "skipped" in section:
        return ["", f"novel viewpoints: skipped ({section['skipped']})"]
    lines = ["", "novel viewpoints (smallNORB), at matched familiar error; paper in brackets:"]
    rows = [["kind", "role", "model", "epoch", "familiar error", "novel error", "gap"]]
    for kind, entry in section.get("kinds", {}).items():
        if "skipped" in entry:
            lines.append(f"  {kind}: skipped ({entry['skipped']})")
            continue
        for role, m in entry["models"].items():
            paper = m.get("paper_novel_error")
            novel = f"{m['novel_error']:.4f}" + (f" ({paper:.3f})" if paper is not None else "")
            match = f"{entry['gap']:.4f} ({'matched' if entry['matched'] else 'NOT matched'})"
            familiar = f"{m['familiar_error']:.4f}"
            rows.append([kind, role, m["model"], str(m["epoch"]), familiar, novel, match])
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines


# --- outputs ------------------------------------------------------------------------------------


def _atomic_text(path: Path, text: str) -> Path:
    from capsnet.data.sources import atomic_write_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, text.encode())
    return path


def _finite(value):
    """JSON-safe: NaN and infinities become null (DVC and browsers reject NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def metrics_json(results: dict) -> str:
    return json.dumps(_finite(results), indent=2) + "\n"


def rotation_rows(results: dict) -> list[tuple[float, str, float]]:
    """(angle, model, accuracy) rows of every entry with a rotated-mnist sweep."""
    rows = []
    for name, entry in results.items():
        sweep = entry.get("rotated-mnist")
        if not isinstance(sweep, dict) or "accuracy" not in sweep:
            continue
        for angle, acc in sweep["accuracy"].items():
            rows.append((float(angle), name, acc))
    return sorted(rows, key=lambda r: (r[1], r[0]))


def rotation_csv(results: dict) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["angle", "model", "accuracy"])
    for angle, name, acc in rotation_rows(results):
        writer.writerow([evaluate.format_angle(angle), name, f"{acc:.6f}"])
    return buffer.getvalue()


def write_outputs(
    results: dict,
    out_dir: str | Path,
    options: EvalOptions | None = None,
    figures: bool = True,
) -> dict[str, Path]:
    """metrics.json, rotation.csv and (with ``figures``) figures/*.png under ``out_dir``.

    Figures that need a model (reconstructions, perturbations, confusion, MultiMNIST)
    reload each entry's checkpoint; returns {output name: path}.
    """
    options = options or EvalOptions()
    out = Path(out_dir)
    written = {
        "metrics": _atomic_text(out / "metrics.json", metrics_json(results)),
        "rotation_csv": _atomic_text(out / "rotation.csv", rotation_csv(results)),
    }
    if figures:
        written.update(write_figures(results, out / "figures", options))
    return written


def write_figures(results: dict, fig_dir: str | Path, options: EvalOptions) -> dict[str, Path]:
    """The PNG figures of the evaluation; returns {figure name: path}."""
    from capsnet import checkpoint, figures
    from capsnet.data.datasets import rotate_images

    fig_dir = Path(fig_dir)
    written: dict[str, Path] = {}
    curves = {
        name: e["rotated-mnist"]["accuracy"]
        for name, e in results.items()
        if "checkpoint" in e and "accuracy" in e.get("rotated-mnist", {})
    }
    if curves:
        written["rotation"] = figures.rotation_curve(curves, fig_dir / "rotation.png")
    diagnostics = {
        name: e["equivariance"]
        for name, e in results.items()
        if "checkpoint" in e and "dim_correlation" in e.get("equivariance", {})
    }
    if diagnostics:
        written["equivariance"] = figures.equivariance_plot(
            diagnostics, fig_dir / "equivariance.png"
        )
    singles = {name: e for name, e in results.items() if "checkpoint" in e}
    if not singles:
        return written
    device = torch.device(options.device)
    data = _Datasets(options)
    k = options.figure_examples
    angle = options.confusion_angle
    recon_rows, recon_labels = [], []
    for name, entry in singles.items():
        model, _ = checkpoint.load(entry["checkpoint"], map_location="cpu")
        model.to(device).eval()
        if model_fit(model, "mnist") is None:
            mnist, _ = data.get("mnist")
            images, labels = mnist.tensors  # (N, 1, 28, 28) uint8, (N,)
            rotated = rotate_images(images, angle)  # (N, 1, 28, 28)
            predicted = _predict_tensor(model, rotated, options.batch_size, device)
            written[f"confusion-{name}"] = figures.confusion_matrix(
                predicted,
                labels,
                int(model.config.num_classes),
                fig_dir / f"confusion-{_slug(name)}.png",
                title=f"{name}: MNIST rotated {evaluate.format_angle(angle)}°",
            )
            if getattr(model, "decoder", None) is not None:
                upright = images[:k].float() / 255  # (k, 1, 28, 28)
                tilted = rotated[:k].float() / 255
                recon_rows += [upright, _reconstruct(model, upright, device)]
                recon_rows += [tilted, _reconstruct(model, tilted, device)]
                a = evaluate.format_angle(angle)
                recon_labels += ["input 0°", f"{name}\n0°", f"input {a}°", f"{name}\n{a}°"]
                rows = figures.perturbation_rows(model.cpu(), upright[0], int(labels[0]))
                model.to(device)
                if rows:
                    written[f"perturbation-{name}"] = figures.image_grid(
                        rows,
                        fig_dir / f"perturbation-{_slug(name)}.png",
                        row_labels=[f"dim {d}" for d in range(len(rows))],
                        col_labels=[f"{d:+.2f}" for d in figures.PERTURBATION_DELTAS],
                        title=f"{name}: each pose dimension of the class capsule perturbed",
                    )
        multi = entry.get("multimnist")
        scored = isinstance(multi, dict) and "strict_accuracy" in multi
        if scored and getattr(model, "decoder", None) is not None:
            written[f"multimnist-{name}"] = _multimnist_figure(
                model,
                data.get("multimnist")[0],
                k,
                fig_dir / f"multimnist-{_slug(name)}.png",
                name,
                device,
            )
        model.cpu()
    if recon_rows:
        written["reconstructions"] = figures.image_grid(
            recon_rows,
            fig_dir / "reconstructions.png",
            row_labels=recon_labels,
            title="Inputs and their reconstructions from the predicted class capsule",
        )
    return written


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@torch.no_grad()
def _predict_tensor(model, images: torch.Tensor, batch_size: int, device) -> torch.Tensor:
    """Predicted classes (N,) for uint8 images (N, C, H, W)."""
    out = []
    for start in range(0, images.shape[0], batch_size):
        batch = images[start : start + batch_size].float().div_(255).to(device)  # (B, C, H, W)
        out.append(model(batch).scores.argmax(dim=1).cpu())
    return torch.cat(out)


@torch.no_grad()
def _reconstruct(model, images: torch.Tensor, device) -> torch.Tensor:
    """Reconstructions (B, C, H, W) from the predicted class capsule of images (B, C, H, W)."""
    return model(images.to(device)).reconstruction.float().cpu()


@torch.no_grad()
def _multimnist_figure(model, dataset, k: int, path: Path, name: str, device) -> Path:
    """Rows: the overlaid inputs, the reconstruction from each of the two highest capsules."""
    from capsnet import figures

    images, targets = dataset.tensors  # (N, 1, S, S) uint8, (N, 10) multi-hot
    x = images[:k].float().div(255).to(device)  # (k, 1, S, S)
    out = model(x)
    top2 = out.scores.topk(2, dim=1).indices  # (k, 2)
    first = model.decoder(out.poses, top2[:, 0]).float().cpu()  # (k, 1, S, S)
    second = model.decoder(out.poses, top2[:, 1]).float().cpu()
    truth = [tuple(int(c) for c in t.nonzero().flatten()) for t in targets[:k]]
    labels = [
        f"true {a},{b}\npred {int(p)},{int(q)}" for (a, b), (p, q) in zip(truth, top2.tolist())
    ]
    return figures.image_grid(
        [x.cpu(), first, second, torch.clamp(first + second, 0, 1)],
        path,
        row_labels=["input", "1st digit", "2nd digit", "both"],
        col_labels=labels,
        title=f"{name}: MultiMNIST, the two predicted digits reconstructed",
    )


def summary_lines(results: dict) -> list[str]:
    """A human-readable table: one row per entry, accuracy per dataset (and 0°/35°), then
    the novel-viewpoint comparison when ``results`` has a "viewpoints" section."""
    viewpoints = results.get(VIEWPOINTS_KEY)
    results = {n: e for n, e in results.items() if "model" in e}
    return _table_lines(results) + viewpoint_lines(viewpoints)


def _table_lines(results: dict) -> list[str]:
    header = ["checkpoint", "model"]
    columns: list[tuple[str, Callable[[dict], str]]] = []

    def fmt(x):
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"

    names = []
    for entry in results.values():
        for key, value in entry.items():
            if isinstance(value, dict) and key not in names and key not in ("std",):
                names.append(key)
    for key in names:
        if key == "rotated-mnist":
            angles = []
            for entry in results.values():
                for a in entry.get(key, {}).get("accuracy", {}):
                    if a not in angles:
                        angles.append(a)
            for a in angles:
                columns.append(
                    (
                        f"{a}°",
                        lambda e, a=a: fmt(e.get("rotated-mnist", {}).get("accuracy", {}).get(a)),
                    )
                )
        elif key == "multimnist":
            columns.append(
                ("multimnist", lambda e: _cell(e.get("multimnist"), "strict_accuracy", fmt))
            )
        elif key in ("robustness", "equivariance"):
            continue
        else:
            columns.append((key, lambda e, key=key: _cell(e.get(key), "accuracy", fmt)))
    header += [c for c, _ in columns]
    rows = [
        [name, entry["model"], *[f(entry) for _, f in columns]] for name, entry in results.items()
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]
    ]


def _cell(value, key: str, fmt) -> str:
    if not isinstance(value, dict):
        return "-"
    if "skipped" in value:
        return "skipped"
    return fmt(value.get(key))


# --- the DVC stage -----------------------------------------------------------------------------


def stage_checkpoints(settings, log=None) -> tuple[list[Path], list[str]]:
    """(paths, entry names) of ``models_dir/*.pt`` and of every usable
    ``extra_models_dirs`` entry; an extra directory that is missing or holds DISABLED.txt
    is skipped with the reason logged. Extra names are the file stems, prefixed with their
    directory's name where a stem is already taken."""
    from capsnet.data.store import DISABLED_MARKER, is_disabled

    say = log or (lambda line: None)
    paths = sorted(Path(settings.models_dir).glob("*.pt"))
    if not paths:
        raise CapsnetError(f"{settings.models_dir}: no checkpoints (*.pt); run the train stage")
    names = checkpoint_names(paths)
    for extra in settings.extra_models_dirs:
        folder = Path(extra)
        if not folder.is_dir():
            say(f"skipping {folder}: not found (its stage has not run)")
            continue
        if is_disabled(folder):
            reason = (folder / DISABLED_MARKER).read_text().strip()
            say(f"skipping {folder}: {reason}")
            continue
        found = sorted(folder.glob("*.pt"))
        if not found:
            say(f"skipping {folder}: no checkpoints (*.pt)")
        for path, name in zip(found, checkpoint_names(found)):
            if name in names or name == VIEWPOINTS_KEY:
                name = f"{folder.name}/{name}"
            paths.append(path)
            names.append(name)
    return paths, names


def run_stage(params, data_root=None, mirror=None, log=None) -> dict[str, Path]:
    """The ``evaluate`` stage: every ``<evaluate.models_dir>/*.pt`` (and the checkpoints of
    ``extra_models_dirs``) with params.yaml's ``evaluate`` settings, plus the
    novel-viewpoint section from ``viewpoints_dir``; writes ``<evaluate.out_dir>/``.
    ``params``: a config.Params."""
    settings = params.evaluate
    paths, names = stage_checkpoints(settings, log)
    options = EvalOptions.from_params(
        settings,
        data_root=data_root or getattr(params.data, "root", None) or "data",
        mirror=params.data.resolved_mirror(mirror),
        log=log,
    )
    results = evaluate_checkpoints(paths, settings.datasets, options, names=names)
    if settings.viewpoints_dir:
        results[VIEWPOINTS_KEY] = evaluate_viewpoints(settings.viewpoints_dir, options)
    return write_outputs(results, settings.out_dir, options)
