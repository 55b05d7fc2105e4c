"""Errors and files: atomic writes, output sets, safe torch-file reading."""
