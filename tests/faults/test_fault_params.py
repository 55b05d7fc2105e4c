"""Bad params files, generated: every leaf of every section given values of the wrong type,
non-finite or too large, and whole files that are not UTF-8, not YAML or repeat a key, for
every command that reads params. Each ends as one line naming the file and the key."""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path

import pytest
import yaml
from faulthelpers import invoke, invoke_bounded, judge, snapshot

from capsnet.config import Params
from capsnet.config.schema import Searched

HUGE = 2**70
NAN, INF = float("nan"), float("inf")

SCALAR_BAD = {
    int: ["abc", 1.5, NAN, [1], True, HUGE],
    float: [NAN, INF, -INF, "abc", [1.0], True],
    bool: ["maybe", 3],
    str: [[1, 2], {"a": 1}, 7],
}


def leaves(cls, prefix: tuple[str, ...] = ()):
    """(dotted key path, annotation) of every non-dataclass field under ``cls``."""
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        tp = hints[item.name]
        if dataclasses.is_dataclass(tp):
            yield from leaves(tp, (*prefix, item.name))
        else:
            yield (*prefix, item.name), tp


def bad_values(tp) -> list:
    """Values no field of annotation ``tp`` accepts."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return bad_values(inner[0]) if len(inner) == 1 else [[{"x": NAN}]]
    if origin is Searched:
        (inner,) = args
        numeric = inner in (int, float)
        drawn = [{"uniform": [NAN, 1.0]}, {"loguniform": [0.0, 1.0]}] if numeric else []
        return [*bad_values(inner)[:2], {"grid": []}, {"bogus": [1]}, *drawn]
    if origin is typing.Literal:
        return ["no-such-choice", 1]
    if origin in (tuple, list):
        fixed = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
        element = bad_values(args[0])[0] if args else NAN
        return ["not-a-list", [element] * (len(args) if fixed else 1)]
    if origin is dict:
        return ["not-a-mapping", [1]]
    return SCALAR_BAD.get(tp, [[{"x": NAN}]])


def nested(keys: tuple[str, ...], value) -> dict:
    for key in reversed(keys):
        value = {key: value}
    return value


CASES = [
    pytest.param(keys, value, id=f"{'.'.join(keys)}={value!r}"[:80])
    for keys, tp in leaves(Params)
    for value in bad_values(tp)
]


@pytest.mark.parametrize("keys, value", CASES)
def test_a_bad_value_names_its_key(tmp_path, tally, keys, value):
    params = tmp_path / "bad-params.yaml"
    params.write_text(yaml.safe_dump(nested(keys, value)))
    done = invoke("evaluate-stage", "--params", params)
    judge(tally, done, code=1, names=("bad-params.yaml", ".".join(keys)))


def whole_numbers(tp) -> bool:
    """Whether a field of annotation ``tp`` takes a whole number (alone, in a union, a
    sweep dimension or a list)."""
    if tp is int:
        return True
    return any(whole_numbers(a) for a in typing.get_args(tp) if a is not Ellipsis)


def takes_text(tp) -> bool:
    if tp is str:
        return True
    return any(takes_text(a) for a in typing.get_args(tp) if a is not Ellipsis)


#: A whole number that fits 64 bits but would make any count run for ever.
ENDLESS = 2**62
INT_LEAVES = [keys for keys, tp in leaves(Params) if whole_numbers(tp)]
TEXT_LEAVES = [keys for keys, tp in leaves(Params) if takes_text(tp)]


def _as(tp_keys: tuple[str, ...], value):
    """``value`` shaped as the leaf at ``tp_keys`` takes it (in a list or a mapping)."""
    origin = typing.get_origin(dict(leaves(Params))[tp_keys])
    return [value] if origin in (list, tuple) else {"name": value} if origin is dict else value


@pytest.mark.parametrize("keys", INT_LEAVES, ids=".".join)
def test_every_count_has_a_bound(tmp_path, tally, keys):
    """A whole number far too large (a count of epochs, checks, seeds, images...) is
    refused by the config with the key and its bound, before any work could hang."""
    params = tmp_path / "bad-params.yaml"
    params.write_text(yaml.safe_dump(nested(keys, _as(keys, ENDLESS))))
    done = invoke("evaluate-stage", "--params", params)
    judge(tally, done, code=1, names=("bad-params.yaml", ".".join(keys)))


@pytest.mark.parametrize("keys", TEXT_LEAVES, ids=".".join)
def test_a_nul_byte_in_any_text_setting_names_its_key(tmp_path, tally, keys):
    params = tmp_path / "bad-params.yaml"
    params.write_text(yaml.safe_dump(nested(keys, _as(keys, "runs/a\x00b"))))
    done = invoke("evaluate-stage", "--params", params)
    judge(tally, done, code=1, names=("bad-params.yaml", ".".join(keys), "NUL"))


def test_a_huge_checks_per_epoch_is_refused_before_the_viewpoints_run(tmp_path, tally):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"viewpoints": {"checks_per_epoch": {"cnn": 2**63 - 1}}}))
    done = invoke_bounded("viewpoints", "--params", params, timeout=120)
    judge(tally, done, code=1, names=("viewpoints.checks_per_epoch.cnn", "<= 1,000"))


#: name -> (bytes of a params file, what its one line says).
BAD_FILES = {
    "latin-1": ("train:\n  epochs: 1  # caf\xe9\n".encode("latin-1"), "not UTF-8"),
    "random-bytes": (bytes(range(256)) * 4, "not UTF-8"),
    "not-yaml": (b"train: [1, 2\nsweep: {\n", "not valid YAML"),
    "a-list": (b"- train\n- sweep\n", "expected a mapping"),
    "duplicate-section": (b"train:\n  epochs: 1\ntrain:\n  epochs: 2\n", "duplicate key"),
    "duplicate-nested": (b"sweep:\n  epochs: 1\n  epochs: 2\n", "sweep.epochs: duplicate"),
    "unknown-section": (b"trian:\n  epochs: 1\n", "trian"),
    "unknown-key": (b"data:\n  mnist:\n    shfit: 1\n", "data.mnist.shfit"),
    "yaml-object": (b"train: !!python/object:os.system {}\n", "not valid YAML"),
}

#: Every command that reads a params file, with the other arguments it needs.
PARAMS_COMMANDS = {
    "evaluate-stage": [],
    "viewpoints": [],
    "sweep": [],
    "train-final": [],
    "publish": [],
    "data prepare": ["mnist"],
    "data download": ["mnist"],
    "data show": ["mnist", "--out", "{tmp}/grid.png"],
}


@pytest.mark.parametrize("command", sorted(PARAMS_COMMANDS))
@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_a_bad_params_file_is_one_line_for_every_command(tmp_path, tally, command, kind):
    if command in ("sweep", "train-final", "publish"):
        pytest.importorskip("ray")
    content, fragment = BAD_FILES[kind]
    params = tmp_path / "bad-params.yaml"
    params.write_bytes(content)
    extra = [a.format(tmp=tmp_path) for a in PARAMS_COMMANDS[command]]
    done = invoke(*command.split(), *extra, "--params", params)
    judge(tally, done, names=("bad-params.yaml", fragment))


@pytest.mark.parametrize("command", sorted(PARAMS_COMMANDS))
@pytest.mark.parametrize("kind", ["missing", "a-directory", "unreadable", "a-fifo"])
def test_a_params_file_that_cannot_be_read(tmp_path, tally, command, kind):
    if command in ("sweep", "train-final", "publish"):
        pytest.importorskip("ray")
    params = tmp_path / "params-here.yaml"
    if kind == "a-directory":
        params.mkdir()
    elif kind == "a-fifo":
        os.mkfifo(params)  # opening it would wait for a writer forever
    elif kind == "unreadable":
        params.write_text("train: {}\n")
        params.chmod(0)
        if os.access(params, os.R_OK):
            pytest.skip("this user reads files whatever their mode (root)")
    extra = [a.format(tmp=tmp_path) for a in PARAMS_COMMANDS[command]]
    done = invoke_bounded(*command.split(), *extra, "--params", params, timeout=60)
    judge(tally, done, names=("params-here.yaml",))


@pytest.fixture
def profile_project(tmp_path, monkeypatch) -> Path:
    """A working directory with params.yaml and profiles/empty-sweep.yaml, whose ``sweep: {}``
    merges into the sweep section (changing nothing there) beside one real change."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "empty-sweep.yaml").write_text("sweep: {}\nevaluate:\n  limit: 8\n")
    params = tmp_path / "params.yaml"
    params.write_text("# the settings\nsweep:\n  epochs: 2\n  num_samples: 3\n")
    return params


def test_profile_apply_writes_exactly_the_merge_it_validated(tally, profile_project):
    from capsnet import config
    from pipeline import profile

    _path, settings, validated = profile.load(profile_project, "empty-sweep")
    assert settings == {"evaluate.limit": 8}
    done = invoke("profile", "empty-sweep", "--params", profile_project, "--apply")
    tally.inputs += 1
    assert done.code == 0, done.stderr
    assert config.load(profile_project) == validated
    assert validated.sweep.epochs == 2 and validated.evaluate.limit == 8
    assert profile_project.read_text().startswith("# the settings\nsweep:\n  epochs: 2\n")


@pytest.mark.parametrize("kind", ["read-only", "symlink"])
def test_profile_apply_refuses_a_params_file_it_would_replace(
    tmp_path, tally, profile_project, kind
):
    params = profile_project
    if kind == "read-only":
        params.chmod(0o444)
    else:
        target = tmp_path / "real-params.yaml"
        params.rename(target)
        params.symlink_to(target)
    before = snapshot(tmp_path)
    done = invoke("profile", "empty-sweep", "--params", params, "--apply")
    judge(tally, done, code=1, before=before, after=snapshot(tmp_path), names=(str(params),))
    assert ("read-only" if kind == "read-only" else "symbolic link") in done.lines[0]
    assert params.is_symlink() == (kind == "symlink")


@pytest.mark.parametrize(
    "name", ["../params", "profiles/../../etc/passwd", "/etc/passwd", "linked"]
)
def test_a_profile_name_never_leads_outside_profiles(tmp_path, tally, profile_project, name):
    (tmp_path / "outside.yaml").write_text("evaluate:\n  limit: 9\n")
    (tmp_path / "profiles" / "linked.yaml").symlink_to(tmp_path / "outside.yaml")
    before = snapshot(tmp_path)
    done = invoke("profile", name, "--params", profile_project, "--apply")
    judge(tally, done, code=2, before=before, after=snapshot(tmp_path))  # a usage error
    assert name in done.lines[0] and "profiles" in done.lines[0], done.lines[0]
