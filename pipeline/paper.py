"""The published numbers the evaluation is compared with (``CITES``), each with its source
and the model family it describes.

A checkpoint is compared only with a number published for its model's family, as the
model registry declares it (``capsnet.models.register(..., family=...)``): LeNet5 with the
rotated-MNIST article's LeNet5, never with Sabour et al.'s 35M-parameter baseline CNN.
"""

from __future__ import annotations

from dataclasses import dataclass

SABOUR = "Sabour et al. 2017"
HINTON = "Hinton et al. 2018"
ARTICLE = "“Approaching the Problem of Equivariance With Hinton's Capsule Networks” (DZone)"
ARTICLE_SHORT = "the rotated-MNIST article (DZone)"
#: Each source's short name in table cells.
CITES = {SABOUR: "Sabour 2017", HINTON: "Hinton 2018", ARTICLE: "DZone article"}
#: The line under a table that spells out the short names.
SOURCES_LINE = (
    "Published numbers in brackets, each for the model it describes, not ours: Sabour 2017 ="
    " Sabour, Frosst, Hinton, Dynamic Routing Between Capsules (2017); Hinton 2018 = Hinton,"
    f" Sabour, Frosst, Matrix Capsules with EM Routing (2018); DZone article = {ARTICLE}."
)


@dataclass(frozen=True)
class PaperNumber:
    """One published figure of a source of ``CITES``, as an accuracy in [0, 1]."""

    metric: str  # "mnist", "rotated-mnist@0", "rotated-mnist@35", "affnist", "smallnorb", ...
    family: str  # a registered model family: capsnet, em, lenet5, sabour-cnn, smallnorb-cnn
    accuracy: float
    source: str  # who published it: SABOUR, HINTON or ARTICLE
    model: str  # the model it describes, in the source's words
    note: str

    @property
    def cite(self) -> str:
        """The source's short name for a table cell (``SOURCES`` spells each out)."""
        return CITES[self.source]

    @property
    def label(self) -> str:
        """ "<source>, <model>: <accuracy>" for a table cell's tooltip or a footnote."""
        return f"{self.source}, {self.model}: {self.accuracy * 100:.2f}%"


PAPER_NUMBERS = (
    PaperNumber("mnist", "capsnet", 0.9975, SABOUR, "CapsNet", "0.25% error, 3 iterations, reconstruction"),  # noqa: E501
    PaperNumber("mnist", "sabour-cnn", 0.9961, SABOUR, "baseline CNN (35.4M)", "0.39% error"),
    PaperNumber("mnist", "lenet5", 0.9868, ARTICLE, "LeNet5", "shift-only training"),
    PaperNumber("rotated-mnist@0", "capsnet", 0.9937, ARTICLE, "CapsNet", "upright MNIST"),
    PaperNumber("rotated-mnist@0", "lenet5", 0.9868, ARTICLE, "LeNet5", "shift-only training"),
    PaperNumber("rotated-mnist@35", "capsnet", 0.8409, ARTICLE, "CapsNet", "35°: 84.09-92.12% by training"),  # noqa: E501
    PaperNumber("rotated-mnist@35", "lenet5", 0.7605, ARTICLE, "LeNet5", "35°, shift-only training"),  # noqa: E501
    PaperNumber("expanded-mnist", "capsnet", 0.992, SABOUR, "CapsNet", "expanded MNIST test"),
    PaperNumber("expanded-mnist", "sabour-cnn", 0.992, SABOUR, "baseline CNN", "expanded MNIST test"),  # noqa: E501
    PaperNumber("affnist", "capsnet", 0.79, SABOUR, "CapsNet", "trained on expanded MNIST"),
    PaperNumber("affnist", "sabour-cnn", 0.66, SABOUR, "baseline CNN", "trained on expanded MNIST"),
    PaperNumber("multimnist", "capsnet", 0.948, SABOUR, "CapsNet", "5.2% error (strict)"),
    PaperNumber("multimnist", "sabour-cnn", 0.919, SABOUR, "baseline CNN", "8.1% error"),
    PaperNumber("smallnorb", "em", 0.982, HINTON, "matrix capsules, EM", "1.8% error, 3 iterations"),  # noqa: E501
    PaperNumber("smallnorb", "smallnorb-cnn", 0.948, HINTON, "baseline CNN", "5.2% error"),
    PaperNumber("smallnorb-azimuth-novel", "em", 0.865, HINTON, "matrix capsules, EM", "novel azimuths: 13.5% error"),  # noqa: E501
    PaperNumber("smallnorb-azimuth-novel", "smallnorb-cnn", 0.80, HINTON, "baseline CNN", "novel azimuths: 20% error"),  # noqa: E501
    PaperNumber("smallnorb-elevation-novel", "em", 0.877, HINTON, "matrix capsules, EM", "novel elevations: 12.3% error"),  # noqa: E501
    PaperNumber("smallnorb-elevation-novel", "smallnorb-cnn", 0.822, HINTON, "baseline CNN", "novel elevations: 17.8% error"),  # noqa: E501
)  # fmt: skip


def model_family(model: str | None) -> str | None:
    """The family model ``model`` is registered with (``capsnet.models``), None for a name
    no model is registered under (compared with nothing published)."""
    from capsnet import models

    found = models.registered(model) if model else None
    return None if found is None else found.family


def is_baseline(model: str | None) -> bool:
    """Whether ``model`` is a conventional network: registered without ``capsules`` (a name
    no model is registered under counts as one)."""
    from capsnet import models

    found = models.registered(model) if model else None
    return found is None or not found.capsules


def published(metric: str, family: str | None) -> PaperNumber | None:
    """The number published for model family ``family`` on ``metric``, or None."""
    return next((p for p in PAPER_NUMBERS if p.metric == metric and p.family == family), None)


def paper_number(metric: str, model: str) -> PaperNumber | None:
    """The number published for ``model``'s registered family on ``metric``, or None."""
    return published(metric, model_family(model))
