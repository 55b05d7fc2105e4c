"""Helpers the sweep tests share."""

from __future__ import annotations


def base(sweep, data_root=None):
    """The base RunSpec of ``sweep`` with params.yaml's defaults."""
    from pipeline.sweep import base_spec

    return base_spec(sweep, data_root=data_root)
