"""The one params validator: non-finite floats, duplicate keys, encodings, sweep dimensions,
and every section of the real params.yaml (values and defaults)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from capsnet import config
from capsnet.io.errors import ConfigError

SECTIONS = [f.name for f in dataclasses.fields(config.Params)]


def load_text(tmp_path, text: str):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return config.load(path)


def error_of(tmp_path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "data:\n  affnist:\n    synth:\n      shear: .nan\n",
            "params.yaml: data.affnist.synth.shear: must be a finite number, got nan",
        ),
        (
            "sweep:\n  rotation_angle: .inf\n",
            "params.yaml: sweep.rotation_angle: must be a finite number, got inf",
        ),
        (
            "viewpoints:\n  tolerance: -.inf\n",
            "params.yaml: viewpoints.tolerance: must be a finite number, got -inf",
        ),
        (
            "evaluate:\n  angles: [0, .nan, 35]\n",
            "params.yaml: evaluate.angles[1]: must be a finite number, got nan",
        ),
        (
            "augment:\n  affine:\n    scale: [0.9, .inf]\n",
            "params.yaml: augment.affine.scale[1]: must be a finite number, got inf",
        ),
        (
            "evaluate:\n  robustness:\n    epsilons: [0.1, .nan]\n",
            "params.yaml: evaluate.robustness.epsilons[1]: must be a finite number, got nan",
        ),
        (
            "sweep:\n  space:\n    m_plus: .nan\n",
            "params.yaml: sweep.space.m_plus: must be a finite number, got nan",
        ),
        (
            "sweep:\n  space:\n    lr: {grid: [0.001, .nan]}\n",
            "params.yaml: sweep.space.lr.grid[1]: must be a finite number, got nan",
        ),
        (
            "smallnorb_sweep:\n  space:\n    weight_decay: {uniform: [0, .inf]}\n",
            "params.yaml: smallnorb_sweep.space.weight_decay.uniform[1]: must be a finite number",
        ),
        (
            "viewpoints:\n  overrides: {capsules: {dropout: .nan}}\n",
            "params.yaml: viewpoints.overrides.capsules.dropout: must be a finite number, got nan",
        ),
        (
            "viewpoints:\n  overrides: {cnn: {sizes: [1, -.inf]}}\n",
            "params.yaml: viewpoints.overrides.cnn.sizes[1]: must be a finite number, got -inf",
        ),
    ],
)
def test_non_finite_floats_are_refused_with_their_key(tmp_path, text, message):
    assert error_of(tmp_path, text).startswith(message)


def test_non_finite_floats_from_python_are_refused():
    with pytest.raises(ConfigError, match=r"^params: sweep\.space\.lr: must be a finite number"):
        config.SweepConfig.from_dict({"space": {"lr": math.inf}})
    with pytest.raises(ConfigError, match=r"^params: train\.seed: expected an integer, got nan"):
        config.FinalTrainConfig.from_dict({"seed": math.nan})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "sweep:\n  epochs: 2\n  batch_size: 64\n  epochs: 3\n",
            "params.yaml: sweep.epochs: duplicate key on line 4 (first on line 2)",
        ),
        (
            "train:\n  epochs: 1\naugment: {}\ntrain:\n  epochs: 2\n",
            "params.yaml: train: duplicate key on line 4 (first on line 1)",
        ),
        (
            "sweep:\n  space:\n    lr: {grid: [0.1], grid: [0.2]}\n",
            "params.yaml: sweep.space.lr.grid: duplicate key on line 3 (first on line 3)",
        ),
        (
            "viewpoints:\n  overrides: {capsules: {a: 1}, cnn: {}}\n"
            "  weight_decay:\n    cnn: 0.0\n    cnn: 0.1\n",
            "params.yaml: viewpoints.weight_decay.cnn: duplicate key on line 5 (first on line 4)",
        ),
    ],
)
def test_duplicate_keys_are_refused_with_key_and_line(tmp_path, text, message):
    assert error_of(tmp_path, text) == message


def test_the_same_key_in_different_mappings_is_fine(tmp_path):
    params = load_text(tmp_path, "sweep:\n  epochs: 3\ntrain:\n  epochs: 2\n")
    assert (params.sweep.epochs, params.train.epochs) == (3, 2)


def test_non_utf8_file_is_one_line_error(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_bytes(b"sweep:\n  name: caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert str(info.value) == "params.yaml: line 2: not UTF-8 text (byte 18)"


def test_empty_file_gives_the_defaults(tmp_path):
    assert load_text(tmp_path, "") == config.Params()
    assert load_text(tmp_path, "# only a comment\n") == config.Params()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"space": {"routing_iterations": {"uniform": [1, 3]}}},
            r"^params: sweep\.space\.routing_iterations: uniform draws fractions; use randint",
        ),
        (
            {"space": {"lr": {"randint": [1.5, 3]}}},
            r"^params: sweep\.space\.lr\.randint\[0\]: expected an integer, got 1\.5",
        ),
        (
            {"space": {"lr": {"uniform": [0.1]}}},
            r"^params: sweep\.space\.lr\.uniform: must be \[low, high\], got \[0\.1\]",
        ),
        (
            {"space": {"lr": {"loguniform": [0, 1]}}},
            r"^params: sweep\.space\.lr\.loguniform: bounds must be > 0, got 0\.0",
        ),
        (
            {"space": {"lr": {"uniform": [-0.1, 0.1]}}},
            r"^params: sweep\.space\.lr: -0\.1 must be > 0",
        ),
        (
            {"space": {"lr": {"grid": 0.1}}},
            r"^params: sweep\.space\.lr\.grid: must be a non-empty list, got 0\.1",
        ),
        (
            {"space": {"lr": {"grid": [0.1], "choice": [0.2]}}},
            r"^params: sweep\.space\.lr: expected a value or one of \{grid, choice, uniform",
        ),
        (
            {"space": {"routing_iterations": {"randint": [0, 3]}}},
            r"^params: sweep\.space\.routing_iterations: 0 must be >= 1",
        ),
        ({"space": {"model": ""}}, r"^params: sweep\.space\.model: needs a name"),
    ],
)
def test_searched_dimensions_are_checked_by_kind_type_and_bounds(values, message):
    with pytest.raises(ConfigError, match=message):
        config.SweepConfig.from_dict(values)


def test_searched_dimensions_keep_their_form():
    space = config.SweepConfig.from_dict(
        {
            "space": {
                "lr": {"loguniform": [1e-4, 1e-2]},
                "m_plus": {"uniform": [0.8, 1]},
                "routing_iterations": {"randint": [1, 5]},
                "augment": {"choice": ["none", "shift"]},
                "loss": {"grid": ["margin", "spread"]},
            }
        }
    ).space
    assert space.lr == {"loguniform": [1e-4, 1e-2]}
    assert space.m_plus == {"uniform": [0.8, 1.0]}
    assert space.routing_iterations == {"randint": [1, 5]}
    assert space.searched() == ["routing_iterations", "m_plus", "augment", "lr", "loss"]


def test_python_built_sections_name_their_own_section():
    with pytest.raises(ConfigError, match=r"^params: smallnorb_sweep\.space\.loss: 'hinge'"):
        config.SmallnorbSweepConfig.from_dict({"space": {"loss": "hinge"}})
    with pytest.raises(ConfigError, match=r"^params: smallnorb_train\.epochz: unknown key"):
        config.SmallnorbTrainConfig.from_dict({"epochz": 1})
    with pytest.raises(ConfigError, match=r"^params: smallnorb_sweep\.asha\.grace_period: must"):
        config.SmallnorbSweepConfig.from_dict({"asha": {"grace_period": 0}})


def test_range_errors_of_direct_construction_are_config_errors():
    with pytest.raises(ConfigError, match=r"^epochs: must be >= 1, got 0$"):
        config.SweepConfig(epochs=0)
    with pytest.raises(ConfigError, match=r"^bim_steps: must be >= 2"):
        config.RobustnessParams(bim_steps=1)


def test_every_section_of_the_repository_params_loads(repo_root):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    assert set(raw) == set(SECTIONS)
    params = config.load(repo_root / "params.yaml")
    for name in SECTIONS:
        section = getattr(params, name)
        cls = type(getattr(config.Params(), name))
        assert type(section) is cls
        assert section == config.from_dict(cls, raw[name], prefix=name, source="params.yaml")
        assert config.from_dict(cls, config.to_dict(section)) == section


@pytest.mark.parametrize("missing", SECTIONS)
def test_a_missing_section_takes_its_dataclass_defaults(tmp_path, repo_root, missing):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    del raw[missing]
    params = load_text(tmp_path, yaml.safe_dump(raw))
    default = getattr(config.Params(), missing)
    assert getattr(params, missing) == default == type(default)()
    assert config.from_dict(type(default), {}) == default


def test_evaluation_defaults_equal_the_pipeline_values(repo_root):
    """The attack and angle defaults are the pipeline's, so every entry point agrees."""
    params = config.load(repo_root / "params.yaml").evaluate
    default = config.EvaluateParams()
    assert default.angles == params.angles
    assert default.robustness.epsilons == params.robustness.epsilons == (0.05, 0.1, 0.2)
    assert default.robustness.bim_steps == params.robustness.bim_steps == 5
    assert default.equivariance.angles == params.equivariance.angles


def test_capsnet_config_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, capsnet.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


SECTION_MODULE = """
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from capsnet.config.schema import Section


@dataclass(frozen=True)
class {name}(Section):
    SECTION: ClassVar[str] = {section!r}

    size: int = 1
"""


def _section_package(root, name: str, modules: dict[str, tuple[str, str]]) -> str:
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, (cls, section) in modules.items():
        (package / f"{module}.py").write_text(SECTION_MODULE.format(name=cls, section=section))
    return f"{name}.*"


def test_params_has_a_field_for_each_section_class_in_module_order():
    """capsnet.config.Params is made from the classes naming a SECTION in its modules."""
    assert SECTIONS == [
        "data", "augment", "evaluate", "publish", "sweep", "train", "smallnorb_sweep",
        "smallnorb_train", "viewpoints",
    ]  # fmt: skip
    assert config.SECTIONS["viewpoints"] is config.ViewpointsParams
    assert isinstance(config.Params().viewpoints, config.ViewpointsParams)


def test_section_modules_are_found_and_a_duplicate_names_its_module(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    found = config.find_sections(
        _section_package(tmp_path, "toysections_a", {"b": ("B", "beta"), "a": ("A", "alpha")})
    )
    assert {name: cls.__name__ for name, cls in found.items()} == {"alpha": "A", "beta": "B"}
    twice = _section_package(tmp_path, "toysections_b", {"a": ("A", "same"), "b": ("B", "same")})
    with pytest.raises(ConfigError, match=r"toysections_b/b\.py: section 'same' is already "):
        config.find_sections(twice)
