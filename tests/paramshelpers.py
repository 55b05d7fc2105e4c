"""Shrinking the real params.yaml for end-to-end tests."""

from __future__ import annotations

from typing import Any


def shrink(text: str, settings: dict[str, Any]) -> str:
    """``text`` (params.yaml) with each dotted key of ``settings`` set; every key must
    already exist, so a renamed setting fails the test instead of being ignored."""
    import yaml

    values = yaml.safe_load(text)
    for key, value in settings.items():
        *parents, leaf = key.split(".")
        node = values
        for part in parents:
            node = node[part]
        assert leaf in node, f"params.yaml has no {key}"
        node[leaf] = value
    return yaml.safe_dump(values, sort_keys=False)
