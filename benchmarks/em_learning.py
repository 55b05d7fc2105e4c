"""How fast em-capsnet-small learns the smallNORB stand-in at a small budget: one training
run through ``capsnet.training.run.train_run`` with model config overrides, then the test error on
the first ``--test`` centre-cropped test images (of the familiar subset when training on
one). Prints one JSON line. The table in docs/guides/em.md ("Learning on the stand-in") was
measured with it, one thread per process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click


@click.command()
@click.option(
    "--root",
    type=click.Path(path_type=Path),
    default=Path("runs/em-learning"),
    show_default=True,
    help="where the stand-in is rendered and prepared once",
)
@click.option("--iterations", type=int, default=2, show_default=True)
@click.option("--epochs", type=int, default=2, show_default=True)
@click.option("--train-size", type=int, default=512, show_default=True)
@click.option("--subset", default="all", show_default=True, help="e.g. azimuth-familiar")
@click.option("--lr", type=float, default=3e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--test", "test_size", type=int, default=300, show_default=True)
@click.option("--compile", "compiled", is_flag=True, help="compile the EM routing")
@click.option(
    "--overrides", default="{}", help='model config fields as JSON, e.g. {"min_var": 0.02}'
)
def main(root, iterations, epochs, train_size, subset, lr, seed, test_size, compiled, overrides):
    import torch

    from capsnet.config import DataParams, Params, SmallnorbParams
    from capsnet.config.training import TrainConfig
    from capsnet.data import stages
    from capsnet.training.run import RunSpec, load_test, train_run
    from capsnet.training.scoring import accuracy

    torch.set_num_threads(1)
    if not (root / "prepared" / "smallnorb").exists():
        params = Params(data=DataParams(smallnorb=SmallnorbParams(source="synth")))
        stages.download("smallnorb", params, root)
        stages.prepare("smallnorb", params, root)
    config = TrainConfig(
        epochs=epochs,
        batch_size=32,
        seed=seed,
        progress=False,
        device="cpu",
        loss="spread",
        lr=lr,
        weight_decay=2e-7,
        compile=compiled,
    )
    model_config = {"routing_iterations": iterations, **json.loads(overrides)}
    spec = RunSpec(
        model="em-capsnet-small",
        train=config,
        dataset="smallnorb",
        subset=subset,
        train_size=train_size,
        val_size=0,
        data_root=root,
        overrides=model_config,
    )
    cpu = time.process_time()
    result = train_run(spec)
    familiar = None if subset == "all" else subset.replace("novel", "familiar")
    tests = load_test(spec, limit=test_size, subset=familiar)
    error = 1 - accuracy(result.model, tests, 100)["accuracy"]
    steps = epochs * -(-train_size // 32)
    print(
        json.dumps(
            {
                "overrides": model_config,
                "subset": subset,
                "steps": steps,
                "seed": seed,
                "test_error": round(error, 4),
                "cpu_s": round(time.process_time() - cpu, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
