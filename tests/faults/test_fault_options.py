"""Bad option values, generated from every command's own options: numbers that are not
numbers, out of range, non-finite or too large; choices that do not exist; devices torch
knows but this machine cannot run; paths under a regular file. Each fails before any work
as one line naming the option (or the path it was given)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from faulthelpers import invoke, judge

from capsnet import cli
from capsnet.cli.options import FiniteFloat, FloatList

HUGE = str(2**70)
PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def commands():
    """(words naming the command, its click.Command) for every command and subcommand."""
    for name in sorted(cli.COMMANDS):
        command = cli.load_command(name)
        if isinstance(command, click.Group):
            for sub, child in sorted(command.commands.items()):
                yield [name, sub], child
        else:
            yield [name], command


#: The arguments each command needs besides the option under test ({tmp}, {ckpt} filled in).
REQUIRED = {
    "train": ["--model", "lenet5", "--out", "{tmp}/run", "--data-root", "{tmp}/no-data"],
    "eval": ["{ckpt}"],
    "data download": ["mnist"],
    "data prepare": ["mnist"],
    "data show": ["mnist", "--out", "{tmp}/grid.png"],
    "profile": ["{profiles}/paper-scale-gpu.yaml"],  # run outside the repository
}

#: Options whose value is a free string, with values that must be refused before any work.
STRING_BAD = {
    ("train", "--model"): ["no-such-model"],
    ("train", "--device"): ["bogus", "cuda:99", "meta"],
    ("eval", "--device"): ["bogus", "cuda:99", "meta"],
    ("bench", "--device"): ["bogus"],
    ("bench", "--batch-sizes"): ["x", "0", "nan", HUGE],
    ("bench", "--impl"): ["no-such-impl"],
    ("bench", "--model"): ["no-such-model", "lenet5", "em-capsnet"],
}


def _below(low, open_: bool) -> list[str]:
    return [] if low is None else [f"{low:g}" if open_ else f"{low - 1:g}"]


def bad_values(words: list[str], option: click.Option) -> list[str]:
    """Values ``option`` of the command ``words`` must refuse."""
    kind = option.type
    if isinstance(kind, click.IntRange):
        below = [] if kind.min is None else [str(kind.min - 1)]
        above = [] if kind.max is None or kind.max > 2**40 else [str(kind.max + 1)]
        return ["abc", "1.5", "", HUGE, *below, *above]
    if isinstance(kind, FiniteFloat):
        return ["nan", "inf", "-inf", "abc", "1e999", *_below(kind.low, kind.low_open)]
    if isinstance(kind, FloatList):
        return ["nan", "0,inf", "1,,abc", ",", "1e999"]
    if isinstance(kind, click.Choice):
        return ["no-such-choice"]
    if isinstance(kind, click.Path):
        return ["{blocker}/under-a-file"]
    return STRING_BAD.get((" ".join(words), option.opts[0]), [])


CASES = [
    pytest.param(words, option.opts[0], value, id=f"{' '.join(words)} {option.opts[0]}={value}")
    for words, command in commands()
    for option in command.params
    if isinstance(option, click.Option) and not option.is_flag and option.opts[0] != "--help"
    for value in bad_values(words, option)
]


@pytest.mark.parametrize("words, option, value", CASES)
def test_a_bad_option_value_fails_before_work(
    tmp_path, monkeypatch, tally, blocker, lenet_checkpoint, words, option, value
):
    if words[0] in ("sweep", "train-final", "publish"):
        pytest.importorskip("ray")
    monkeypatch.chdir(tmp_path)  # no params.yaml, data/ or outputs of the checkout in reach
    params = tmp_path / "params.yaml"
    params.write_text("{}\n")  # every section at its defaults
    fill = {"tmp": tmp_path, "ckpt": lenet_checkpoint, "blocker": blocker, "profiles": PROFILES}
    required = [a.format(**fill) for a in REQUIRED.get(" ".join(words), [])]
    given = value.format(**fill)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = invoke(*words, *required, option, given)
    judge(tally, done)
    line = done.lines[0]
    if done.code == 2 or (" ".join(words), option) in STRING_BAD:
        assert option in line or given in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_every_float_option_refuses_non_finite_values():
    """No command takes click's plain FLOAT, whose range checks let nan through."""
    options = [(words, o) for words, command in commands() for o in command.params]
    loose = [
        f"{' '.join(words)} {option.opts[0]}"
        for words, option in options
        if isinstance(option.type, (click.types.FloatParamType, click.FloatRange))
    ]
    assert loose == []
    finite = [o for _, o in options if isinstance(o.type, (FiniteFloat, FloatList))]
    assert {o.opts[0] for o in finite} >= {"--lr", "--weight-decay", "--angles", "--epsilons"}
