"""capsnet: capsule networks (dynamic routing and EM routing) in PyTorch."""

__version__ = "0.1.0"
