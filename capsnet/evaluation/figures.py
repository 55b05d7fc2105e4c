"""The evaluation's PNG figures, drawn while each model is loaded for its evaluation.

Per model: the confusion matrix on MNIST rotated by ``confusion_angle`` and on each set of
the registry's ``CONFUSION_SETS`` the model was scored on (smallNORB), the pose
perturbation grid (only the pose dimensions whose reconstructions visibly change; none
when no dimension does) and, for MultiMNIST, each digit reconstructed from its own capsule (the
two predicted and the two true ones). Across models, drawn once all are evaluated: the
rotation curve (a mean line in a mean ± std band per seed group, a plain line per checkpoint
in no group), the equivariance plot and the reconstructions; from the novel-viewpoint
experiment's per-epoch errors, the familiar and novel error curves.
File names: rotation.png, equivariance.png, reconstructions.png, viewpoints.png,
confusion-<name>.png (MNIST), confusion-<name>-<set>.png, perturbation-<name>.png,
multimnist-<name>.png.
"""

from __future__ import annotations

from pathlib import Path

import torch

from capsnet.config import dataset_specs
from capsnet.evaluation import plots as draw
from capsnet.evaluation.datasets import TestSets, model_fit
from capsnet.evaluation.probes import PROBES
from capsnet.evaluation.request import EvalRequest
from capsnet.evaluation.results import Entry, EvalResults
from capsnet.training import scoring as evaluate


def slug(name: str) -> str:
    """``name`` made safe for a file name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


#: The figures drawn across models, once all are evaluated (no checkpoint owns them): the
#: rotation curves, each probe's figure, the reconstructions, the viewpoint curves.
SHARED_FIGURES = (
    "rotation",
    *(name for name, probe in PROBES.items() if probe.figure),
    "reconstructions",
    "viewpoints",
)
#: The figures drawn for one checkpoint (``figure_stem``): a multi-label set's figure is
#: named after the set.
MODEL_FIGURES = ("confusion", "perturbation", *dataset_specs.MULTI_LABEL_SETS)


def figure_stem(kind: str, name: str, test_set: str | None = None) -> str:
    """The file stem of checkpoint ``name``'s figure ``kind`` (one of MODEL_FIGURES), on
    ``test_set`` for a per-set confusion matrix: ``confusion-<name>-<set>``."""
    stem = f"{kind}-{slug(name)}"
    return stem if test_set is None else f"{stem}-{slug(test_set)}"


def model_figure_stems(name: str) -> set[str]:
    """Every stem a figure of checkpoint ``name`` can have: its own, matched by the whole
    name, never by a suffix (``em-capsnet-small``'s figures are not ``capsnet-small``'s)."""
    from capsnet.config.dataset_specs import CONFUSION_SETS

    stems = {figure_stem(kind, name) for kind in MODEL_FIGURES}
    return stems | {figure_stem("confusion", name, test_set) for test_set in CONFUSION_SETS}


class FigureDrawer:
    """Figures under ``fig_dir``; ``written`` maps each figure's name to its path."""

    def __init__(self, fig_dir: str | Path):
        self.fig_dir = Path(fig_dir)
        self.written: dict[str, Path] = {}
        self._recon_rows: list[torch.Tensor] = []  # each (k, 1, 28, 28)
        self._recon_labels: list[str] = []

    def add_model(self, name: str, model, entry: Entry, data: TestSets, request: EvalRequest):
        """The figures of one evaluated model, which is on ``request.device``."""
        from capsnet.config.dataset_specs import CONFUSION_SETS

        sweep = dataset_specs.rotation_sweep()  # its figures are drawn on the upright set
        if sweep is not None and model_fit(model, sweep.rotations_of) is None:
            self._mnist_figures(name, model, data, request, sweep.rotations_of)
        for test_set in CONFUSION_SETS:
            if "accuracy" in entry.block(test_set):
                self._set_confusion(name, model, test_set, data, request)
        for test_set in dataset_specs.MULTI_LABEL_SETS:
            if "strict_accuracy" in entry.block(test_set) and getattr(model, "decoder", None):
                self.written[f"{test_set}-{name}"] = multimnist_figure(
                    model,
                    data.get(test_set)[0],
                    request.params.figure_examples,
                    self.fig_dir / f"{figure_stem(test_set, name)}.png",
                    name,
                    request.device,
                )

    def _mnist_figures(
        self, name: str, model, data: TestSets, request: EvalRequest, upright: str
    ) -> None:
        from capsnet.data.datasets import rotate_images

        params, device = request.params, request.device
        images, labels = data.get(upright)[0].tensors  # (N, 1, 28, 28) uint8, (N,)
        rotated = rotate_images(images, params.confusion_angle)  # (N, 1, 28, 28)
        predicted = predict_tensor(model, rotated, params.batch_size, device)  # (N,)
        angle = evaluate.format_angle(params.confusion_angle)
        self.written[f"confusion-{name}"] = draw.confusion_matrix(
            predicted,
            labels,
            int(model.config.num_classes),
            self.fig_dir / f"{figure_stem('confusion', name)}.png",
            title=f"{name}: MNIST rotated {angle}°",
        )
        if getattr(model, "decoder", None) is None:
            return
        k = params.figure_examples
        upright = images[:k].float() / 255  # (k, 1, 28, 28)
        tilted = rotated[:k].float() / 255  # (k, 1, 28, 28)
        self._recon_rows += [upright, reconstruct(model, upright, device)]
        self._recon_rows += [tilted, reconstruct(model, tilted, device)]
        self._recon_labels += ["input 0°", f"{name}\n0°", f"input {angle}°", f"{name}\n{angle}°"]
        self._perturbation(name, model, upright[0], int(labels[0]), device)

    def _set_confusion(self, name: str, model, test_set: str, data: TestSets, request) -> None:
        dataset, info = data.get(test_set, int(model.config.in_channels))
        scores, targets = evaluate.predict(
            model, dataset, request.params.batch_size, request.device
        )
        source = info.get("source")
        key = f"confusion-{name}-{test_set}"
        self.written[key] = draw.confusion_matrix(
            scores.argmax(dim=1).cpu(),  # (N,)
            targets.cpu(),  # (N,)
            int(model.config.num_classes),
            self.fig_dir / f"{figure_stem('confusion', name, test_set)}.png",
            title=f"{name}: {test_set}" + (f" ({source})" if source else ""),
        )

    def viewpoints(self, payload: dict) -> None:
        """The novel-viewpoint experiment's familiar and novel test error at every check
        (``capsnet.evaluation.viewpoint_matching`` results: kinds -> models -> history)."""
        curves = {
            kind: {
                model["model"]: model["history"]
                for model in (entry.get("models") or {}).values()
                if model.get("history")
            }
            for kind, entry in payload.get("kinds", {}).items()
        }
        curves = {kind: models for kind, models in curves.items() if models}
        if curves:
            path = self.fig_dir / "viewpoints.png"
            self.written["viewpoints"] = draw.viewpoint_curves(curves, path)

    def _perturbation(self, name: str, model, image: torch.Tensor, label: int, device) -> None:
        with torch.no_grad():
            rows = draw.perturbation_rows(model.cpu(), image, label)
        model.to(device)
        shown = draw.visible_rows(rows)  # a dimension that changes nothing shows nothing
        if shown:
            self.written[f"perturbation-{name}"] = draw.image_grid(
                [rows[d] for d in shown],
                self.fig_dir / f"{figure_stem('perturbation', name)}.png",
                row_labels=[f"dim {d}" for d in shown],
                col_labels=[f"{d:+.2f}" for d in draw.PERTURBATION_DELTAS],
                title=f"{name}: each pose dimension of the class capsule perturbed",
            )

    def finish(self, results: EvalResults) -> dict[str, Path]:
        """The figures across models (from ``results``' checkpoint entries); returns ``written``."""
        curves, bands = rotation_curves(results)
        if curves:
            path = self.fig_dir / "rotation.png"
            self.written["rotation"] = draw.rotation_curve(curves, path, bands=bands)
        for name, probe in PROBES.items():
            drawn = probe.figure(results, self.fig_dir / f"{name}.png") if probe.figure else None
            if drawn is not None:
                self.written[name] = drawn
        if self._recon_rows:
            self.written["reconstructions"] = draw.image_grid(
                self._recon_rows,
                self.fig_dir / "reconstructions.png",
                row_labels=self._recon_labels,
                title="Inputs and their reconstructions from the predicted class capsule",
            )
        return self.written


def rotation_curves(results: EvalResults) -> tuple[dict[str, dict], dict[str, dict]]:
    """({legend label: {"<angle>": accuracy}}, {label: {"<angle>": std}}): the mean of every
    seed group with its deviations, and each checkpoint that is in no group."""
    curves: dict[str, dict] = {}
    bands: dict[str, dict] = {}
    means = {n: e for n, e in results.means().items() if e.sweep()}
    grouped = {n for e in means.values() for n in e.names}
    for name, entry in results.entries.items():
        if name in means:
            label = f"{name.removesuffix(' (mean)')} (mean ± std, {entry.seeds} seeds)"
            curves[label] = entry.sweep()
            bands[label] = entry.sweep_std()
        elif entry.checkpoint is not None and name not in grouped and entry.sweep():
            curves[name] = entry.sweep()
    return curves, bands


@torch.no_grad()
def predict_tensor(model, images: torch.Tensor, batch_size: int, device) -> torch.Tensor:
    """Predicted classes (N,) for uint8 images (N, C, H, W)."""
    out = []
    for start in range(0, images.shape[0], batch_size):
        batch = images[start : start + batch_size].float().div_(255).to(device)  # (B, C, H, W)
        out.append(model(batch).scores.argmax(dim=1).cpu())  # (B,)
    return torch.cat(out)


@torch.no_grad()
def reconstruct(model, images: torch.Tensor, device) -> torch.Tensor:
    """Reconstructions (B, C, H, W) from the predicted class capsule of images (B, C, H, W)."""
    return model(images.to(device)).reconstruction.float().cpu()


@torch.no_grad()
def multimnist_figure(model, dataset, k: int, path: Path, name: str, device) -> Path:
    """Rows: the overlaid inputs; the reconstruction from each of the two highest capsules
    and their merge; the reconstruction of each true digit from its own capsule (what
    training compares with that digit's image)."""
    images, targets = dataset.tensors  # (N, 1, S, S) uint8, (N, 10) multi-hot
    x = images[:k].float().div(255).to(device)  # (k, 1, S, S)
    out = model(x)
    top2 = out.scores.topk(2, dim=1).indices  # (k, 2)
    truth = targets[:k].topk(2, dim=1).indices.sort(dim=1).values  # (k, 2) ascending classes
    predicted = model.reconstruct(out.poses, top2).float().cpu()  # (k, 2, 1, S, S)
    true = model.reconstruct(out.poses, truth.to(device)).float().cpu()  # (k, 2, 1, S, S)
    labels = [
        f"true {a},{b}\npred {p},{q}" for (a, b), (p, q) in zip(truth.tolist(), top2.tolist())
    ]
    both = predicted.sum(1).clamp(0, 1)  # (k, 1, S, S)
    return draw.image_grid(
        [x.cpu(), predicted[:, 0], predicted[:, 1], both, true[:, 0], true[:, 1]],
        path,
        row_labels=["input", "1st pred", "2nd pred", "both pred", "1st true", "2nd true"],
        col_labels=labels,
        title=f"{name}: MultiMNIST, each digit reconstructed from its own capsule",
    )
