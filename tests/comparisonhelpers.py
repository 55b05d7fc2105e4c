"""Constructed metrics.json comparison sections and seeded results for the report and
README tests."""

from __future__ import annotations


def group(model: str, acc: dict, std: dict, seeds: int = 3, **extra) -> dict:
    """One comparison row: ``acc``/``std`` map angles to accuracy (mean and std)."""
    names = [model] + [f"{model}@seed{i}" for i in range(1, seeds)]
    return {
        "model": model,
        "names": names,
        "seeds": seeds,
        "augment": "shift",
        "epochs": 3.0,
        "train_seconds": 20.0,
        "train_seconds_std": 0.5,
        "accuracy": {str(a): v for a, v in acc.items()},
        "std": {str(a): v for a, v in std.items()},
        **extra,
    }


def comparison(caps35: float, lenet35: float, std35: float = 0.01, seeds: int = 3) -> dict:
    """Equal augmentation only: capsnet-small and lenet5, upright 97% and 95% (std 0.1),
    at 35° ``caps35`` and ``lenet35`` with std ``std35`` each."""
    caps = group("capsnet-small", {0: 0.97, 35: caps35}, {0: 0.001, 35: std35}, seeds)
    lenet = group("lenet5", {0: 0.95, 35: lenet35}, {0: 0.001, 35: std35}, seeds)
    return {
        "angles": [0, 35],
        "arms": {
            "equal_augmentation": {
                "augment": "shift",
                "epochs": 3.0,
                "reference": "capsnet-small",
                "models": {"capsnet-small": caps, "lenet5": lenet},
            }
        },
    }


def checkpoint_entry(name: str, mnist: float, rot35: float) -> dict:
    return {
        "model": name.split("@")[0],
        "checkpoint": f"models/{name}.pt",
        "mnist": {"accuracy": mnist, "n": 100},
        "rotated-mnist": {"n": 100, "accuracy": {"0": mnist, "35": rot35}},
        "affnist": {"skipped": "images are 40x40, the model takes 28x28"},
        "multimnist": {"skipped": "images are 36x36, the model takes 28x28"},
        "robustness": {"skipped": "robustness is off"},
    }


def mean_entry(names: list[str], mnist: float, std: float) -> dict:
    return {
        "model": names[0].split("@")[0],
        "names": names,
        "checkpoints": [f"models/{n}.pt" for n in names],
        "seeds": len(names),
        "mnist": {"accuracy": mnist, "n": 100},
        "rotated-mnist": {"n": 100, "accuracy": {"0": mnist, "35": 0.5}},
        "std": {"mnist": {"accuracy": std}, "rotated-mnist": {"accuracy": {"0": std, "35": 0}}},
    }


def seeded_results() -> dict:
    """Two lenet5 seeds at equal augmentation, two at equal time (better on MNIST), one
    capsnet-small: as the evaluate stage names them, with the comparison section."""
    names = ["lenet5", "lenet5@seed1", "lenet5@equal-time", "lenet5@equal-time-seed1"]
    results = {n: checkpoint_entry(n, 0.95 + 0.01 * i, 0.6) for i, n in enumerate(names)}
    results["capsnet-small"] = checkpoint_entry("capsnet-small", 0.97, 0.7)
    results["lenet5 (mean)"] = mean_entry(names[:2], 0.955, 0.007)
    results["lenet5@equal-time (mean)"] = mean_entry(names[2:], 0.975, 0.007)
    section = comparison(0.70, 0.60)
    section["arms"]["equal_time"] = {
        "reference": "capsnet-small",
        "time_budget_seconds": 20.0,
        "models": {"lenet5": group("lenet5", {0: 0.975, 35: 0.6}, {0: 0.007, 35: 0.0}, 2)},
    }
    section["arms"]["equal_time"]["models"]["lenet5"]["names"] = names[2:]
    return {**results, "comparison": section}
