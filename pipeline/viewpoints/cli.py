"""``capsnet viewpoints``: the novel-viewpoint experiment (the DVC ``viewpoints`` stage),
``pipeline.viewpoints.stage`` run in this process or, when this machine has no GPU and the Ray
cluster of ``$RAY_ADDRESS`` has one, on a GPU worker (``pipeline.cluster.gpu_worker``)."""

from __future__ import annotations

import click

from capsnet.cli.declared import Command
from capsnet.cli.options import check_output, data_root_option, params_option


def _stderr_log(line: str) -> None:
    click.echo(line, err=True)


COMMAND = Command(
    "viewpoints",
    "viewpoints_command",
    "Train capsules and the CNN on familiar smallNORB viewpoints; compare them on novel "
    "viewpoints at matched familiar error -> viewpoints.out_dir.",
    sections=("viewpoints",),
    stages=("viewpoints",),
)


@click.command("viewpoints")
@params_option("sections viewpoints and data.smallnorb")
@data_root_option(help="Data directory holding prepared/smallnorb (the DVC stages' data/).")
def viewpoints_command(params_path, data_root):
    """Train capsules and the CNN on familiar smallNORB viewpoints; compare them on novel
    viewpoints at matched familiar error -> viewpoints.out_dir."""
    from capsnet import config
    from capsnet.config import dataset_specs
    from capsnet.data.stages import why_off
    from capsnet.evaluation.viewpoint_matching import OUT_DIR_FILES
    from pipeline.cluster.gpu_worker import placement
    from pipeline.viewpoints import stage as viewpoints

    params = config.load(params_path)
    where = f"{params_path.name}: viewpoints.out_dir"
    check_output(params.viewpoints.out_dir, where, own=OUT_DIR_FILES)
    check_output(f"{params.viewpoints.out_dir}.csv", where, "file")
    if why_off(params, dataset_specs.viewpoint_dataset(), data_root) is not None:
        result = viewpoints.run(params, data_root, log=_stderr_log)
    else:
        with placement(log=_stderr_log) as runner:
            result = viewpoints.run(params, data_root, log=_stderr_log, runner=runner)
    out = params.viewpoints.out_dir
    if "disabled" in result:
        click.echo(f"viewpoints: not run: {result['disabled']}")
        click.echo(f"wrote {out} (DISABLED.txt, viewpoints.json), {out}.csv (its header)")
        return
    for kind, entry in result["kinds"].items():
        selection = entry["selection"]
        chosen = selection["models"]
        verdict = "matched" if selection["matched"] else "NOT matched"
        paper = entry["paper_novel_error"]
        click.echo(
            f"{kind}: {verdict} at {selection['target_familiar_error']:.2%} familiar error "
            f"(gap {selection['gap']:.2%}): novel: capsules "
            f"{chosen['capsules']['novel_error']:.2%}, CNN {chosen['cnn']['novel_error']:.2%} "
            f"(paper {paper['capsules']:.1%}, {paper['cnn']:.1%})"
        )
    click.echo(f"wrote {out}")
