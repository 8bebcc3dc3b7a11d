"""Where esiwrap's own files are: the package (a Ray job's `py_modules`) and the start-up hook's
directory (first on the child's `PYTHONPATH`). Standard library only: the hook loads it."""

from __future__ import annotations

import os


def package_dir() -> str:
    """The esiwrap package directory, for a Ray job's `py_modules` (nodes need not have it)."""
    return os.path.dirname(os.path.realpath(__file__))


def bootstrap_dir() -> str:
    """The directory holding only our `sitecustomize.py`, for the front of `PYTHONPATH`."""
    return os.path.join(package_dir(), "_bootstrap")
