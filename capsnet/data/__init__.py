"""Datasets: sources (mirror + official URLs), formats, hook resolution, and torch Datasets.

The names below are imported on first use, so ``capsnet.data.registry`` imports no torch.
"""

__all__ = ["DATASETS", "TensorImageDataset", "load", "rotate_images"]


def __getattr__(name: str):
    if name in __all__:
        from capsnet.data import datasets

        return getattr(datasets, name)
    raise AttributeError(f"module 'capsnet.data' has no attribute {name!r}")
