"""Datasets: sources (mirror + official URLs), formats, and torch Datasets."""

from capsnet.data.datasets import TensorImageDataset, load

__all__ = ["TensorImageDataset", "load"]
