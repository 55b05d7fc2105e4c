"""The eval/metrics.json contract: the dataclasses its writers build and its readers get
back, and the one serialiser between them.

The evaluate stage and ``capsnet eval`` construct an ``EvalResults`` (checkpoint and
seed-mean ``Entry``s from ``capsnet.evaluation.checkpoints`` and ``seeds``, the
``Comparison`` from ``comparison``, the ``Viewpoints`` from ``novel_viewpoints``) and write
it with ``metrics_json``; the report, the README table and the W&B eval runs (pipeline/)
read the file with ``load_results`` into the same classes, checked. Field names and their
order in the file live here once (each class's ``to_dict``). The rules that read them
(a column's number, which entry fills a model's cell) are ``capsnet.evaluation.headline``,
which imports this module, never the other way."""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsnet.io.errors import CapsnetError
from capsnet.io.files import read_json

VIEWPOINTS_KEY = "viewpoints"  # metrics.json's novel-viewpoint section, not a checkpoint
COMPARISON_KEY = "comparison"  # metrics.json's seeds comparison, not a checkpoint
#: Sections of metrics.json beside the checkpoint and seed-mean entries.
SECTIONS = (COMPARISON_KEY, VIEWPOINTS_KEY)
#: The comparison's arms and the fields each writes before its "models", in file order.
ARM_FIELDS = {
    "equal_augmentation": ("augment", "epochs", "reference"),
    "equal_time": ("reference", "time_budget_seconds", "budgeted_seconds", "tolerance"),
    "baseline_augmentation": (),
}
ARMS = tuple(ARM_FIELDS)


def rotation_set() -> str | None:
    """The evaluation set holding the rotation sweep, as the dataset declarations say
    (``capsnet.config.dataset_specs.rotation_sweep``); None when none is declared."""
    from capsnet.config import dataset_specs

    spec = dataset_specs.rotation_sweep()
    return None if spec is None else spec.evaluation[0]


def _finite(value):
    """JSON-safe: NaN and infinities become null (DVC and browsers reject NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def metrics_json(results: EvalResults | dict[str, Any]) -> str:
    """metrics.json's text: ``results`` (or its content) indented, NaN and infinities as null."""
    content = results.to_dict() if isinstance(results, EvalResults) else results
    return json.dumps(_finite(content), indent=2) + "\n"


def _flatten(scores: dict, prefix: str = "") -> dict[str, float]:
    flat: dict[str, float] = {}
    for key, value in scores.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            if "skipped" not in value:
                flat.update(_flatten(value, name + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                flat[name] = value
    return flat


@dataclass(frozen=True)
class Entry:
    """One evaluated checkpoint (``checkpoint`` set) or the mean of an experiment's seeds
    (``names`` and ``checkpoints`` of the grouped entries, their count in ``seeds``, the
    deviations in ``deviations``, the seeds left out at chance in ``failed``). ``scores``:
    {test set or probe (``capsnet.evaluation.probes``): its block}, a block being
    {"skipped": reason} where the set was not scored."""

    name: str
    model: str
    checkpoint: str | None = None
    names: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()
    seeds: int = 1
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    deviations: dict[str, Any] = field(default_factory=dict)
    failed: tuple[str, ...] = ()  # seeds at chance on their own set: not in the mean

    def to_dict(self) -> dict[str, Any]:
        """The entry as metrics.json holds it."""
        if self.checkpoint is not None:
            return {
                "model": self.model,
                "checkpoint": self.checkpoint,
                **copy.deepcopy(self.scores),
            }
        return {
            "model": self.model,
            "names": list(self.names),
            "checkpoints": list(self.checkpoints),
            "seeds": self.seeds,
            **({"failed": list(self.failed)} if self.failed else {}),
            **copy.deepcopy(self.scores),
            "std": copy.deepcopy(self.deviations),
        }

    def block(self, test_set: str) -> dict[str, Any]:
        """The scores of one test set ({} when absent)."""
        value = self.scores.get(test_set)
        return value if isinstance(value, dict) else {}

    def source(self, test_set: str) -> str | None:
        """Which data a test set's numbers come from ("affnist-synth", "smallnorb-synth...")."""
        found = self.block(test_set).get("source")
        return None if found is None else str(found)

    def test_size(self, column: str) -> int | None:
        """How many test images a column's number counts."""
        return self.block(column.split("@")[0]).get("n")

    def has_sweep(self) -> bool:
        """Whether the entry holds accuracies of the rotation sweep (``rotation_set``)."""
        return "accuracy" in self.block(rotation_set())

    def sweep(self) -> dict[str, Any]:
        """{"<angle>": accuracy} of the rotated-MNIST sweep, as written; {} without one."""
        return self.block(rotation_set()).get("accuracy") or {}

    def sweep_std(self) -> dict[str, Any]:
        """{"<angle>": the seeds' deviation} of a seed mean's sweep; {} otherwise."""
        found = self.deviations.get(rotation_set())
        return (found.get("accuracy") or {}) if isinstance(found, dict) else {}

    def rotation(self) -> list[tuple[float, float | None]]:
        """(angle, accuracy) of the rotated-MNIST sweep, by angle; [] without one."""
        return sorted((float(a), acc) for a, acc in self.sweep().items())

    @property
    def skipped(self) -> dict[str, str]:
        """{test set: reason} of the sets this entry was not evaluated on."""
        return {
            key: str(value["skipped"])
            for key, value in self.scores.items()
            if isinstance(value, dict) and "skipped" in value
        }

    def numbers(self) -> dict[str, float]:
        """Every finite number of the entry under a slash-joined key, e.g.
        ``mnist/accuracy``, ``rotated-mnist/accuracy/35``, ``robustness/fgsm/0.1``."""
        return _flatten(self.scores)


@dataclass(frozen=True)
class ViewpointModel:
    """One model of a novel-viewpoint comparison, at its selected epoch."""

    role: str
    model: str
    epoch: int | float | None  # fractional: a check within an epoch
    familiar_error: float | None
    novel_error: float | None
    paper_novel_error: float | None
    checkpoint: str | None = None
    familiar_n: int | None = None
    novel_n: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "checkpoint": self.checkpoint,
            "epoch": self.epoch,
            "familiar_error": self.familiar_error,
            "familiar_n": self.familiar_n,
            "novel_error": self.novel_error,
            "novel_n": self.novel_n,
            "paper_novel_error": self.paper_novel_error,
        }


@dataclass(frozen=True)
class ViewpointKind:
    """The comparison on novel azimuths or elevations for one seed, or why it was skipped.
    ``kind``: the key of viewpoints.json (``azimuth``, or ``azimuth@seed1`` for a later
    seed); ``selection``: the choice made at training time
    (``capsnet.evaluation.viewpoint_matching``), whose target, gap and verdict the kind
    carries: one verdict per kind, the stage's."""

    kind: str
    skipped: str | None = None
    models: tuple[ViewpointModel, ...] = ()
    target_familiar_error: float | None = None
    gap: float | None = None
    matched: bool = False
    tolerance: float | None = None
    selection: dict[str, Any] | None = None
    paper_novel_error: dict[str, float] | None = None
    seed: int | None = None
    rescored_gap: float | None = None  # the evaluate stage's re-score on the same images

    @property
    def viewpoints(self) -> str:
        """azimuth or elevation: the key without its seed."""
        return self.kind.partition("@")[0]

    def to_dict(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        return {
            **({} if self.seed is None else {"seed": self.seed}),
            "models": {m.role: m.to_dict() for m in self.models},
            "target_familiar_error": self.target_familiar_error,
            "gap": self.gap,
            "tolerance": self.tolerance,
            "matched": self.matched,
            **({} if self.rescored_gap is None else {"rescored_gap": self.rescored_gap}),
            "selection": copy.deepcopy(self.selection),
            "paper_novel_error": copy.deepcopy(self.paper_novel_error),
        }


@dataclass(frozen=True)
class Viewpoints:
    """metrics.json's novel-viewpoint section: the matching rule, the paper it follows and
    one comparison per kind, or why the experiment was not run."""

    rule: str | None = None
    skipped: str | None = None
    kinds: tuple[ViewpointKind, ...] = ()
    paper: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        kinds = {k.kind: k.to_dict() for k in self.kinds}
        return {"rule": self.rule, "paper": self.paper, "kinds": kinds}


def _num(value: Any) -> float | None:
    """A number as metrics.json holds it (int or float), None for anything else."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ComparisonGroup:
    """One model's seeds in a comparison arm (``label``: its key in the arm): accuracy mean
    and sample std by angle key (None where not a number), the measured training time, the
    seeds that trained on a busy machine (``busy``, with the highest load average seen:
    their measured time is not trustworthy) and, in the equal-time arm, the time the
    step-cost rule budgets (``budgeted_seconds``: a step's cost x the steps). A baseline of
    that arm has its budgeted and measured time over the reference's (``budgeted_ratio``,
    ``time_ratio``) and ``within_tolerance``, judged on the budgeted ratio (None elsewhere,
    and then none of the three is written)."""

    label: str
    model: str | None
    names: tuple[str, ...]
    seeds: int
    augment: str | None
    epochs: float | None
    train_seconds: float | None
    train_seconds_std: float | None
    accuracy: dict[str, float | None]
    std: dict[str, float | None]
    time_ratio: float | None = None
    within_tolerance: bool | None = None
    budgeted_seconds: float | None = None
    budgeted_ratio: float | None = None
    busy: tuple[str, ...] = ()
    load_average: float | None = None

    def to_dict(self) -> dict[str, Any]:
        row = {
            "model": self.model,
            "names": list(self.names),
            "seeds": self.seeds,
            "augment": self.augment,
            "epochs": self.epochs,
            "train_seconds": self.train_seconds,
            "train_seconds_std": self.train_seconds_std,
            "accuracy": dict(self.accuracy),
            "std": dict(self.std),
        }
        if self.budgeted_seconds is not None:
            row["budgeted_seconds"] = self.budgeted_seconds
        if self.load_average is not None:
            row.update(load_average=self.load_average, busy=list(self.busy))
        if self.within_tolerance is not None:
            row["time_ratio"] = self.time_ratio
            if self.budgeted_ratio is not None:
                row["budgeted_ratio"] = self.budgeted_ratio
            row["within_tolerance"] = self.within_tolerance
        return row


@dataclass(frozen=True)
class ComparisonArm:
    """One arm (``ARM_FIELDS``: equal augmentation, equal time, augmented baseline) and its
    groups by label; an arm writes only its own fields."""

    name: str
    groups: dict[str, ComparisonGroup]
    reference: str | None = None
    augment: str | None = None
    epochs: float | None = None
    time_budget_seconds: float | None = None
    tolerance: float | None = None
    budgeted_seconds: float | None = None  # the reference's step cost x its steps

    def to_dict(self) -> dict[str, Any]:
        own = {key: getattr(self, key) for key in ARM_FIELDS.get(self.name, ())}
        if own.get("budgeted_seconds", 0) is None:  # runs from before the step-cost record
            del own["budgeted_seconds"]
        return {**own, "models": {label: g.to_dict() for label, g in self.groups.items()}}


@dataclass(frozen=True)
class Comparison:
    """metrics.json's seeds comparison: the evaluated angles and its arms by name."""

    angles: list[float]
    arms: dict[str, ComparisonArm]

    def to_dict(self) -> dict[str, Any]:
        """The section as metrics.json holds it."""
        return {"angles": list(self.angles), "arms": {n: a.to_dict() for n, a in self.arms.items()}}


def _text(value: Any) -> str | None:
    return str(value) if value else None


def _comparison_group(label: str, g: dict) -> ComparisonGroup:
    names = tuple(str(n) for n in g.get("names") or [])
    seeds = g.get("seeds") if isinstance(g.get("seeds"), int) else len(names) or 1
    within = g.get("within_tolerance")
    angles = {k: _num(v) for k, v in (g.get("accuracy") or {}).items()}
    stds = {k: _num(v) for k, v in (g.get("std") or {}).items()}
    busy = tuple(str(n) for n in g.get("busy") or [] if isinstance(n, str))
    return ComparisonGroup(
        label, _text(g.get("model")), names, seeds, _text(g.get("augment")), _num(g.get("epochs")),
        _num(g.get("train_seconds")), _num(g.get("train_seconds_std")), angles, stds,
        _num(g.get("time_ratio")), within if isinstance(within, bool) else None,
        _num(g.get("budgeted_seconds")), _num(g.get("budgeted_ratio")), busy,
        _num(g.get("load_average")),
    )  # fmt: skip


def _comparison_arm(name: str, arm: dict) -> ComparisonArm:
    models = arm.get("models") if isinstance(arm.get("models"), dict) else {}
    groups = {k: _comparison_group(k, g) for k, g in models.items() if isinstance(g, dict)}
    return ComparisonArm(
        name, groups, _text(arm.get("reference")), _text(arm.get("augment")),
        _num(arm.get("epochs")), _num(arm.get("time_budget_seconds")), _num(arm.get("tolerance")),
        _num(arm.get("budgeted_seconds")),
    )  # fmt: skip


def as_comparison(section: Any) -> Comparison | None:
    """metrics.json's "comparison" typed (parts that are not mappings left out, a value
    that is not a number read as none); None when it is not a mapping."""
    if isinstance(section, Comparison) or not isinstance(section, dict):
        return section if isinstance(section, Comparison) else None
    arms = section.get("arms") if isinstance(section.get("arms"), dict) else {}
    typed = {n: _comparison_arm(n, arm) for n, arm in arms.items() if isinstance(arm, dict)}
    angles = section.get("angles") if isinstance(section.get("angles"), list) else []
    return Comparison([a for a in angles if _num(a) is not None], typed)


@dataclass(frozen=True)
class EvalResults:
    """metrics.json: the entries by name (checkpoints, then seed means), the comparison
    section (put into words and tables by pipeline.publish.comparison) and the viewpoint
    section."""

    entries: dict[str, Entry]
    comparison: Comparison | None = None
    viewpoints: Viewpoints | None = None

    def to_dict(self) -> dict[str, Any]:
        """metrics.json's content: the entries in order, then the sections."""
        content = {name: entry.to_dict() for name, entry in self.entries.items()}
        if self.comparison is not None:
            content[COMPARISON_KEY] = self.comparison.to_dict()
        if self.viewpoints is not None:
            content[VIEWPOINTS_KEY] = self.viewpoints.to_dict()
        return content

    def to_json(self) -> str:
        """metrics.json's text (``metrics_json``)."""
        return metrics_json(self)

    def checkpoints(self) -> dict[str, Entry]:
        """The entries of single checkpoints (no seed means)."""
        return {n: e for n, e in self.entries.items() if e.checkpoint is not None}

    def means(self) -> dict[str, Entry]:
        """The seed-mean entries."""
        return {n: e for n, e in self.entries.items() if e.checkpoint is None}


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _check_scores(where: str, scores: Any) -> None:
    """Numbers (or null) at every leaf but the known text fields; a skip has its reason."""
    text_keys = ("skipped", "source", "attack", "subset")
    if isinstance(scores, dict):
        for key, value in scores.items():
            if key in text_keys:
                if not isinstance(value, str):
                    raise CapsnetError(f"{where}/{key}: text expected")
            else:
                _check_scores(f"{where}/{key}", value)
    elif isinstance(scores, list):
        for i, value in enumerate(scores):
            _check_scores(f"{where}/{i}", value)
    elif not _is_number(scores):
        raise CapsnetError(f"{where}: a number expected, got {scores!r:.40}")


#: The fields of an entry beside its score blocks.
ENTRY_FIELDS = ("model", "checkpoint", "names", "checkpoints", "seeds", "std", "failed")


def _entry(path: Path, name: str, data: Any) -> Entry:
    if isinstance(data, Entry):
        return data
    where = f"{path}: {name}"
    model, checkpoint = data.get("model"), data.get("checkpoint")
    checkpoints = data.get("checkpoints") or []
    if not isinstance(model, str) or not model:
        raise CapsnetError(f"{where}: no model name")
    if checkpoint is None and not checkpoints:
        raise CapsnetError(f"{where}: neither a checkpoint nor the checkpoints of a seed mean")
    names, failed = data.get("names") or [], data.get("failed") or []
    if not isinstance(checkpoint, (str, type(None))) or not all(
        isinstance(c, str) for c in [*checkpoints, *names, *failed]
    ):
        raise CapsnetError(f"{where}: checkpoint paths and names must be text")
    scores = {k: v for k, v in data.items() if k not in ENTRY_FIELDS}
    for key, value in scores.items():
        if not isinstance(value, dict):
            raise CapsnetError(f"{where}/{key}: a mapping of scores expected")
        _check_scores(f"{where}/{key}", value)
    deviations = data.get("std") or {}
    _check_scores(f"{where}/std", deviations)
    seeds = data.get("seeds", 1)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise CapsnetError(f"{where}/seeds: a count >= 1 expected")
    return Entry(name, model, checkpoint, tuple(names), tuple(checkpoints), seeds, scores,
                 deviations if isinstance(deviations, dict) else {}, tuple(failed))  # fmt: skip


def _optional(where: str, data: dict, key: str, kind: type | tuple) -> Any:
    value = data.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise CapsnetError(f"{where}/{key}: {getattr(kind, '__name__', 'a number')} expected")
    return value


def _viewpoint_model(where: str, role: str, m: dict) -> ViewpointModel:
    where, number = f"{where}/models/{role}", (int, float)
    return ViewpointModel(
        role,
        str(m.get("model", "")),
        _optional(where, m, "epoch", number),
        _optional(where, m, "familiar_error", number),
        _optional(where, m, "novel_error", number),
        _optional(where, m, "paper_novel_error", number),
        _optional(where, m, "checkpoint", str),
        _optional(where, m, "familiar_n", int),
        _optional(where, m, "novel_n", int),
    )


def _viewpoint_kind(where: str, kind: str, data: Any) -> ViewpointKind:
    where = f"{where}/{kind}"
    if not isinstance(data, dict):
        raise CapsnetError(f"{where}: a mapping expected")
    if "skipped" in data:
        return ViewpointKind(kind, skipped=str(data["skipped"]))
    models = {} if data.get("models") is None else data["models"]
    if not isinstance(models, dict) or not all(isinstance(m, dict) for m in models.values()):
        raise CapsnetError(f"{where}/models: a mapping of models expected")
    number = (int, float)
    return ViewpointKind(
        kind,
        models=tuple(_viewpoint_model(where, role, m) for role, m in models.items()),
        target_familiar_error=_optional(where, data, "target_familiar_error", number),
        gap=_optional(where, data, "gap", number),
        matched=bool(data.get("matched")),
        tolerance=_optional(where, data, "tolerance", number),
        selection=_optional(where, data, "selection", dict),
        paper_novel_error=_optional(where, data, "paper_novel_error", dict),
        seed=_optional(where, data, "seed", int),
        rescored_gap=_optional(where, data, "rescored_gap", number),
    )


def _viewpoints(path: Path, data: Any) -> Viewpoints | None:
    if data is None or isinstance(data, Viewpoints):
        return data
    where = f"{path}: {VIEWPOINTS_KEY}"
    if not isinstance(data, dict):
        raise CapsnetError(f"{where}: a mapping expected")
    rule = _optional(where, data, "rule", str)
    if "skipped" in data:
        return Viewpoints(rule, str(data["skipped"]))
    kinds = {} if data.get("kinds") is None else data["kinds"]
    if not isinstance(kinds, dict):
        raise CapsnetError(f"{where}/kinds: a mapping expected")
    parsed = tuple(_viewpoint_kind(where, k, v) for k, v in kinds.items())
    return Viewpoints(rule, None, parsed, _optional(where, data, "paper", str))


def load_results(path: str | os.PathLike) -> EvalResults:
    """metrics.json checked against the schema of capsnet/evaluation/ (CapsnetError naming the
    file and the entry otherwise); at least one evaluated checkpoint is required."""
    path = Path(path)
    return parse_results(read_json(path, "run the evaluate stage first"), path)


def parse_results(
    data: Any, path: str | os.PathLike = "metrics.json", evaluated: bool = True
) -> EvalResults:
    """``load_results`` for a value already read (``path`` names it in errors; sections and
    entries already typed are taken as they are); an ``EvalResults`` is returned as it is.
    ``evaluated``: refuse a result without an evaluated checkpoint."""
    if isinstance(data, EvalResults):
        return data
    path = Path(path)
    if not isinstance(data, dict) or not all(
        isinstance(v, (dict, Entry, Comparison, Viewpoints)) for v in data.values()
    ):
        raise CapsnetError(f"{path}: not an evaluation result ({{name: {{...}}}} expected)")
    entries = {
        name: _entry(path, name, value) for name, value in data.items() if name not in SECTIONS
    }
    if evaluated and not any(e.checkpoint is not None for e in entries.values()):
        raise CapsnetError(f"{path}: no evaluated checkpoint; run the evaluate stage first")
    comparison = data.get(COMPARISON_KEY)
    if isinstance(comparison, dict) and not isinstance(comparison.get("arms", {}), dict):
        raise CapsnetError(f"{path}: {COMPARISON_KEY}/arms: a mapping expected")
    viewpoints = _viewpoints(path, data.get(VIEWPOINTS_KEY))
    return EvalResults(entries, as_comparison(comparison), viewpoints)
