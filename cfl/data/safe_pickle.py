"""Unpickling dataset files without running their code: only numpy arrays, numbers, strings and containers.

A pickle can name any importable callable and have it called while loading (``os.system``,
``builtins.open``, ...), so a crafted "CIFAR" file would run its payload before any check of its content.
:class:`DataUnpickler` admits only the globals that numpy arrays, numpy scalars and Python's plain containers
need (as numpy 1 and 2 and Python 2 and 3 write them, pickle protocols 0 to 5); any other global is
refused with :class:`ForbiddenGlobal` before it is looked up, so nothing of it is imported or called.

Nothing a pickle asks for may exceed what its file holds (:class:`TooLarge`): a length field of a bytes,
string or bytearray opcode larger than the bytes left in the file, and an array that ``_reconstruct`` would
allocate larger than the whole file, are refused before the memory is asked for (a 60-byte file asked for
10 GB with ``bytearray(10**10)``). ``bytearray`` is not an allowed global: numpy arrays never need it (they
pickle their data as bytes, or under protocol 5 with the BYTEARRAY8 opcode, whose length is checked), and the
CIFAR and Mini-ImageNet files hold only numpy arrays, numbers, strings, lists and dicts.
"""

from __future__ import annotations

import codecs
import functools
import importlib
import io
import os
import pickle
from typing import IO, Any

import numpy as np


class ForbiddenGlobal(pickle.UnpicklingError):
    """A pickle names a global that a data file never needs (``module.name`` in the message)."""


class TooLarge(pickle.UnpicklingError):
    """A pickle asks for more memory than its file size justifies."""


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
        for container in (set, frozenset, list, dict, tuple, complex):  # no bytearray: bytearray(10**10)
            allowed[builtins, container.__name__] = container
    return allowed


class _BoundedReader:
    """``fh`` for the unpickler, refusing any read longer than the bytes left in the file: the unpickler would
    otherwise allocate an opcode's length (up to 2**64 bytes) before finding that the file ends."""

    def __init__(self, fh: IO[bytes], size: int) -> None:
        self.fh, self.size = fh, size
        if hasattr(fh, "peek"):  # the unpickler then reads small opcodes from a prefetched buffer (speed)
            self.peek = fh.peek

    def _check(self, n: int) -> None:
        left = self.size - self.fh.tell()
        if n > max(left, 0):
            raise TooLarge(f"the pickle asks to read {n:,} bytes where its file has {left:,} left (a length field "
                           f"larger than the file)")

    def read(self, n: int = -1) -> bytes:
        if n is not None and n >= 0:
            self._check(n)
        return self.fh.read(n)

    def readinto(self, buf: Any) -> int:
        self._check(memoryview(buf).nbytes)
        return self.fh.readinto(buf)  # type: ignore[attr-defined]

    def readline(self, limit: int = -1) -> bytes:
        return self.fh.readline(limit)


def _file_size(fh: IO[bytes]) -> int:
    try:
        return os.fstat(fh.fileno()).st_size
    except (AttributeError, OSError, io.UnsupportedOperation):  # an in-memory file
        here = fh.tell()
        end = fh.seek(0, io.SEEK_END)
        fh.seek(here)
        return end


class DataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` returns only the objects of the module doc, reading at most
    ``size`` bytes (the file's) and building no array larger than that."""

    def __init__(self, fh: IO[bytes], size: int | None = None, **kw: Any) -> None:
        self.size = _file_size(fh) if size is None else size
        super().__init__(_BoundedReader(fh, self.size), **kw)

    def find_class(self, module: str, name: str) -> Any:
        try:
            found = _allowed()[module, name]
        except KeyError:
            raise ForbiddenGlobal(f"{module}.{name}") from None
        if name == "_reconstruct":
            return functools.partial(_bounded_reconstruct, found, self.size)
        return found


def _bounded_reconstruct(reconstruct: Any, limit: int, cls: Any, shape: Any, dtype: Any) -> Any:
    """numpy's ``_reconstruct(cls, shape, dtype)`` (which allocates the array) for at most ``limit`` bytes; numpy
    itself pickles every array with shape ``(0,)`` here and its data in the state that follows."""
    try:
        nbytes = int(np.prod(np.asarray(shape, dtype=np.float64))) * np.dtype(dtype).itemsize
    except (TypeError, ValueError) as err:
        raise pickle.UnpicklingError(f"numpy _reconstruct with shape {shape!r} and dtype {dtype!r}: {err}") from None
    if nbytes > limit:
        raise TooLarge(f"the pickle asks numpy for an array of {nbytes:,} bytes (shape {tuple(shape)}), larger than "
                       f"its whole file ({limit:,} bytes)")
    return reconstruct(cls, shape, dtype)


def load_data_pickle(fh: IO[bytes], **kw: Any) -> Any:
    """``pickle.load(fh, **kw)`` through :class:`DataUnpickler`."""
    return DataUnpickler(fh, **kw).load()
