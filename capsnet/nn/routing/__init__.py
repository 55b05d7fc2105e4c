"""Routing algorithms as pure tensor functions (no config objects, no I/O): dynamic routing
and squash (``dynamic``), EM routing (``em``: one implementation, eager or compiled)."""

from capsnet.nn.routing.dynamic import SQUASH_EPS, dynamic_routing, safe_norm, squash
from capsnet.nn.routing.em import (
    EM_FINAL_LAMBDA,
    EM_MIN_VAR,
    GlobalScope,
    child_index,
    conv_scope,
    em_inverse_temperatures,
    em_routing,
)

__all__ = [
    "EM_FINAL_LAMBDA",
    "EM_MIN_VAR",
    "SQUASH_EPS",
    "GlobalScope",
    "child_index",
    "conv_scope",
    "dynamic_routing",
    "em_inverse_temperatures",
    "em_routing",
    "safe_norm",
    "squash",
]
