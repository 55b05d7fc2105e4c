"""Datasets: sources (mirror + official URLs), formats, and torch Datasets."""

from capsnet.data.datasets import DATASETS, TensorImageDataset, load, rotate_images

__all__ = ["DATASETS", "TensorImageDataset", "load", "rotate_images"]
