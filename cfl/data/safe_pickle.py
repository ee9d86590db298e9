"""Unpickling dataset files without running their code: only numpy arrays, numbers, strings and containers.

A pickle can name any importable callable and have it called while loading (``os.system``,
``builtins.open``, ...), so a crafted "CIFAR" file would run its payload before any check of its content.
:class:`DataUnpickler` admits only the globals that numpy arrays, numpy scalars and Python's plain containers
need (as numpy 1 and 2 and Python 2 and 3 write them, pickle protocols 0 to 5); any other global is
refused with :class:`ForbiddenGlobal` before it is looked up, so nothing of it is imported or called.
"""

from __future__ import annotations

import codecs
import functools
import importlib
import pickle
from typing import IO, Any

import numpy as np


class ForbiddenGlobal(pickle.UnpicklingError):
    """A pickle names a global that a data file never needs (``module.name`` in the message)."""


def _numpy(module: str, name: str) -> Any:
    """``numpy._core.<module>.<name>`` (numpy 2), else ``numpy.core.<module>.<name>`` (numpy 1)."""
    try:
        return getattr(importlib.import_module(f"numpy._core.{module}"), name)
    except ImportError:  # numpy 1
        return getattr(importlib.import_module(f"numpy.core.{module}"), name)


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocols 0-2 use it for bytes (always latin-1)."""
    if encoding not in ("latin1", "latin-1"):
        raise ForbiddenGlobal(f"_codecs.encode with the encoding {encoding!r} (pickles use only latin1)")
    return codecs.encode(text, encoding)


@functools.cache
def _allowed() -> dict[tuple[str, str], Any]:
    arrays = {"_reconstruct": _numpy("multiarray", "_reconstruct"), "scalar": _numpy("multiarray", "scalar")}
    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
                                           ("_codecs", "encode"): _latin1}
    for core in ("numpy.core", "numpy._core"):
        allowed.update({(f"{core}.multiarray", name): obj for name, obj in arrays.items()})
        allowed[f"{core}.numeric", "_frombuffer"] = _numpy("numeric", "_frombuffer")
    for builtins in ("builtins", "__builtin__"):  # Python 3 and 2 names
        for container in (set, frozenset, bytearray, list, dict, tuple, complex):
            allowed[builtins, container.__name__] = container
    return allowed


class DataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` returns only the objects of the module doc."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _allowed()[module, name]
        except KeyError:
            raise ForbiddenGlobal(f"{module}.{name}") from None


def load_data_pickle(fh: IO[bytes], **kw: Any) -> Any:
    """``pickle.load(fh, **kw)`` through :class:`DataUnpickler`."""
    return DataUnpickler(fh, **kw).load()
