"""capsnet: capsule networks (dynamic routing and EM routing) in PyTorch."""

import importlib.abc
import sys

__version__ = "0.1.0"

#: Modules that moved (old name under capsnet -> new path under capsnet/): importing the
#: old name fails with a note naming the new one, never as a silent alias.
MOVED = {
    "routing": "nn/routing",
    "checkpoint": "models/checkpoint",
    "evaluation.metrics": "evaluation/results",
}


def _moved(name: str) -> ModuleNotFoundError | None:
    """The error for importing ``name`` when it is a moved module, else None."""
    package, _, old = name.partition(".")
    if package != __name__ or old not in MOVED:
        return None
    new = f"{__name__}.{MOVED[old].replace('/', '.')}"
    return ModuleNotFoundError(f"{name} has moved: import {new} instead", name=name)


class _MovedModules(importlib.abc.MetaPathFinder):
    """Consulted after every other finder (so only for a name no file provides): the
    ImportError of a moved module says where it went."""

    def find_spec(self, fullname, path=None, target=None):
        if (error := _moved(fullname)) is not None:
            raise error
        return None


def __getattr__(name: str):
    if (error := _moved(f"{__name__}.{name}")) is not None:
        raise error
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
