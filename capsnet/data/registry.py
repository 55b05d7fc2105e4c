"""The dataset hooks' resolution: a ``capsnet.config.dataset_specs`` declaration names its
functions as "module:attribute" strings; they are imported here, on use, from the data floor
up (config never imports a dataset module)."""

from __future__ import annotations

import importlib
from typing import Any


def resolve(reference: str) -> Any:
    """The object a "module:attribute" string names."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)
