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

    metric: str  # a results column: a dataset's evaluation set, "<rotation set>@<angle>"
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


#: Each source's key in the dataset declarations (``DatasetSpec.published``).
SOURCES = {"sabour": SABOUR, "hinton": HINTON, "article": ARTICLE}


def paper_numbers() -> tuple[PaperNumber, ...]:
    """The published numbers, as the dataset declarations give them
    (``capsnet.config.dataset_specs``, ``published``)."""
    from capsnet.config import dataset_specs
    from capsnet.io.errors import ConfigError

    numbers = dataset_specs.published_numbers()
    for p in numbers:
        if p.source not in SOURCES:
            raise ConfigError(
                f"dataset spec: the published number for {p.column} ({p.family}) cites "
                f"source {p.source!r}; pipeline/paper.py knows {', '.join(sorted(SOURCES))}"
            )
    return tuple(
        PaperNumber(p.column, p.family, p.accuracy, SOURCES[p.source], p.model, p.note)
        for p in numbers
    )


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
    return next((p for p in paper_numbers() if p.metric == metric and p.family == family), None)


def paper_number(metric: str, model: str) -> PaperNumber | None:
    """The number published for ``model``'s registered family on ``metric``, or None."""
    return published(metric, model_family(model))
