"""Per-trial overhead of the Ray Tune sweep: from Tune starting a trial to its first report,
minus the training and evaluation of that first epoch (which the trial itself times).

    python benchmarks/sweep_overhead.py --trials 4 --num-cpus 2

The overhead is actor start-up, imports, fetching the datasets from the object store,
building the model and Tune's own bookkeeping. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

for key, value in {
    "RAY_USAGE_STATS_ENABLED": "0",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "NO_ALBUMENTATIONS_UPDATE": "1",
}.items():
    os.environ.setdefault(key, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--model", default="capsnet-small")
    parser.add_argument("--train-size", type=int, default=300)
    parser.add_argument("--reuse-actors", action="store_true")
    parser.add_argument("--wandb", choices=["offline", "disabled"], default="offline")
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args()

    from ray.tune import Callback

    from capsnet.config import SweepConfig
    from pipeline.sweep.stage import base_spec, run_sweep

    class Timings(Callback):
        def __init__(self):
            self.started: dict[str, float] = {}
            self.first: dict[str, tuple[float, dict]] = {}

        def on_trial_start(self, iteration, trials, trial, **info):
            self.started.setdefault(trial.trial_id, time.time())

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.first.setdefault(trial.trial_id, (time.time(), dict(result)))

    timings = Timings()
    with tempfile.TemporaryDirectory() as tmp:
        data_root = args.data_root or str(Path(tmp) / "data")
        sweep = SweepConfig.from_dict(
            {
                "name": "overhead",
                "space": {
                    "model": args.model,
                    "routing_iterations": 3,
                    "augment": "none",
                    "lr": {"grid": [1e-3 * (1 + i) for i in range(args.trials)]},
                },
                "epochs": 1,
                "batch_size": 50,
                "train_size": args.train_size,
                "val_size": 200,
                "asha": {"enabled": False},
                "reuse_actors": args.reuse_actors,
                "storage_path": str(Path(tmp) / "ray"),
                "wandb": {"mode": args.wandb, "dir": str(Path(tmp) / "runs")},
            }
        )
        started = time.time()
        run_sweep(
            sweep,
            base_spec(sweep, data_root=data_root),
            out_dir=Path(tmp) / "sweep",
            num_cpus=args.num_cpus,
            callbacks=[timings],
        )
        wall = time.time() - started

    overheads, setups = [], []
    for trial_id, (reported, result) in sorted(
        timings.first.items(), key=lambda item: timings.started[item[0]]
    ):
        to_first_report = reported - timings.started[trial_id]
        work = result["epoch_seconds"] + result["eval_seconds"]
        overheads.append(to_first_report - work)
        setups.append(result["setup_seconds"])
    print(
        json.dumps(
            {
                "trials": len(overheads),
                "num_cpus": args.num_cpus,
                "model": args.model,
                "reuse_actors": args.reuse_actors,
                "wandb": args.wandb,
                "overhead_s_mean": round(statistics.mean(overheads), 3),
                "overhead_s_max": round(max(overheads), 3),
                "overhead_s_per_trial": [round(o, 2) for o in overheads],
                "in_trial_setup_s_mean": round(statistics.mean(setups), 3),
                "sweep_wall_s": round(wall, 1),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
