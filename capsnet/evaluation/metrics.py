"""The eval/metrics.json contract, one home for its writer and its readers: the text the
evaluate stage writes (``metrics_json``, NaN as null) and the same file read once, checked
and typed (``load_results`` -> ``EvalResults``, whose ``to_json`` gives the bytes back).
The report, the README table and the W&B eval runs (pipeline/) read the results only
through these types: an ``Entry``'s scores per test set, rotation curve, attacks, skip
reasons and flat numbers, the ``Viewpoints`` section, and which entry fills a model's cell
(decided in ``capsnet.evaluation.headline``, shared with the evaluate stage's summary metrics)."""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsnet.evaluation import headline
from capsnet.evaluation.headline import COMPARISON_KEY, VIEWPOINTS_KEY
from capsnet.io.errors import CapsnetError
from capsnet.io.files import read_json

#: Sections of metrics.json beside the checkpoint and seed-mean entries.
SECTIONS = (COMPARISON_KEY, VIEWPOINTS_KEY)


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
    """metrics.json's text: ``results`` indented, NaN and infinities as null."""
    return json.dumps(_finite(results), indent=2) + "\n"


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
    """One evaluated checkpoint (``checkpoint`` set) or seed mean (``checkpoints`` and
    ``seeds`` set, deviations in ``std``). Read its numbers through the methods."""

    name: str
    model: str
    checkpoint: str | None
    checkpoints: tuple[str, ...]
    seeds: int
    _data: dict[str, Any] = field(repr=False, compare=False)

    def _block(self, test_set: str) -> dict[str, Any]:
        value = self._data.get(test_set)
        return value if isinstance(value, dict) and test_set != "std" else {}

    def value(self, column: str) -> float | None:
        """The accuracy a table column stands for ("mnist", "rotated-mnist@35",
        "multimnist" (strict), ...), None when absent or skipped."""
        return headline.cell_value(self._data, column)

    def std(self, column: str) -> float | None:
        """The seeds' standard deviation of ``value(column)``, None for a single checkpoint."""
        return headline.std_value(self._data, column)

    def source(self, test_set: str) -> str | None:
        """Which data a test set's numbers come from ("affnist-synth", "smallnorb-synth...")."""
        found = self._block(test_set).get("source")
        return None if found is None else str(found)

    def test_size(self, column: str) -> int | None:
        """How many test images a column's number counts."""
        return self._block(column.split("@")[0]).get("n")

    def rotation(self) -> list[tuple[float, float | None]]:
        """(angle, accuracy) of the rotated-MNIST sweep, by angle; [] without one."""
        accuracy = self._block("rotated-mnist").get("accuracy") or {}
        return sorted((float(a), acc) for a, acc in accuracy.items())

    def attacks(self) -> dict[str, dict[str, float | None]]:
        """{attack ("fgsm", "bim"): {epsilon: accuracy}}; {} when robustness was skipped."""
        robustness = self._block("robustness")
        return {a: robustness[a] for a in ("fgsm", "bim") if isinstance(robustness.get(a), dict)}

    @property
    def has_pose_diagnostic(self) -> bool:
        """Whether the equivariance diagnostic ran: the model has class-capsule poses."""
        return "dim_correlation" in self._block("equivariance")

    @property
    def trained_on(self) -> str | None:
        """The training set the checkpoint's name announces (``lenet5@multimnist`` ->
        "multimnist"), None for its model's own set."""
        return headline.trained_on(self.name, self._data)

    @property
    def skipped(self) -> dict[str, str]:
        """{test set: reason} of the sets this entry was not evaluated on."""
        return {
            key: str(value["skipped"])
            for key, value in self._data.items()
            if isinstance(value, dict) and key != "std" and "skipped" in value
        }

    def numbers(self) -> dict[str, float]:
        """Every finite number of the entry under a slash-joined key, e.g.
        ``mnist/accuracy``, ``rotated-mnist/accuracy/35``, ``robustness/fgsm/0.1``."""
        return _flatten(self._data)

    def canonical(self) -> dict[str, Any]:
        """The entry as metrics.json holds it (a copy), for content hashes."""
        return copy.deepcopy(self._data)


@dataclass(frozen=True)
class ViewpointModel:
    """One model of a novel-viewpoint comparison, at its selected epoch."""

    role: str
    model: str
    epoch: int | None
    familiar_error: float | None
    novel_error: float | None
    paper_novel_error: float | None


@dataclass(frozen=True)
class ViewpointKind:
    """The comparison on novel azimuths or elevations, or why it was skipped."""

    kind: str
    skipped: str | None = None
    models: tuple[ViewpointModel, ...] = ()
    target_familiar_error: float | None = None
    gap: float | None = None
    matched: bool = False


@dataclass(frozen=True)
class Viewpoints:
    """metrics.json's novel-viewpoint section: the matching rule and one comparison per
    kind, or why the experiment was not run."""

    rule: str | None = None
    skipped: str | None = None
    kinds: tuple[ViewpointKind, ...] = ()
    _data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _num(value: Any) -> float | None:
    """A number as metrics.json holds it (int or float), None for anything else."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ComparisonGroup:
    """One model's seeds in a comparison arm: accuracy mean and std by angle key (None
    where not a number), the training time and, in the equal-time arm, its share of the
    budget."""

    label: str
    model: str | None
    names: tuple[str, ...]
    seeds: int
    augment: str | None
    epochs: float | None
    train_seconds: float | None
    train_seconds_std: float | None
    time_ratio: float | None
    within_tolerance: bool | None
    accuracy: dict[str, float | None]
    std: dict[str, float | None]


@dataclass(frozen=True)
class ComparisonArm:
    """One arm (equal augmentation, equal time, augmented baseline) and its groups."""

    name: str
    reference: str | None
    augment: str | None
    epochs: float | None
    time_budget_seconds: float | None
    tolerance: float | None
    groups: dict[str, ComparisonGroup]


@dataclass(frozen=True)
class Comparison:
    """metrics.json's seeds comparison: its arms by name (non-mapping parts left out)."""

    arms: dict[str, ComparisonArm]
    _data: dict[str, Any] = field(repr=False, compare=False)

    def canonical(self) -> dict[str, Any]:
        """The section as metrics.json holds it (a copy), for content hashes."""
        return copy.deepcopy(self._data)


def _text(value: Any) -> str | None:
    return str(value) if value else None


def _comparison_group(label: str, g: dict) -> ComparisonGroup:
    names = tuple(str(n) for n in g.get("names") or [])
    seeds = g.get("seeds") if isinstance(g.get("seeds"), int) else len(names) or 1
    within = g.get("within_tolerance")
    angles = {k: _num(v) for k, v in (g.get("accuracy") or {}).items()}
    stds = {k: _num(v) for k, v in (g.get("std") or {}).items()}
    return ComparisonGroup(
        label, _text(g.get("model")), names, seeds, _text(g.get("augment")), _num(g.get("epochs")),
        _num(g.get("train_seconds")), _num(g.get("train_seconds_std")), _num(g.get("time_ratio")),
        within if isinstance(within, bool) else None, angles, stds,
    )  # fmt: skip


def _comparison_arm(name: str, arm: dict) -> ComparisonArm:
    models = arm.get("models") if isinstance(arm.get("models"), dict) else {}
    groups = {k: _comparison_group(k, g) for k, g in models.items() if isinstance(g, dict)}
    return ComparisonArm(
        name, _text(arm.get("reference")), _text(arm.get("augment")), _num(arm.get("epochs")),
        _num(arm.get("time_budget_seconds")), _num(arm.get("tolerance")), groups,
    )  # fmt: skip


def as_comparison(section: Any) -> Comparison | None:
    """metrics.json's "comparison" typed (parts that are not mappings left out, a value
    that is not a number read as none); None when it is not a mapping."""
    if isinstance(section, Comparison) or not isinstance(section, dict):
        return section if isinstance(section, Comparison) else None
    arms = section.get("arms") if isinstance(section.get("arms"), dict) else {}
    typed = {n: _comparison_arm(n, arm) for n, arm in arms.items() if isinstance(arm, dict)}
    return Comparison(typed, section)


@dataclass(frozen=True)
class EvalResults:
    """metrics.json, checked: the entries by name, the comparison section (put into words
    and tables by pipeline.comparison_text) and the viewpoint section."""

    entries: dict[str, Entry]
    comparison: Comparison | None
    viewpoints: Viewpoints | None
    _order: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """metrics.json's content, its names in the order read (a copy)."""
        parts = {n: e._data for n, e in self.entries.items()}
        for key, section in ((COMPARISON_KEY, self.comparison), (VIEWPOINTS_KEY, self.viewpoints)):
            if section is not None:
                parts[key] = section._data
        order = [n for n in self._order if n in parts] + [n for n in parts if n not in self._order]
        return copy.deepcopy({n: parts[n] for n in order})

    def to_json(self) -> str:
        """metrics.json's text (``metrics_json``): what was read, byte for byte."""
        return metrics_json(self.to_dict())

    def checkpoints(self) -> dict[str, Entry]:
        """The entries of single checkpoints (no seed means)."""
        return {n: e for n, e in self.entries.items() if e.checkpoint is not None}

    def main_entries(self) -> dict[str, Entry]:
        """The entries the results table is built from: no comparison runs (equal time,
        augmented baselines) nor their means."""
        data = {n: e._data for n, e in self.entries.items()}
        if self.comparison is not None:
            data[COMPARISON_KEY] = self.comparison._data
        return {n: self.entries[n] for n in headline.main_entries(data)}


def table_columns(entries: dict[str, Entry], angle: float = 35.0) -> list[str]:
    """The result columns that hold at least one number of ``entries``, in a fixed order."""
    return headline.table_columns({n: e._data for n, e in entries.items()}, angle)


def model_picks(entries: dict[str, Entry], columns: list[str]) -> dict[str, dict[str, Entry]]:
    """{model: {column: entry}}: one row per model, each cell from the entry trained for
    that column's set (``capsnet.evaluation.headline.pick``)."""
    picks = headline.model_picks({n: e._data for n, e in entries.items()}, columns)
    return {
        model: {column: entries[name] for column, (name, _) in chosen.items()}
        for model, chosen in picks.items()
    }


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


def _entry(path: Path, name: str, data: dict) -> Entry:
    where = f"{path}: {name}"
    model, checkpoint = data.get("model"), data.get("checkpoint")
    checkpoints = data.get("checkpoints") or []
    if not isinstance(model, str) or not model:
        raise CapsnetError(f"{where}: no model name")
    if checkpoint is None and not checkpoints:
        raise CapsnetError(f"{where}: neither a checkpoint nor the checkpoints of a seed mean")
    if not isinstance(checkpoint, (str, type(None))) or not all(
        isinstance(c, str) for c in checkpoints
    ):
        raise CapsnetError(f"{where}: checkpoint paths must be text")
    for key, value in data.items():
        if isinstance(value, dict):
            _check_scores(f"{where}/{key}", value)
    seeds = data.get("seeds", 1)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise CapsnetError(f"{where}/seeds: a count >= 1 expected")
    return Entry(name, model, checkpoint, tuple(checkpoints), seeds, data)


def _optional(where: str, data: dict, key: str, kind: type | tuple) -> Any:
    value = data.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise CapsnetError(f"{where}/{key}: {getattr(kind, '__name__', 'a number')} expected")
    return value


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
        models=tuple(
            ViewpointModel(
                role,
                str(m.get("model", "")),
                _optional(f"{where}/models/{role}", m, "epoch", int),
                _optional(f"{where}/models/{role}", m, "familiar_error", number),
                _optional(f"{where}/models/{role}", m, "novel_error", number),
                _optional(f"{where}/models/{role}", m, "paper_novel_error", number),
            )
            for role, m in models.items()
        ),
        target_familiar_error=_optional(where, data, "target_familiar_error", number),
        gap=_optional(where, data, "gap", number),
        matched=bool(data.get("matched")),
    )


def _viewpoints(path: Path, data: dict | None) -> Viewpoints | None:
    if data is None:
        return None
    where = f"{path}: {VIEWPOINTS_KEY}"
    rule = _optional(where, data, "rule", str)
    if "skipped" in data:
        return Viewpoints(rule, str(data["skipped"]), _data=data)
    kinds = {} if data.get("kinds") is None else data["kinds"]
    if not isinstance(kinds, dict):
        raise CapsnetError(f"{where}/kinds: a mapping expected")
    parsed = tuple(_viewpoint_kind(where, k, v) for k, v in kinds.items())
    return Viewpoints(rule, None, parsed, data)


def load_results(path: str | os.PathLike) -> EvalResults:
    """metrics.json checked against the schema of capsnet/evaluation/ (CapsnetError naming the
    file and the entry otherwise); at least one evaluated checkpoint is required."""
    path = Path(path)
    return parse_results(read_json(path, "run the evaluate stage first"), path)


def parse_results(data: Any, path: str | os.PathLike = "metrics.json") -> EvalResults:
    """``load_results`` for a value already read (``path`` names it in errors); an
    ``EvalResults`` is returned as it is."""
    if isinstance(data, EvalResults):
        return data
    path = Path(path)
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise CapsnetError(f"{path}: not an evaluation result ({{name: {{...}}}} expected)")
    entries = {
        name: _entry(path, name, value) for name, value in data.items() if name not in SECTIONS
    }
    if not any(e.checkpoint is not None for e in entries.values()):
        raise CapsnetError(f"{path}: no evaluated checkpoint; run the evaluate stage first")
    comparison = data.get(COMPARISON_KEY)
    if comparison is not None and not isinstance(comparison.get("arms", {}), dict):
        raise CapsnetError(f"{path}: {COMPARISON_KEY}/arms: a mapping expected")
    viewpoints = _viewpoints(path, data.get(VIEWPOINTS_KEY))
    return EvalResults(entries, as_comparison(comparison), viewpoints, tuple(data))
