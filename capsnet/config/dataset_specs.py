"""The datasets, each declared once: what every stage, loader, validator, evaluator and
results table reads.

A declaration names its functions as "module:attribute" strings, imported on use
(``capsnet.data.registry.resolve``), so this module imports no dataset module (and nothing
heavier than the standard library): the config package validates names against it and the
CLI lists them without importing torch. Each declaration stays a literal
``DatasetSpec("name", ...)`` call with literal hook strings: the DVC stage deps are read
from it statically.

Loader signature: ``load(request: LoadRequest, **options) -> torch Dataset``;
download: ``download(out_dir, section_params, mirror, progress, stand_in)``;
prepare: ``prepare(root, out_dir, section_params)``; the prepared spec is a
``capsnet.data.store.PreparedSpec``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capsnet.io.errors import DataError

#: What the data stages write into ``<root>/raw/<name>`` and ``<root>/prepared/<name>``
#: (each replaced whole, ``capsnet.io.outputset.check_owned``): the downloaded archives,
#: what they extract to and the notes beside them; the prepared splits.
RAW_FILES = ("*.gz", "*.zip", "*.mat", "MD5SUMS", "SOURCE.txt")
PREPARED_FILES = ("*.pt",)


@dataclass(frozen=True)
class Column:
    """A column of the results tables (README, report, the evaluation's summary): ``key``,
    an evaluation set ("<set>@{angle}": a rotation sweep at the table's angle), and its
    ``title`` ("{angle}" filled in alike)."""

    key: str
    title: str


@dataclass(frozen=True)
class SummaryKey:
    """A summary.json number: results column ``column`` under ``key``. ``sweep_angle``: the
    rotation-sweep angle the column equals, for a number given as a seed mean with its
    deviation beside it (``<key>_sd``) and in each comparison arm's row."""

    column: str
    key: str
    sweep_angle: float | None = None


@dataclass(frozen=True)
class Published:
    """A number a paper published on one of the dataset's results columns: ``column`` (a
    ``Column`` key, its angle filled in: "rotated-mnist@35"), the registered model
    ``family`` it describes (``capsnet.models.register(..., family=...)``), its
    ``accuracy`` in [0, 1], its ``source`` (a key of ``pipeline.paper.SOURCES``), the
    ``model`` in the source's words and a ``note``."""

    column: str
    family: str
    accuracy: float
    source: str
    model: str
    note: str


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: its name, what a model needs for it, where its files come from, how it
    is prepared and loaded, where it is evaluated and how its numbers are shown."""

    name: str
    section: str  # params.yaml data.<section> (enabled, source, ...)
    loader: str  # "module:function"
    shape: tuple[int, int, int] | None = None  # (channels, size, classes); None: from the data
    splits: tuple[str, ...] = ("train", "test")
    options: tuple[str, ...] = ()  # keyword options the loader takes
    download: str | None = None  # "module:function": the raw files (a download stage)
    stand_in: str | None = None  # "module:function" rendering stand-in raw files offline
    prepare: str | None = None  # "module:function": the prepared files (a prepare stage)
    prepared: str | None = None  # "module:ATTR": the PreparedSpec its files are checked against
    train: bool = False  # a run can train on it (capsnet train, sweeps, final training)
    extra: bool = False  # the final training also trains on it (train.extra_datasets)
    sweep: bool = False  # a sweep can search on it (sweep.dataset)
    evaluation: tuple[str, ...] = ()  # the evaluation set names it offers (evaluate.datasets)
    channels_from_model: bool = False  # evaluation keeps the model's channels (stereo)
    confusion: bool = False  # evaluation draws each scored model's confusion matrix on it
    classes: int | None = None  # label count where ``shape`` is None (chance is 1 / classes)
    # Behaviour: "module:function" hooks and flags; unset, the plain behaviour.
    split: str | None = None  # run_split(run_spec) -> (train, val); None: the last val_size
    test_set: str | None = None  # run_test_set(run_spec, subset) -> the test set of a run
    evaluation_set: str | None = None  # (name, request, root, load, channels) -> (dataset, info)
    data_record: str | None = None  # (run_spec) -> what a checkpoint records of preprocessing
    subsets: bool = False  # viewpoint subsets: evaluation sets "<name>-<subset>", runs' subset
    self_augmenting: bool = False  # its training items are augmented by its loader
    crops: bool = False  # its images are crops of the model's input size (a mismatch is an error)
    multi_label: bool = False  # two digits per image: scored strict/at-least-one/half-credit
    headline_metric: str = "accuracy"  # the metrics.json field a results table reads
    rotations_of: str | None = None  # scored on this dataset's test set at evaluate.angles
    rotated_validation: bool = False  # a sweep also validates on rotated validation images
    sweep_records_all: bool = True  # a sweep records every searchable parameter (False: the
    # ablation axes only when set away from their neutral values)
    stand_in_source: str | None = None  # the recorded source prefix marking stand-in data
    trained_on: str | None = None  # its columns are filled by <model>@<this set> checkpoints
    probes: tuple[str, ...] = ()  # the probes (capsnet.evaluation.probes) run on its test set
    # Display: its results columns (titles), their place among every dataset's columns
    # (ascending ``column_order``; equal ones in declaration order), its summary.json keys.
    columns: tuple[Column, ...] = ()
    column_order: int = 1000
    summary: tuple[SummaryKey, ...] = ()
    published: tuple[Published, ...] = ()  # the papers' numbers on its columns

    def settings(self, data: Any) -> Any:
        """Its own part of params.yaml's validated ``data`` section, ``data.<section>``
        (None where the section has no such part)."""
        return getattr(data, self.section, None)


REGISTRY: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "mnist", "mnist", "capsnet.data.mnist:load_dataset", shape=(1, 28, 10),
            download="capsnet.data.mnist:download_stage", prepare="capsnet.data.mnist:prepare_stage",  # noqa: E501
            prepared="capsnet.data.mnist:PREPARED", train=True, sweep=True,
            evaluation=("mnist",), rotated_validation=True, sweep_records_all=False,
            probes=("robustness", "equivariance"),
            columns=(Column("mnist", "MNIST"),), column_order=10,
            summary=(SummaryKey("mnist", "mnist", sweep_angle=0.0),),
            published=(
                Published("mnist", "capsnet", 0.9975, "sabour", "CapsNet", "0.25% error, 3 iterations, reconstruction"),  # noqa: E501
                Published("mnist", "sabour-cnn", 0.9961, "sabour", "baseline CNN (35.4M)", "0.39% error"),  # noqa: E501
                Published("mnist", "lenet5", 0.9868, "article", "LeNet5", "shift-only training"),
            ),
        ),
        DatasetSpec(
            "rotated-mnist", "mnist", "capsnet.data.rotated:load_dataset", shape=(1, 28, 10),
            evaluation=("rotated-mnist",), rotations_of="mnist",
            columns=(Column("rotated-mnist@{angle}", "rotated MNIST {angle}°"),), column_order=20,
            summary=(SummaryKey("rotated-mnist@35", "rot35", sweep_angle=35.0),),
            published=(
                Published("rotated-mnist@0", "capsnet", 0.9937, "article", "CapsNet", "upright MNIST"),  # noqa: E501
                Published("rotated-mnist@0", "lenet5", 0.9868, "article", "LeNet5", "shift-only training"),  # noqa: E501
                Published("rotated-mnist@35", "capsnet", 0.8409, "article", "CapsNet", "35°: 84.09-92.12% by training"),  # noqa: E501
                Published("rotated-mnist@35", "lenet5", 0.7605, "article", "LeNet5", "35°, shift-only training"),  # noqa: E501
            ),
        ),
        DatasetSpec(
            "affnist", "affnist", "capsnet.data.affnist:load_real_dataset", shape=(1, 40, 10),
            splits=("test", "test-centered"), download="capsnet.data.affnist:download_stage",
            prepare="capsnet.data.affnist:prepare_stage", prepared="capsnet.data.affnist:PREPARED",
            evaluation=("affnist",), evaluation_set="capsnet.data.affnist:evaluation_set_of",
            stand_in_source="affnist-synth", trained_on="expanded-mnist",
            columns=(Column("affnist", "affNIST"),), column_order=40,
            summary=(SummaryKey("affnist", "affnist"),),
            published=(
                Published("affnist", "capsnet", 0.79, "sabour", "CapsNet", "trained on expanded MNIST"),  # noqa: E501
                Published("affnist", "sabour-cnn", 0.66, "sabour", "baseline CNN", "trained on expanded MNIST"),  # noqa: E501
            ),
        ),
        DatasetSpec(
            "affnist-synth", "affnist", "capsnet.data.affnist:load_synth_dataset",
            shape=(1, 40, 10), splits=("test",), prepare="capsnet.data.affnist:prepare_synth_stage",
            prepared="capsnet.data.affnist:PREPARED_SYNTH", evaluation=("affnist-synth",),
            evaluation_set="capsnet.data.affnist:synth_evaluation_set", trained_on="expanded-mnist",
            columns=(Column("affnist-synth", "affNIST (synth stand-in)"),), column_order=50,
        ),
        DatasetSpec(
            "expanded-mnist", "mnist", "capsnet.data.affnist:load_expanded", shape=(1, 40, 10),
            train=True, extra=True, evaluation=("expanded-mnist",), trained_on="expanded-mnist",
            columns=(Column("expanded-mnist", "expanded MNIST"),), column_order=30,
            summary=(SummaryKey("expanded-mnist", "expanded"),),
            published=(
                Published("expanded-mnist", "capsnet", 0.992, "sabour", "CapsNet", "expanded MNIST test"),  # noqa: E501
                Published("expanded-mnist", "sabour-cnn", 0.992, "sabour", "baseline CNN", "expanded MNIST test"),  # noqa: E501
            ),
        ),
        DatasetSpec(
            "multimnist", "multimnist", "capsnet.data.multimnist:load_dataset",
            options=("merge", "redraw", "components"),
            prepare="capsnet.data.multimnist:prepare_stage",
            prepared="capsnet.data.multimnist:PREPARED", train=True, extra=True,
            evaluation=("multimnist",), evaluation_set="capsnet.data.multimnist:evaluation_set",
            multi_label=True, headline_metric="strict_accuracy", trained_on="multimnist",
            columns=(Column("multimnist", "MultiMNIST (strict)"),), column_order=60,
            summary=(SummaryKey("multimnist", "multimnist"),),
            published=(
                Published("multimnist", "capsnet", 0.948, "sabour", "CapsNet", "5.2% error (strict)"),  # noqa: E501
                Published("multimnist", "sabour-cnn", 0.919, "sabour", "baseline CNN", "8.1% error"),  # noqa: E501
            ),
        ),
        DatasetSpec(
            "smallnorb", "smallnorb", "capsnet.data.smallnorb:load_dataset",
            options=("channels", "standardize", "augment", "crop", "brightness", "contrast"),
            download="capsnet.data.smallnorb:download_stage",
            stand_in="capsnet.data.smallnorb_synth:obtain",
            prepare="capsnet.data.smallnorb:prepare_stage",
            prepared="capsnet.data.smallnorb:PREPARED", train=True, sweep=True,
            evaluation=(
                "smallnorb", "smallnorb-azimuth-familiar", "smallnorb-azimuth-novel",
                "smallnorb-elevation-familiar", "smallnorb-elevation-novel",
            ),
            channels_from_model=True, confusion=True, classes=5,
            split="capsnet.data.smallnorb:run_split",
            test_set="capsnet.data.smallnorb:run_test_set",
            evaluation_set="capsnet.data.smallnorb:evaluation_set",
            data_record="capsnet.data.smallnorb:data_record", subsets=True, self_augmenting=True,
            crops=True, stand_in_source="smallnorb-synth",
            columns=(
                Column("smallnorb", "smallNORB"),
                Column("smallnorb-azimuth-novel", "smallNORB novel azimuths"),
                Column("smallnorb-elevation-novel", "smallNORB novel elevations"),
            ),
            column_order=70, summary=(SummaryKey("smallnorb", "smallnorb"),),
            published=(
                Published("smallnorb", "em", 0.982, "hinton", "matrix capsules, EM", "1.8% error, 3 iterations"),  # noqa: E501
                Published("smallnorb", "smallnorb-cnn", 0.948, "hinton", "baseline CNN", "5.2% error"),  # noqa: E501
                Published("smallnorb-azimuth-novel", "em", 0.865, "hinton", "matrix capsules, EM", "novel azimuths: 13.5% error"),  # noqa: E501
                Published("smallnorb-azimuth-novel", "smallnorb-cnn", 0.80, "hinton", "baseline CNN", "novel azimuths: 20% error"),  # noqa: E501
                Published("smallnorb-elevation-novel", "em", 0.877, "hinton", "matrix capsules, EM", "novel elevations: 12.3% error"),  # noqa: E501
                Published("smallnorb-elevation-novel", "smallnorb-cnn", 0.822, "hinton", "baseline CNN", "novel elevations: 17.8% error"),  # noqa: E501
            ),
        ),
    )
}  # fmt: skip

DATASETS: tuple[str, ...] = ()
DOWNLOADS: tuple[str, ...] = ()
PREPARES: tuple[str, ...] = ()
TRAIN_DATASETS: tuple[str, ...] = ()
EXTRA_DATASETS: tuple[str, ...] = ()
SWEEP_DATASETS: tuple[str, ...] = ()
EVAL_DATASETS: tuple[str, ...] = ()
#: The evaluation sets (each dataset's first) on which every scored model's confusion matrix
#: is drawn; MNIST's is drawn rotated (``evaluate.confusion_angle``) with its other figures.
CONFUSION_SETS: tuple[str, ...] = ()
#: The evaluation sets scored at the evaluate.angles rotations (``rotations_of``).
ROTATION_SETS: tuple[str, ...] = ()
#: The evaluation sets of multi-label datasets (each digit reconstructed in a figure).
MULTI_LABEL_SETS: tuple[str, ...] = ()


def _derive() -> None:
    """The name lists above, from REGISTRY (read them as ``dataset_specs.NAME`` to see datasets
    registered at run time)."""
    global DATASETS, DOWNLOADS, PREPARES, TRAIN_DATASETS, EXTRA_DATASETS, SWEEP_DATASETS
    global EVAL_DATASETS, CONFUSION_SETS, ROTATION_SETS, MULTI_LABEL_SETS
    specs = REGISTRY.values()
    DATASETS = tuple(REGISTRY)
    DOWNLOADS = tuple(s.name for s in specs if s.download)
    PREPARES = tuple(s.name for s in specs if s.prepare)
    TRAIN_DATASETS = tuple(s.name for s in specs if s.train)
    EXTRA_DATASETS = tuple(s.name for s in specs if s.extra)
    SWEEP_DATASETS = tuple(s.name for s in specs if s.sweep)
    EVAL_DATASETS = tuple(e for s in specs for e in s.evaluation)
    CONFUSION_SETS = tuple(s.evaluation[0] for s in specs if s.confusion)
    ROTATION_SETS = tuple(e for s in specs if s.rotations_of for e in s.evaluation)
    MULTI_LABEL_SETS = tuple(e for s in specs if s.multi_label for e in s.evaluation)


_derive()


def register(spec: DatasetSpec) -> DatasetSpec:
    """Declare ``spec`` (a dataset outside this module, such as a test's); a DataError when
    its name or one of its evaluation sets is taken."""
    taken = {spec.name, *spec.evaluation} & {*REGISTRY, *EVAL_DATASETS}
    if taken:
        raise DataError(f"dataset {spec.name!r}: {', '.join(sorted(taken))} already registered")
    REGISTRY[spec.name] = spec
    _derive()
    return spec


def unregister(name: str) -> None:
    """Remove a dataset ``register`` added."""
    REGISTRY.pop(name, None)
    _derive()


def get(name: str, among: tuple[str, ...] | None = None, what: str = "dataset") -> DatasetSpec:
    """The declaration of ``name``; a DataError naming the choices when it is not one of
    ``among`` (default: every registered dataset)."""
    among = DATASETS if among is None else among
    if name not in among:
        raise DataError(f"unknown {what} {name!r}; choose one of: {', '.join(among)}")
    return REGISTRY[name]


def of_evaluation(name: str) -> DatasetSpec:
    """The dataset behind an evaluation set name (``smallnorb-azimuth-novel`` -> smallnorb)."""
    for spec in REGISTRY.values():
        if name in spec.evaluation:
            return spec
    raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(EVAL_DATASETS)}")


def of_column(column: str) -> DatasetSpec | None:
    """The dataset behind a results column or metrics key (``rotated-mnist@35``), or None
    for a key that names no evaluation set (``robustness``)."""
    base = column.split("@")[0]
    return next((s for s in REGISTRY.values() if base in s.evaluation), None)


def chance(column: str) -> float | None:
    """Accuracy at chance on a results column's set (1 / classes), None for a multi-label set
    or a key that names no evaluation set."""
    spec = of_column(column)
    if spec is None or spec.multi_label:
        return None
    classes = spec.shape[2] if spec.shape is not None else spec.classes
    return None if not classes else 1.0 / classes


def subset_of(name: str) -> str:
    """The viewpoint subset an evaluation set stands for (``smallnorb-azimuth-novel`` ->
    ``azimuth-novel``; a dataset's own name -> ``all``)."""
    spec = of_evaluation(name)
    return name[len(spec.name) + 1 :] if spec.subsets and name != spec.name else "all"


def is_stand_in(column: str, source: str | None) -> bool:
    """Whether numbers recorded with ``source`` for ``column`` come from a stand-in's data."""
    spec = of_column(column)
    prefix = spec.stand_in_source if spec is not None else None
    return prefix is not None and str(source or "").startswith(prefix)


def _displayed() -> list[DatasetSpec]:
    """The declarations in results-table order (``column_order``, then declaration)."""
    return sorted(REGISTRY.values(), key=lambda s: s.column_order)


def column_titles(angle: float = 35.0) -> dict[str, str]:
    """Every results-table column in table order with its title, a rotation sweep's at
    ``angle``."""
    text = f"{angle:g}"
    return {
        c.key.format(angle=text): c.title.format(angle=text)
        for spec in _displayed()
        for c in spec.columns
    }


def column_title(column: str) -> str:
    """The title of results column ``column`` (a sweep's at the angle after "@"); the
    column itself where no dataset declares it."""
    angle = column.partition("@")[2]
    for spec in _displayed():
        for c in spec.columns:
            if c.key.format(angle=angle) == column:
                return c.title.format(angle=angle)
    return column


def published_numbers() -> list[Published]:
    """Every dataset's published numbers (``published``), in table order."""
    return [number for spec in _displayed() for number in spec.published]


def rotation_sweep() -> DatasetSpec | None:
    """The dataset scored at the evaluate.angles rotations (``rotations_of``: its first
    evaluation set holds the results' rotation sweep, the dataset it names the upright
    set the rotation figures are drawn on); None when none is declared."""
    return next((s for s in REGISTRY.values() if s.rotations_of), None)


def viewpoint_dataset() -> str:
    """The dataset with viewpoint subsets (``subsets``): what the novel-viewpoint
    experiment trains and tests on; a DataError unless exactly one declares them."""
    having = [s.name for s in REGISTRY.values() if s.subsets]
    if len(having) != 1:
        raise DataError(f"the viewpoint experiment needs one dataset with subsets, not {having}")
    return having[0]


def summary_keys() -> list[SummaryKey]:
    """summary.json's numbers in its order: each dataset's ``summary``, in table order."""
    return [key for spec in _displayed() for key in spec.summary]
