"""Routing algorithms as pure tensor functions (no config objects, no I/O): dynamic routing
and squash (``dynamic``), EM routing in its plain, blocked and from-poses forms (``em``)."""

from capsnet.routing.dynamic import SQUASH_EPS, dynamic_routing, safe_norm, squash
from capsnet.routing.em import (
    EM_FINAL_LAMBDA,
    EM_MIN_VAR,
    em_inverse_temperatures,
    em_routing,
    em_routing_blocked,
    em_routing_from_poses,
)

__all__ = [
    "EM_FINAL_LAMBDA",
    "EM_MIN_VAR",
    "SQUASH_EPS",
    "dynamic_routing",
    "em_inverse_temperatures",
    "em_routing",
    "em_routing_blocked",
    "em_routing_from_poses",
    "safe_norm",
    "squash",
]
