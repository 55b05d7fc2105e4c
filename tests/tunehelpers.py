"""Reading what Ray Tune's trials reported, for the tests of sweeps."""

from __future__ import annotations

import json
from pathlib import Path


def trial_results(storage: Path) -> dict[str, list[dict]]:
    """{trial number: the results it reported} from every trial's result.json under the
    Tune storage ``storage`` (where the node that ran each epoch is recorded; results.csv
    leaves it out). A line being written right now ends a trial's list."""
    found = {}
    for path in storage.glob("*/trial_*/result.json"):
        rows = []
        for line in filter(str.strip, path.read_text().splitlines()):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
        found[path.parent.name.removeprefix("trial_")] = rows
    return found
