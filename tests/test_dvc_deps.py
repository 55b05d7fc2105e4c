"""dvc.yaml: each stage's code deps are its command's import closure; its params exist."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest
from repohelpers import tracked_copy

pytest.importorskip("ruamel.yaml")

from capsnet.io.errors import ConfigError
from pipeline.dvc import deps as dvc_deps


@pytest.fixture(scope="module")
def stages(repo_root):
    return dvc_deps.load_stages(repo_root / "dvc.yaml")


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_every_stage_deps_are_its_command_import_closure(repo_root, stages):
    problems = dvc_deps.differences(repo_root, stages)
    assert not problems, (
        "dvc.yaml code deps differ from the import closures "
        "(fix with `python -m pipeline.dvc.deps --write`):\n" + "\n".join(problems)
    )


def test_a_missing_or_extra_dep_is_named_with_its_stage(repo_root, stages):
    evaluate = dict(stages["evaluate"])
    closure = dvc_deps.stage_closures(repo_root, {"evaluate": evaluate})["evaluate"]
    assert "capsnet/nn/losses.py" in closure  # FGSM and BIM use the training losses
    kept = sorted(closure - {"capsnet/nn/losses.py"})
    evaluate["deps"] = [*kept, "pipeline/publish/report.py", "data/prepared/mnist"]
    assert dvc_deps.differences(repo_root, {"evaluate": evaluate}) == [
        "stage evaluate: deps miss capsnet/nn/losses.py (imported)",
        "stage evaluate: deps list pipeline/publish/report.py (not imported)",
    ]


def test_report_code_is_not_a_dep_of_training_stages(repo_root, stages):
    closures = dvc_deps.stage_closures(repo_root, stages)
    for name in ("sweep", "train", "evaluate"):
        assert "pipeline/publish/report.py" not in closures[name], name
        assert "pipeline/publish/stage.py" not in closures[name], name
    assert "pipeline/publish/report.py" in closures["publish"]
    assert "capsnet/cli/__init__.py" in closures["download_mnist"]  # the console script's module


def test_closure_follows_lazy_relative_and_named_imports(tmp_path):
    root = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/cli.py": """\
                import click
                from pkg import sub

                def command():
                    from .lazy import thing
                    return thing
                """,
            "pkg/lazy.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    import pkg.typed
                """,
            "pkg/typed.py": "",
            "pkg/sub/__init__.py": "from ..registry import load\n",
            "pkg/registry.py": 'FAMILIES = ("pkg.family", "pkg.missing")\n',
            "pkg/family.py": "",
            "pkg/unused.py": "import pkg.cli\n",
            "other/__init__.py": "",
        },
    )
    assert dvc_deps.import_closure(root, ["pkg.cli"]) == {
        "pkg/__init__.py",
        "pkg/cli.py",
        "pkg/lazy.py",
        "pkg/typed.py",
        "pkg/sub/__init__.py",
        "pkg/registry.py",
        "pkg/family.py",
    }
    assert dvc_deps.project_packages(root) == {"pkg", "other"}


def test_closure_follows_module_attribute_references_but_not_a_command_table(tmp_path):
    """The dataset registry names its loaders "module:function" (imported on use); a CLI's
    COMMANDS table names commands the stage does not run."""
    root = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/cli.py": 'COMMANDS: dict = {"a": "pkg.other:run"}\nfrom pkg import registry\n',
            "pkg/registry.py": 'LOADERS = ("pkg.loader:load", "pkg.nothing:x y")\n',
            "pkg/loader.py": "",
            "pkg/other.py": "",
        },
    )
    assert dvc_deps.import_closure(root, ["pkg.cli"]) == {
        "pkg/__init__.py",
        "pkg/cli.py",
        "pkg/registry.py",
        "pkg/loader.py",
    }


def test_closure_follows_a_package_s_every_module(tmp_path):
    """``"pkg.sections.*"``: a package whose modules are all imported to find what they
    declare (capsnet.config's sections), including one nothing names."""
    root = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/config.py": 'MODULES = "pkg.sections.*"\n',
            "pkg/sections/__init__.py": "",
            "pkg/sections/a.py": "",
            "pkg/sections/new.py": "from pkg import helper\n",
            "pkg/helper.py": "",
            "pkg/other.py": "",
        },
    )
    assert dvc_deps.import_closure(root, ["pkg.config"]) == {
        "pkg/__init__.py",
        "pkg/config.py",
        "pkg/sections/__init__.py",
        "pkg/sections/a.py",
        "pkg/sections/new.py",
        "pkg/helper.py",
    }


def test_closure_refuses_an_unparsable_module(tmp_path):
    root = write(tmp_path, {"pkg/__init__.py": "", "pkg/bad.py": "def broken(:\n"})
    with pytest.raises(ConfigError, match=r"pkg/bad\.py: cannot parse"):
        dvc_deps.import_closure(root, ["pkg.bad"])


def test_a_directory_dep_is_refused_for_its_files(repo_root, stages):
    """Code deps are files: a folder would rerun its stage for any module added to it."""
    download = dict(stages["download_mnist"])
    download["deps"] = [d for d in download["deps"] if not d.startswith("capsnet/config/")]
    download["deps"].append("capsnet/config")
    assert dvc_deps.differences(repo_root, {"download_mnist": download}) == [
        "stage download_mnist: deps list directory capsnet/config (list its files)"
    ]
    for name, stage in stages.items():
        for entry in stage.get("deps") or []:
            path = dvc_deps.dep_path(entry)
            if path.startswith(("capsnet/", "pipeline/")):
                assert (repo_root / path).is_file(), f"stage {name}: {path} is not a file"


def test_a_group_subcommand_depends_only_on_what_it_runs(tmp_path, repo_root, stages):
    root = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/cli.py": """\
                import click
                from pkg import shared

                @click.group()
                def group():
                    pass

                def _helper():
                    from pkg import helped

                @group.command("fetch")
                def fetch_command():
                    from pkg import fetching
                    _helper()

                @group.command(name="show")
                def show_command():
                    from pkg import showing
                """,
            **{f"pkg/{name}.py": "" for name in ("shared", "helped", "fetching", "showing")},
        },
    )
    assert dvc_deps.import_closure(root, ["pkg.cli"], {"pkg.cli": "fetch"}) == {
        "pkg/__init__.py",
        "pkg/cli.py",
        "pkg/shared.py",
        "pkg/helped.py",
        "pkg/fetching.py",
    }
    assert "pkg/showing.py" in dvc_deps.import_closure(root, ["pkg.cli"], {"pkg.cli": "show"})
    assert "pkg/showing.py" in dvc_deps.import_closure(root, ["pkg.cli"])  # the whole module
    closures = dvc_deps.stage_closures(repo_root, stages)
    for name in ("download_mnist", "prepare_mnist", "build_multimnist"):
        assert "capsnet/data/show.py" not in closures[name], name


def test_rewrite_keeps_data_deps_and_comments(repo_root):
    text = (repo_root / "dvc.yaml").read_text()
    head, _, rest = text.partition("  publish:\n")
    stage, _, tail = rest.partition("    outs:\n")
    broken = (
        head
        + "  publish:\n"
        + stage.partition("    deps:\n")[0]
        + "    deps:\n      - eval/metrics.json  # the evaluate stage's\n"
        + "      - capsnet/routing.py\n"
        + "    outs:\n"
        + tail
    )
    fixed = dvc_deps.rewrite(repo_root, broken)
    assert "      - eval/metrics.json  # the evaluate stage's\n      - capsnet/" in fixed
    assert dvc_deps.rewrite(repo_root, fixed) == fixed
    fixed_stages = dvc_deps._yaml().load(fixed)["stages"]
    assert dvc_deps.differences(repo_root, {"publish": fixed_stages["publish"]}) == []


def test_a_stage_must_run_a_project_command(repo_root):
    """As ``python -m capsnet``: the installed ``capsnet`` script would import the package
    from where it was installed, not from the repository (experiment) DVC runs it in."""
    refused = "stage odd: cmd must run a project command as `python -m capsnet COMMAND ...`"
    for cmd in (
        "python train.py",
        "capsnet publish",
        "python -m pipeline.publish.stage",
        "python -m",
    ):
        with pytest.raises(ConfigError, match=re.escape(refused)):
            dvc_deps.stage_closures(repo_root, {"odd": {"cmd": cmd}})
    with pytest.raises(ConfigError, match="COMMANDS has no command 'nonesuch'"):
        dvc_deps.stage_closures(repo_root, {"odd": {"cmd": "python3 -m capsnet nonesuch"}})
    closure = dvc_deps.stage_closures(repo_root, {"ok": {"cmd": "python3.11 -m capsnet models"}})
    assert {
        "capsnet/__main__.py",
        "capsnet/cli/__init__.py",
        "capsnet/cli/train_commands.py",
    } <= closure["ok"]


def test_the_command_targets_are_read_from_the_cli_declaration(repo_root):
    """dvc_deps reads each command's declaration without importing it: the same targets."""
    from capsnet import cli

    for name, target in cli.COMMANDS.items():
        assert dvc_deps.command_target(repo_root, "capsnet.cli", name) == target


def test_stage_params_exist_in_params_yaml(repo_root, stages):
    import yaml

    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    for name, stage in stages.items():
        for entry in stage.get("params") or []:
            assert isinstance(entry, str), f"stage {name}: params from another file: {entry}"
            assert entry != "data.mirror", f"stage {name}: the mirror is not a param"
            node = params
            for part in entry.split("."):
                assert isinstance(node, dict) and part in node, (
                    f"stage {name}: param {entry} is not in params.yaml"
                )
                node = node[part]


def test_a_stage_reading_a_key_it_does_not_list_is_named(tmp_path, repo_root):
    """Reads are traced per stage ($CAPSNET_PARAMS_TRACE, $DVC_STAGE); a key the stage's
    params neither list nor hold in a listed section is named. A key params.yaml does not
    set reads its dataclass default (code), and data.mirror cannot change an output."""
    import os
    import subprocess
    import sys

    import yaml

    trace = tmp_path / "reads.tsv"
    script = (
        "from capsnet import config\n"
        f"p = config.load({str(repo_root / 'params.yaml')!r})\n"
        "p.train.seeds, p.augment.shift.pixels, p.evaluate.limit, p.sweep.dataset, p.data.mirror\n"
    )
    env = {**os.environ, "CAPSNET_PARAMS_TRACE": str(trace), "DVC_STAGE": "train"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    lines = sorted(trace.read_text().splitlines())
    imported = [line for line in lines if "\timport:" in line]
    assert "train\timport:capsnet/config/schema.py" in imported  # the files it imported
    assert not any(".venv" in line or "torch/" in line for line in imported)
    lines = [line for line in lines if line not in imported]
    assert lines == [
        "train\taugment.shift.pixels",
        "train\tdata.mirror",
        "train\tevaluate.limit",
        "train\tsweep.dataset",
        "train\ttrain.seeds",
    ]
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["sweep"].pop("dataset", None)
    stages = {"train": {"params": ["train", "augment.shift"]}, "evaluate": {"params": []}}
    assert dvc_deps.unlisted_reads(trace.read_text(), stages, params) == [
        "stage train: reads params key evaluate.limit, which its params omit"
    ]
    stages["train"]["params"].append("evaluate.limit")
    assert dvc_deps.unlisted_reads(trace.read_text(), stages, params) == []
    # every project file it imported must be a dep
    stages["train"]["deps"] = [line.split(":", 1)[1] for line in imported]
    assert dvc_deps.unlisted_imports(trace.read_text(), stages) == []
    stages["train"]["deps"].remove("capsnet/config/schema.py")
    assert dvc_deps.unlisted_imports(trace.read_text(), stages) == [
        "stage train: imported capsnet/config/schema.py, which its deps omit"
    ]


#: The training sections and the stage that reads each.
TRAINING_SECTIONS = {
    "sweep": "sweep",
    "train": "train",
    "smallnorb_sweep": "sweep_smallnorb",
    "smallnorb_train": "train_smallnorb",
    "viewpoints": "viewpoints",
}


def test_every_training_section_shows_its_precision_and_compile(repo_root, stages):
    """params.yaml sets amp and compile in every training section, amp at the value in
    force (TrainConfig's), so `dvc params diff` shows a change; each stage lists them."""
    import yaml

    from capsnet import config
    from capsnet.config.training import TrainConfig

    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    params = config.load(repo_root / "params.yaml")
    trace = ""
    for section, stage in TRAINING_SECTIONS.items():
        assert {"amp", "compile"} <= set(raw[section]), f"params.yaml {section}"
        assert getattr(params, section).amp == TrainConfig.amp
        trace += f"{stage}\t{section}.amp\n{stage}\t{section}.compile\n"
    assert dvc_deps.unlisted_reads(trace, stages, raw) == []


#: The stages that can load smallNORB (and so its stand-in renderer), and those that cannot.
SMALLNORB_STAGES = {
    "download_smallnorb", "prepare_smallnorb", "sweep_smallnorb", "train_smallnorb",
    "viewpoints", "evaluate",
}  # fmt: skip
MULTIMNIST_STAGES = {"build_multimnist", "train", "evaluate"}


def test_a_dataset_module_is_a_dep_only_of_the_stages_that_reach_its_dataset(repo_root, stages):
    closures = dvc_deps.stage_closures(repo_root, stages)
    holding = {n for n, c in closures.items() if "capsnet/data/smallnorb_synth.py" in c}
    assert holding == SMALLNORB_STAGES
    holding = {n for n, c in closures.items() if "capsnet/data/multimnist.py" in c}
    assert holding == MULTIMNIST_STAGES
    assert "capsnet/data/mnist.py" not in closures["download_smallnorb"]
    assert "capsnet/data/rotated.py" not in closures["sweep"]  # rotated in memory
    shared = "capsnet/data/registry.py"  # every dataset's declaration: every stage's dep
    assert all(shared in c for c in closures.values())


def test_a_stage_reaches_the_datasets_its_command_and_params_name(repo_root):
    from capsnet import config
    from pipeline.dvc import reach

    declared = reach.declarations(repo_root, dvc_deps.project_packages(repo_root))
    assert {"mnist", "smallnorb", "multimnist"} <= set(declared)
    assert declared["smallnorb"].section == "smallnorb"
    assert "smallnorb-azimuth-novel" in declared["smallnorb"].sets
    params = config.Params()  # the defaults: a key params.yaml leaves out still names one
    assert reach.stage_datasets(["data", "download", "mnist"], [], params, declared) == {"mnist"}
    assert reach.stage_datasets(["sweep"], ["sweep"], params, declared) == {"mnist"}
    assert reach.stage_datasets([], ["data.smallnorb.crop"], params, declared) == {"smallnorb"}
    assert reach.stage_datasets([], ["data.smallnorb.enabled"], params, declared) == set()
    # an evaluation set names its dataset
    evaluation = config.EvaluateParams(datasets=("smallnorb-azimuth-novel",))
    assert reach.named([evaluation], declared) == {"smallnorb"}


def _stale_for(work: Path, edited: str) -> set[str]:
    """The stages `dvc status` finds stale because ``edited`` changed (a comment appended)."""
    import json
    import shutil
    import subprocess
    import sys

    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or "dvc"
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}

    def marked() -> set[str]:
        done = subprocess.run(
            [dvc, "status", "--json"], cwd=work, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return {
            stage
            for stage, changes in json.loads(done.stdout or "{}").items()
            for change in changes
            if isinstance(change, dict) and change.get("changed deps", {}).get(edited) == "modified"
        }

    assert marked() == set()  # dvc.lock holds the file as it is
    path = work / edited
    original = path.read_text()
    path.write_text(original + "\n# an edit\n")
    try:
        return marked()
    finally:
        path.write_text(original)


def test_dvc_status_after_a_dataset_module_edit_names_only_the_stages_reaching_it(
    repo_root, tmp_path
):
    pytest.importorskip("dvc")
    work = tracked_copy(repo_root, tmp_path / "repo")
    assert _stale_for(work, "capsnet/data/smallnorb_synth.py") == SMALLNORB_STAGES
    assert _stale_for(work, "capsnet/data/multimnist.py") == MULTIMNIST_STAGES
