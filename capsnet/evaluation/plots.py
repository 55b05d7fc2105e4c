"""Matplotlib figures for the evaluation stage, written atomically as PNG files."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from capsnet.io.files import atomic_open

PERTURBATION_DELTAS = tuple(round(-0.25 + 0.05 * i, 2) for i in range(11))  # the paper's sweep
#: A perturbed pose dimension is drawn only when its reconstructions change visibly: the
#: absolute pixel difference between the two ends of the sweep, summed, is at least this
#: fraction of the unperturbed reconstruction's ink (its summed pixel values).
VISIBLE_CHANGE = 0.25


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Save ``fig`` as a PNG to ``path`` atomically; close it."""
    plt = _pyplot()
    try:
        with atomic_open(path) as fh:
            fig.savefig(fh, format="png", dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return Path(path)


def rotation_curve(
    curves: dict[str, dict[str, float]],
    path,
    title: str = "",
    bands: dict[str, dict[str, float]] | None = None,
) -> Path:
    """Accuracy versus rotation angle, one line per label: curves {label: {"<angle>": acc}};
    ``bands`` {label: {"<angle>": std}} shades mean ± std around those labels' lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in curves.items():
        angles = sorted(points, key=float)
        x = [float(a) for a in angles]
        y = [100 * points[a] for a in angles]
        (line,) = ax.plot(x, y, marker="o", ms=3, label=label)
        spread = (bands or {}).get(label)
        if spread:
            low = [100 * (points[a] - spread.get(a, 0.0)) for a in angles]
            high = [100 * (points[a] + spread.get(a, 0.0)) for a in angles]
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("rotation of the test digits (degrees)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    # below the axes, never over the curves (the 30-60 degree range is where they differ)
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=min(3, max(1, len(curves))),
        fontsize=7 if len(curves) > 6 else 8,
        frameon=False,
    )
    ax.set_title(title or "Accuracy on rotated MNIST")
    return save_figure(fig, path)


def image_grid(
    rows: list[torch.Tensor], path, row_labels=None, col_labels=None, title: str = ""
) -> Path:
    """Rows of images (each (N, C, H, W) or (N, H, W), values in [0, 1]) as one grid."""
    plt = _pyplot()
    n_rows, n_cols = len(rows), max(r.shape[0] for r in rows)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(n_cols * 0.9, n_rows * 0.95), squeeze=False)
    for i, row in enumerate(rows):
        for j in range(n_cols):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j < row.shape[0]:
                image = row[j].detach().float().cpu()
                if image.dim() == 3:
                    image = image[0]  # first channel
                ax.imshow(image.numpy(), cmap="gray", vmin=0, vmax=1)
            else:
                ax.axis("off")
            if col_labels is not None and i == 0 and j < len(col_labels):
                ax.set_title(str(col_labels[j]), fontsize=7)
        if row_labels is not None:
            axes[i][0].set_ylabel(
                str(row_labels[i]), fontsize=7, rotation=0, ha="right", va="center"
            )
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


def confusion_matrix(
    predicted: torch.Tensor, targets: torch.Tensor, num_classes: int, path, title: str = ""
) -> Path:
    """Confusion matrix (rows: true class, columns: predicted) with counts."""
    plt = _pyplot()
    counts = torch.zeros(num_classes, num_classes, dtype=torch.long)
    counts.index_put_(
        (targets.long(), predicted.long()), torch.ones_like(targets.long()), accumulate=True
    )
    fig, ax = plt.subplots(figsize=(5, 4.5))
    ax.imshow(counts.numpy(), cmap="Blues")
    for i in range(num_classes):
        for j in range(num_classes):
            value = int(counts[i, j])
            if value:
                ax.text(
                    j,
                    i,
                    str(value),
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if value > counts.max() / 2 else "black",
                )
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_xticks(range(num_classes))
    ax.set_yticks(range(num_classes))
    ax.set_title(title or "Confusion matrix")
    return save_figure(fig, path)


def viewpoint_curves(curves: dict[str, dict[str, list[dict]]], path) -> Path:
    """Familiar (solid) and novel (dashed) test error per epoch, one panel per viewpoint
    kind and seed (a row per seed), one colour per model: curves {kind: {model: [{"epoch",
    "familiar_error", "novel_error"}, ...]}}, a kind keyed ``azimuth`` or, for a later seed,
    ``azimuth@seed1``."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    kinds: dict[str, list[str]] = {}  # column per kind, row per seed
    for key in curves:
        kinds.setdefault(key.partition("@")[0], []).append(key)
    rows = max(len(keys) for keys in kinds.values())
    fig, axes = plt.subplots(rows, len(kinds), figsize=(5 * len(kinds), 3.8 * rows), squeeze=False)
    place = {key: axes[r][c] for c, keys in enumerate(kinds.values()) for r, key in enumerate(keys)}
    fig.subplots_adjust(hspace=0.45)  # room for each panel's epoch label above the next
    for ax in axes.flat:
        ax.set_visible(any(ax is placed for placed in place.values()))
    for key, models in curves.items():
        ax = place[key]
        kind, _, seed = key.partition("@")
        for k, (model, history) in enumerate(models.items()):
            epochs = [float(r["epoch"]) for r in history]  # fractional within an epoch
            colour = f"C{k}"
            for field, style, what in (
                ("familiar_error", "-", "familiar"),
                ("novel_error", "--", "novel"),
            ):
                shown = [
                    (e, 100 * float(r[field]))
                    for e, r in zip(epochs, history, strict=True)
                    if r.get(field) is not None
                ]  # novel: not measured at every check
                ax.plot(
                    [e for e, _ in shown], [v for _, v in shown], style, color=colour,
                    marker="o", ms=3, label=f"{model}, {what}",
                )  # fmt: skip
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"novel {kind}s" + (f", {seed.replace('seed', 'seed ')}" if seed else ""))
        ax.set_xlabel("epoch")
        ax.set_ylabel("test error (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        if ax is axes[-1][0]:  # one legend, below the panels: every panel has the same lines
            ax.legend(
                fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2,
                frameon=False, handlelength=4,  # long enough to show the dashes
            )  # fmt: skip
    fig.suptitle("Test error on the familiar (solid) and novel (dashed) viewpoints", fontsize=10)
    return save_figure(fig, path)


def equivariance_plot(diagnostics: dict[str, dict], path) -> Path:
    """Per-model pose diagnostics: |correlation| of each pose dimension with the angle,
    and the mean pose change per angle."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / max(1, len(diagnostics))
    for k, (model, diag) in enumerate(diagnostics.items()):
        corr = diag["dim_correlation"]
        left.bar(
            [d + k * width for d in range(len(corr))],
            [abs(c) for c in corr],
            width,
            label=f"{model} (1st direction: {100 * diag['first_direction_explained']:.0f}%)",
        )
        right.plot(diag["angles"], diag["mean_pose_change"], marker="o", ms=3, label=model)
    left.set_xlabel("pose dimension")
    left.set_ylabel("|correlation with angle|")
    left.set_ylim(0, 1)
    left.legend(fontsize=7)
    right.set_xlabel("rotation (degrees)")
    right.set_ylabel("mean |pose(angle) - pose(0)|")
    right.grid(alpha=0.3)
    fig.suptitle("Does the class capsule's pose encode the rotation?", fontsize=10)
    return save_figure(fig, path)


@torch.no_grad()
def visible_rows(rows: list[torch.Tensor], threshold: float = VISIBLE_CHANGE) -> list[int]:
    """Indices of the perturbation rows (each (S, C, H, W), the unperturbed image in the
    middle) whose first and last images differ by at least ``threshold`` of the
    unperturbed image's ink."""
    shown = []
    for i, row in enumerate(rows):
        ink = float(row[len(row) // 2].abs().sum())  # the unperturbed reconstruction
        change = float((row[-1] - row[0]).abs().sum())
        if ink > 0 and change >= threshold * ink:
            shown.append(i)
    return shown


def perturbation_rows(
    model,
    image: torch.Tensor,
    label: int,
    deltas=PERTURBATION_DELTAS,
):
    """Reconstructions with each pose dimension of the class capsule swept by ``deltas``.

    image (C, H, W) -> list of D tensors, each (len(deltas), C, H, W).
    """
    model.eval()
    out = model(image.unsqueeze(0))
    if out.poses is None or getattr(model, "decoder", None) is None:
        return []
    poses = out.poses.float()  # (1, K, D)
    label_t = torch.tensor([label])
    rows = []
    for dim in range(poses.shape[-1]):
        batch = poses.repeat(len(deltas), 1, 1)  # (S, K, D): one copy per delta, small
        batch[:, label, dim] += torch.tensor(deltas)
        rows.append(model.decoder(batch, label_t.expand(len(deltas))))  # (S, C, H, W)
    return rows
