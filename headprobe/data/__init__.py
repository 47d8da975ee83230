"""Labelled image data: sources, splits and limits."""

from .sources import DataSplits, load_data

__all__ = ["DataSplits", "load_data"]
