"""The `capsnet` command: happy paths in-process; error paths as a user sees them (one real
subprocess per kind of exit, the other cases in-process through the same error boundary)."""

import json
import sys

import click
import pytest
import torch
from click.testing import CliRunner
from clihelpers import assert_one_line_error, invoke_cli, run_cli

from capsnet import cli, models
from capsnet.models import checkpoint


def test_models_lists_names_with_parameter_counts():
    result = run_cli("models")
    assert result.returncode == 0
    assert "capsnet " in result.stdout and "8,215,568" in result.stdout
    assert "lenet5" in result.stdout


@pytest.mark.slow
def test_train_then_eval_reproduces_test_accuracy(tmp_path, mnist_root):
    """Training in-process, the evaluation through the real entry point."""
    out = tmp_path / "run"
    result = invoke_cli(
        "train",
        "--model",
        "lenet5",
        "--train-limit",
        "1500",
        "--batch-size",
        "64",
        "--epochs",
        "2",
        "--lr",
        "0.003",
        "--val-size",
        "500",
        "--test-limit",
        "1000",
        "--compile",  # reaches TrainConfig; lenet5 has no EM routing, so trains as is
        "--data-root",
        str(mnist_root),
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mnist"]["n"] == 1000
    assert checkpoint.load(out / "model.pt")[1]["train_config"]["compile"] is True
    assert metrics["mnist"]["accuracy"] > 0.5
    results_file = tmp_path / "eval.json"
    result = run_cli(
        "eval",
        str(out / "model.pt"),
        "--limit",
        "1000",
        "--angles",
        "0,45",
        "--data-root",
        str(mnist_root),
        "--out",
        str(results_file),
    )
    assert result.returncode == 0, result.stderr
    results = json.loads(results_file.read_text())
    entry = results["run"]
    assert entry["model"] == "lenet5"
    assert entry["mnist"] == metrics["mnist"]
    assert entry["rotated-mnist"]["accuracy"]["0"] == metrics["mnist"]["accuracy"]
    assert set(entry["rotated-mnist"]["accuracy"]) == {"0", "45"}
    assert "lenet5" in result.stdout


def test_eval_json_schema_for_two_checkpoints(tmp_path, mnist_root):
    from click.testing import CliRunner

    from capsnet.cli import main

    torch.manual_seed(0)
    paths = []
    for name in ("lenet5", "capsnet-small"):
        paths.append(str(checkpoint.save(tmp_path / f"{name}.pt", models.build(name))))
    out = tmp_path / "e.json"
    result = CliRunner().invoke(
        main,
        [
            "eval",
            *paths,
            "--limit",
            "50",
            "--angles",
            "0,90",
            "--data-root",
            str(mnist_root),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data) == {"lenet5", "capsnet-small"}
    for entry in data.values():
        assert set(entry) == {"model", "checkpoint", "mnist", "rotated-mnist"}
        assert entry["mnist"]["n"] == 50
        assert set(entry["rotated-mnist"]["accuracy"]) == {"0", "90"}
        assert entry["rotated-mnist"]["accuracy"]["0"] == entry["mnist"]["accuracy"]


def test_unknown_model(tmp_path):
    result = run_cli("train", "--model", "capsnett", "--out", str(tmp_path / "o"))
    assert_one_line_error(result, "unknown model 'capsnett'")
    assert not (tmp_path / "o").exists()


def test_an_unknown_model_or_profile_is_a_usage_error(tmp_path):
    cases = [
        (["train", "--model", "capsnett", "--out", str(tmp_path / "o")], "'--model'",
         "unknown model 'capsnett'; choose one of: "),
        (["profile", "nope"], "'NAME'", "profile 'nope' unknown; choose one of "),
    ]  # fmt: skip
    for args, option, fragment in cases:
        done = CliRunner().invoke(cli.main, args)
        assert done.exit_code == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and option in lines[0] and fragment in lines[0], lines
    assert not (tmp_path / "o").exists()


def test_missing_checkpoint(tmp_path):
    assert_one_line_error(
        run_cli("eval", str(tmp_path / "none.pt")), "none.pt", "checkpoint not found"
    )


def test_truncated_checkpoint(tmp_path):
    path = checkpoint.save(tmp_path / "t.pt", models.build("lenet5"))
    path.write_bytes(path.read_bytes()[:100])
    assert_one_line_error(invoke_cli("eval", str(path)), "t.pt", "truncated")


def test_foreign_file_as_checkpoint(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("hello")
    assert_one_line_error(invoke_cli("eval", str(path)), "notes.pt")


def test_bad_angles(tmp_path):
    path = checkpoint.save(tmp_path / "m.pt", models.build("lenet5"))
    assert_one_line_error(invoke_cli("eval", str(path), "--angles", "10,abc"), "--angles")


def test_bad_option_values(tmp_path):
    assert_one_line_error(
        invoke_cli("train", "--model", "lenet5", "--epochs", "0", "--out", str(tmp_path)),
        "--epochs",
    )
    assert_one_line_error(invoke_cli("eval"), "CHECKPOINT")


def test_out_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    assert_one_line_error(invoke_cli("train", "--model", "lenet5", "--out", str(target)), "--out")


def test_routing_iterations_for_a_model_without_routing(tmp_path):
    assert_one_line_error(
        invoke_cli(
            "train", "--model", "lenet5", "--routing-iterations", "3", "--out", str(tmp_path / "o")
        ),
        "--routing-iterations",
    )


def test_unavailable_device(tmp_path, mnist_root):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = invoke_cli(
        "train",
        "--model",
        "lenet5",
        "--device",
        "cuda",
        "--data-root",
        str(mnist_root),
        "--out",
        str(tmp_path / "o"),
    )
    assert_one_line_error(result, "CUDA is not available")


#: Every HTTP(S) request goes to a closed local port, so the official hosts fail here
#: whether or not this machine can reach them.
UNREACHABLE_HOSTS = {
    name: "http://127.0.0.1:9"
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
} | {"no_proxy": "", "NO_PROXY": ""}


def test_no_source_for_mnist_names_the_urls_and_the_mirror_setting(tmp_path, monkeypatch):
    waits = []
    monkeypatch.setattr("capsnet.data.sources.time.sleep", waits.append)  # the retry backoff
    result = invoke_cli(
        "train",
        "--model",
        "lenet5",
        "--data-root",
        str(tmp_path / "empty"),
        "--mirror",
        str(tmp_path / "no-mirror"),
        "--out",
        str(tmp_path / "o"),
        env_extra={"CAPSNET_MIRROR": "", **UNREACHABLE_HOSTS},
    )
    assert_one_line_error(result, "no source worked", "no-mirror", "CAPSNET_MIRROR")
    assert waits  # the official hosts were tried, with retries


def test_bench_bad_option_is_one_line():
    assert_one_line_error(invoke_cli("bench", "--batch-sizes", "x"), "--batch-sizes")


@click.command("needs-ray")
def _needs_ray() -> None:
    """A command whose optional library is missing when it runs."""
    raise ModuleNotFoundError("No module named 'ray'", name="ray")


@click.command("interrupted")
@click.option("--how", type=click.Choice(["keyboard", "abort", "bug"]))
def _interrupted(how) -> None:
    """A command stopped by Ctrl+C (click turns it into Abort), or by a bug."""
    if how == "bug":
        raise ModuleNotFoundError("No module named 'nonexistent'", name="nonexistent")
    raise KeyboardInterrupt if how == "keyboard" else click.Abort


@pytest.fixture
def fake_commands(monkeypatch):
    """The group with two extra commands defined in this module."""
    for name, attribute in (("needs-ray", "_needs_ray"), ("interrupted", "_interrupted")):
        monkeypatch.setitem(cli.COMMANDS, name, f"{__name__}:{attribute}")
        monkeypatch.setitem(cli.SHORT_HELP, name, name)
    return CliRunner()


@pytest.mark.parametrize("how", ["keyboard", "abort"])
def test_ctrl_c_is_interrupted_and_exit_130(fake_commands, how):
    done = fake_commands.invoke(cli.main, ["interrupted", "--how", how])
    assert done.exit_code == 130
    assert done.stderr.strip().splitlines() == ["Interrupted."]


def test_a_missing_optional_library_is_one_line_naming_the_extra(fake_commands):
    done = fake_commands.invoke(cli.main, ["needs-ray"])
    assert done.exit_code == 1
    assert done.stderr.strip().splitlines() == [
        "Error: capsnet needs-ray needs ray: pip install 'capsnet-pipeline[pipeline]'"
    ]


def test_a_missing_module_that_is_no_extra_is_a_bug_with_its_traceback(fake_commands):
    done = fake_commands.invoke(cli.main, ["interrupted", "--how", "bug"])
    assert isinstance(done.exception, ModuleNotFoundError)


@pytest.mark.parametrize("args", [["sweep", "--help"], ["publish"]])
def test_pipeline_commands_without_pipeline_are_one_line(monkeypatch, args):
    for name in ("pipeline", "pipeline.sweep.cli", "pipeline.publish.stage"):  # their imports fail
        monkeypatch.setitem(sys.modules, name, None)
    done = CliRunner().invoke(cli.main, args)
    assert done.exit_code == 1
    assert done.stderr.strip().splitlines() == [
        f"Error: capsnet {args[0]} needs pipeline/: install capsnet-pipeline[pipeline] from a "
        "source checkout (pip install -e '.[pipeline]')"
    ]


def test_usage_errors_exit_2_and_unknown_commands_are_named():
    done = CliRunner().invoke(cli.main, ["trian"])
    assert done.exit_code == 2
    assert done.stderr.strip().splitlines() == ["Error: No such command 'trian'."]


@pytest.mark.parametrize(
    "args, option",
    [
        (["train", "--model", "lenet5", "--out", "o", "--lr", "nan"], "'--lr'"),
        (["train", "--model", "lenet5", "--out", "o", "--weight-decay", "inf"], "'--weight-decay'"),
        (["train", "--model", "lenet5", "--out", "o", "--lr", "0"], "'--lr': 0 is not > 0"),
        (["eval", "m.pt", "--angles", "0,inf"], "'--angles': 'inf' is not a finite number"),
        (["eval", "m.pt", "--angles", ",,"], "'--angles': no numbers given"),
        (["eval", "m.pt", "--epsilons", "0.1,nan"], "'--epsilons': 'nan' is not a finite"),
        (["eval", "m.pt", "--epsilons", "1.5"], "'--epsilons': 1.5 is not <= 1"),
        (["data", "show", "rotated-mnist", "--out", "x.png", "--angle", "-inf"], "'--angle'"),
    ],
)
def test_non_finite_and_out_of_range_floats_are_usage_errors(args, option):
    done = CliRunner().invoke(cli.main, args)
    assert done.exit_code == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0], done.stderr


def _resolved(name: str, args: list[str]) -> dict:
    """The values a command receives for ``args``: its options' defaults resolved."""
    command = cli.load_command(name)
    with command.make_context(name, args) as ctx:
        return ctx.params


def test_train_defaults_are_train_configs():
    from capsnet.training.fit import TrainConfig

    params = _resolved("train", ["--model", "lenet5", "--out", "o"])
    for option, field in [
        ("epochs", "epochs"),
        ("batch_size", "batch_size"),
        ("lr", "lr"),
        ("weight_decay", "weight_decay"),
        ("loss", "loss"),
        ("seed", "seed"),
        ("device", "device"),
    ]:
        assert params[option] == getattr(TrainConfig(), field), option


def test_eval_defaults_are_the_evaluate_sections():
    """Unset limits stay None on the command line: eval_command fills them from the
    evaluate section of --params (tests/test_eval_stage.py runs that); the device default
    is the dataclass's."""
    from capsnet.config import EvaluateParams

    params = _resolved("eval", ["m.pt"])
    for name in ("epsilons", "bim_steps", "robustness_limit", "batch_size", "limit", "angles"):
        assert params[name] in (None, ()), name
    assert params["device"] == EvaluateParams().device
    assert _resolved("eval", ["m.pt", "--angles", "0, 45"])["angles"] == (0.0, 45.0)


def test_data_root_and_mirror_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("CAPSNET_DATA", "/elsewhere")
    monkeypatch.setenv("CAPSNET_MIRROR", "/a/mirror")
    for name, args in [("train", ["--model", "lenet5", "--out", "o"]), ("eval", ["m.pt"])]:
        params = _resolved(name, args)
        assert (str(params["data_root"]), params["mirror"]) == ("/elsewhere", "/a/mirror")
    monkeypatch.delenv("CAPSNET_DATA")
    monkeypatch.setenv("CAPSNET_MIRROR", "")
    params = _resolved("eval", ["m.pt"])
    assert (str(params["data_root"]), params["mirror"]) == ("data", None)


@click.command("raises")
@click.option("--what", required=True)
@click.option("--out", default=None)
def _raises(what, out) -> None:
    """A command that fails the way the file system, a file or the machine can."""
    import errno
    import os

    target = os.path.join(out or "x", "model.pt")
    errors = {
        "enospc": OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
        "enotdir": NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), target),
        "eacces": PermissionError(errno.EACCES, os.strerror(errno.EACCES), target),
        "erofs": OSError(errno.EROFS, os.strerror(errno.EROFS), target),
        "eisdir": IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), target),
        "toolong": OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), "a" * 300),
        "unicode": UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        "overflow": OverflowError("Python int too large to convert to C long"),
        "memory": MemoryError(),
        "device": RuntimeError("CUDA error: no kernel image is available for execution"),
        "bug": RuntimeError("Expected all tensors to be on the same device"),
        "keyerror": KeyError("model"),
    }
    raise errors[what]


@pytest.fixture
def raising(monkeypatch):
    monkeypatch.setitem(cli.COMMANDS, "raises", f"{__name__}:_raises")
    monkeypatch.setitem(cli.SHORT_HELP, "raises", "raises")
    monkeypatch.delenv("CAPSNET_DEBUG", raising=False)
    return CliRunner()


@pytest.mark.parametrize(
    "what, fragments",
    [
        ("enospc", ["no space left on device (disk full) while writing (--out /o)", "free space"]),
        ("enotdir", ["/o/model.pt: a part of this path is a file", "(--out)", "not under a file"]),
        ("eacces", ["/o/model.pt: permission denied (--out)"]),
        ("erofs", ["/o/model.pt: read-only file system (--out)"]),
        ("eisdir", ["/o/model.pt: is a directory (--out)"]),
        ("toolong", ["file name too long", "..."]),
        ("unicode", ["not UTF-8 text", "invalid start byte at byte 0"]),
        ("overflow", ["a number is too large"]),
        ("memory", ["out of memory", "--batch-size"]),
        ("device", ["the device cannot run this: CUDA error", "--device"]),
    ],
)
def test_errors_of_the_machine_are_one_line_exit_1(raising, what, fragments):
    done = raising.invoke(cli.main, ["raises", "--what", what, "--out", "/o"])
    assert done.exit_code == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("what", ["bug", "keyerror"])
def test_programming_errors_keep_their_traceback(raising, what):
    done = raising.invoke(cli.main, ["raises", "--what", what])
    assert isinstance(done.exception, (RuntimeError, KeyError))


@pytest.mark.parametrize("how", [["--debug"], "env"])
def test_debug_shows_the_traceback_before_the_line(raising, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("CAPSNET_DEBUG", "1")
    args = (how if isinstance(how, list) else []) + ["raises", "--what", "enospc"]
    done = raising.invoke(cli.main, args)
    assert done.exit_code == 1
    assert "Traceback" in done.stderr and "OSError" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("Error: no space left")


def test_huge_integers_are_usage_errors_before_torch_sees_them():
    for args in (
        ["train", "--model", "lenet5", "--out", "o", "--seed", str(2**70)],
        ["train", "--model", "lenet5", "--out", "o", "--batch-size", str(2**70)],
        ["eval", "m.pt", "--limit", str(10**30)],
    ):
        done = CliRunner().invoke(cli.main, args)
        assert done.exit_code == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_outputs_are_checked_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cases = [
        (["train", "--model", "lenet5", "--out", str(blocker / "run")], "'--out'"),
        (["eval", "m.pt", "--out", str(blocker / "e.json")], "'--out'"),
        (["eval", "m.pt", "--out", str(tmp_path)], "is a directory"),
        (["eval", "m.pt", "--figures", str(blocker)], "is a file"),
        (["data", "prepare", "mnist", "--data-root", str(blocker / "d")], "'--data-root'"),
        (["data", "download", "mnist", "--data-root", str(blocker / "d")], "'--data-root'"),
        (["data", "show", "mnist", "--out", str(blocker / "x.png")], "'--out'"),
        (["train", "--model", "lenet5", "--out", str(tmp_path / ("n" * 300))], "longer than"),
    ]
    for args, fragment in cases:
        done = CliRunner().invoke(cli.main, args)
        assert done.exit_code == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0], lines
        assert str(blocker) in lines[0] or "longer than" in lines[0] or str(tmp_path) in lines[0]


def test_output_under_a_params_key_names_the_key(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    params = tmp_path / "p.yaml"
    params.write_text(f"evaluate:\n  out_dir: {blocker / 'eval'}\n")
    done = CliRunner().invoke(cli.main, ["evaluate-stage", "--params", str(params)])
    assert done.exit_code == 1
    assert done.stderr.strip().splitlines() == [
        f"Error: p.yaml: evaluate.out_dir: {blocker / 'eval'}: {blocker} is a file, not a "
        "directory; choose a path that is not under a file"
    ]


def test_unwritable_and_read_only_places_are_named(tmp_path, monkeypatch):
    import os
    import types

    from capsnet.cli.options import output_problem

    assert output_problem(tmp_path / "o") is None
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert (
        output_problem(tmp_path / "o") == f"{tmp_path} is not writable; choose a path you may write"
    )
    monkeypatch.setattr(os, "statvfs", lambda path: types.SimpleNamespace(f_flag=os.ST_RDONLY))
    assert output_problem(tmp_path / "o") == (
        f"{tmp_path} is on a read-only file system; write elsewhere"
    )


def test_a_device_torch_knows_but_cannot_run_is_refused():
    from capsnet.io.errors import ConfigError
    from capsnet.training.device import select_device

    for name in ("meta", "cuda:99" if not torch.cuda.is_available() else "cuda:999"):
        with pytest.raises(ConfigError, match=f"--device {name}"):
            select_device(name)
    assert select_device("cpu") == torch.device("cpu")


def test_train_loss_choices_are_the_config_s_losses():
    """One home for the loss names: capsnet.config's Loss, which params.yaml is checked against."""
    from capsnet import config

    command = cli.load_command("train")
    loss = next(p for p in command.params if p.name == "loss")
    assert tuple(loss.type.choices) == config.LOSSES
