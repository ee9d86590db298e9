"""Dataset pickles are read by a restricted unpickler: numpy arrays and plain data load as with ``pickle``,
whatever the protocol or the numpy and Python versions that wrote them; any other global is refused before
it runs (the CLI cases, in the real on-disk layouts, are in tests/data/test_refusals_data.py)."""

from __future__ import annotations

import codecs
import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cfl.data.safe_pickle import ForbiddenGlobal, TooLarge, load_data_pickle

DATA = {b"data": np.arange(24, dtype=np.uint8).reshape(2, 3, 4), "labels": [np.int64(3), 4, 4.5, "a", b"b", None],
        "strided": np.arange(12.0).reshape(3, 4)[:, ::2], "int32": np.array([-1, 7], np.int32),
        "big-endian": np.array([1, 2], ">i4"), "set": {1, 2}, "frozen": frozenset({3}),
        "tuple": (1, (2,)), "complex": 1 + 2j, "scalar": np.float32(2.5), "class_dict": {"n01": np.arange(3)}}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_data_loads_as_with_pickle_in_every_protocol(protocol):
    text = pickle.dumps(DATA, protocol=protocol)
    assert _same(load_data_pickle(io.BytesIO(text)), pickle.loads(text))  # noqa: S301 - our own data


def test_numpy_1_names_and_python_2_strings_load():
    """The real CIFAR files: numpy 1's ``numpy.core.multiarray`` and Python 2 strings (``encoding="bytes"``)."""
    text = pickle.dumps({b"data": DATA[b"data"]}, protocol=2).replace(b"numpy._core.", b"numpy.core.")
    assert b"numpy.core.multiarray" in text
    assert _same(load_data_pickle(io.BytesIO(text), encoding="bytes"), {b"data": DATA[b"data"]})


class _Call:
    """Pickled as a call of ``function(*args)``, as a crafted file would hold it."""

    def __init__(self, function: Any, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple:
        return self.function, self.args


@pytest.mark.parametrize(("call", "named"), [
    (lambda marker: _Call(os.system, f"touch '{marker}'"), "posix.system"),
    (lambda marker: _Call(open, str(marker), "w"), "io.open"),
    (lambda marker: _Call(eval, f"open({str(marker)!r}, 'w')"), r"(builtins|__builtin__)\.eval"),
    (lambda marker: _Call(np.save, str(marker), np.zeros(1)), "numpy.save"),
    (lambda marker: _Call(getattr, str(marker), "upper"), r"(builtins|__builtin__)\.getattr"),
    (lambda marker: _Call(codecs.encode, str(marker), "rot13"), "'rot13'"),
])
def test_any_other_global_is_refused_before_it_runs(tmp_path: Path, call, named):
    marker = tmp_path / "marker"
    for protocol in (0, 2, pickle.HIGHEST_PROTOCOL):
        text = pickle.dumps({b"data": [call(marker)]}, protocol=protocol)
        with pytest.raises(ForbiddenGlobal, match=named):
            load_data_pickle(io.BytesIO(text), encoding="bytes")
    assert not list(tmp_path.iterdir())


def test_a_bytearray_of_protocol_5_loads_and_the_bytearray_global_is_refused():
    """Protocol 5 writes a bytearray with the BYTEARRAY8 opcode (no global); ``bytearray(n)`` as a call, which a
    60-byte file used to ask for 10 GB with, names a global no data file needs."""
    assert load_data_pickle(io.BytesIO(pickle.dumps({"b": bytearray(b"xy")}, protocol=5))) == {"b": bytearray(b"xy")}
    call = b"\x80\x02cbuiltins\nbytearray\nJ\x00\xe1\xf5\x05\x85R."  # bytearray(10**8)
    assert len(call) < 60
    with pytest.raises(ForbiddenGlobal, match="builtins.bytearray"):
        load_data_pickle(io.BytesIO(call))


@pytest.mark.parametrize(("text", "words"), [
    (b"\x80\x05\x8e" + (10**10).to_bytes(8, "little") + b"xx.", "read 10,000,000,000 bytes where its file has 3"),
    (b"\x80\x05\x96" + (10**10).to_bytes(8, "little") + b"xx.", "read 10,000,000,000 bytes where its file has 3"),
    (b"\x80\x04X" + (10**9).to_bytes(4, "little") + b"xx.", "read 1,000,000,000 bytes where its file has 3"),
    (pickle.dumps(np.zeros(1, np.uint8), protocol=2).replace(b"K\x00\x85", b"J\x00\xe1\xf5\x05\x85"),
     "an array of 100,000,000 bytes (shape (100000000,)), larger than its whole file"),
], ids=["BINBYTES8", "BYTEARRAY8", "BINUNICODE", "_reconstruct"])
def test_a_length_or_shape_beyond_the_file_is_refused_before_it_is_allocated(text, words):
    with pytest.raises(TooLarge, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_data_pickle(io.BytesIO(text), encoding="bytes")


def test_a_real_file_is_bounded_by_its_size(tmp_path):
    path = tmp_path / "data_batch_1"
    path.write_bytes(b"\x80\x05\x8e" + (10**10).to_bytes(8, "little") + b"xx.")
    with open(path, "rb") as fh, pytest.raises(TooLarge, match="10,000,000,000|9,999,999,997"):
        load_data_pickle(fh)
