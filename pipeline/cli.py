"""What ``capsnet sweep`` (pipeline/sweep_cli.py) and ``capsnet train-final``
(pipeline/train_final_cli.py) share: the params option, the sections and where each sweep
writes, and why a smallNORB section cannot run. Each command lives in its own module, so a
DVC stage depends only on the code its command imports.

``--section`` picks the params section: ``sweep`` / ``train`` (MNIST, the defaults) or
``smallnorb_sweep`` / ``smallnorb_train`` (the EM paper's smallNORB ablation). With
smallNORB switched off both commands exit 0 and write outputs marked DISABLED."""

from __future__ import annotations

from pathlib import Path

from capsnet.cli_options import check_output, data_root_option, params_option

PARAMS_OPTION = params_option("sections sweep, train, smallnorb_sweep, smallnorb_train")
DATA_ROOT_OPTION = data_root_option()
SWEEP_SECTIONS = ("sweep", "smallnorb_sweep")
TRAIN_SECTIONS = ("train", "smallnorb_train")
#: Each sweep section's output directory (also where train-final reads best.json), so the
#: smallNORB sweep never writes over the MNIST one by default.
SWEEP_OUT = {"sweep": Path("sweep"), "smallnorb_sweep": Path("sweep-smallnorb")}


def load_params(params_path: Path):
    from capsnet import config

    return config.load(params_path)


def disabled_reason(params, sweep, data_root) -> str | None:
    """Why the sweep's dataset cannot be used (smallNORB switched off in params, or its
    prepared directory holding only DISABLED.txt), or None (MNIST is always on)."""
    from capsnet.io import read_disabled

    if sweep.dataset != "smallnorb":
        return None
    if not params.data.smallnorb.enabled:
        return "data.smallnorb.enabled is false in params.yaml"
    prepared = Path(data_root or "data") / "prepared" / "smallnorb"
    why = read_disabled(prepared)
    return None if why is None else f"{prepared} is switched off ({why})"


def check_sweep_outputs(params_path: Path, section: str, sweep) -> None:
    """The sweep section's local storage and W&B directories are writable (before any work)."""
    name = Path(params_path).name
    if "://" not in sweep.storage_path:
        check_output(sweep.storage_path, f"{name}: {section}.storage_path")
    check_output(sweep.wandb.dir, f"{name}: {section}.wandb.dir")
