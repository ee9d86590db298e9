"""One client's method state as bytes and back: a JSON header describing the nested dict, then raw tensor data.

No pickle: a record holds only the tree's shape, dtypes, shapes and plain values (ints, floats, bools,
strings, None) in its header and each tensor's bytes, 64-byte aligned, after it. Decoding reads the record
into one buffer and returns tensors that are views of it (no copy), so a decoded state costs its own size.

Layout: ``MAGIC`` (4 bytes), a CRC-32 (``zlib.crc32``) of every byte after it (4 bytes), the header length
(4 bytes; both little endian), the header (UTF-8 JSON), zero padding to 64 bytes, then the tensors' data in
header order, each padded to 64 bytes. :func:`decode` and :func:`check` refuse a record whose checksum does
not match (:class:`RecordDamaged`): a changed value, a flipped bit or a damaged header is never read as a state.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import torch

MAGIC = b"CFLC"  # b"CFLS": the first format, without a checksum (no longer read)
ALIGN = 64
_PREFIX = struct.Struct("<4sII")  # magic, CRC-32 of the rest of the record, header length
_CHECKED = 8  # the checksum covers the record from this byte on: the header length, header, padding, data
_ZEROS = bytes(ALIGN)


class RecordDamaged(ValueError):
    """A client-state record whose bytes are not the ones cfl wrote (checksum mismatch, unknown magic)."""


def _pad(n: int) -> int:
    return -n % ALIGN


def _tree(obj: Any, tensors: list[torch.Tensor], offset: list[int], where: str) -> Any:
    """The JSON node of ``obj``; tensors are appended to ``tensors`` with their data offset."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        node = {"t": [str(t.dtype).removeprefix("torch."), list(t.shape), offset[0], t.numel() * t.element_size()]}
        tensors.append(t)
        offset[0] += node["t"][3] + _pad(node["t"][3])
        return node
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"{where}: key {k!r} is a {type(k).__name__}; client states take str or int keys")
            items.append([k, _tree(v, tensors, offset, f"{where}[{k!r}]")])  # JSON keeps int keys in a list
        return {"d": items}
    if isinstance(obj, (list, tuple)):
        nodes = [_tree(v, tensors, offset, f"{where}[{i}]") for i, v in enumerate(obj)]
        return {"l" if isinstance(obj, list) else "u": nodes}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        offset[1] += 4 if isinstance(obj, (int, float)) else 0  # as cfl.tensors.nbytes counts them
        return {"v": obj}
    raise TypeError(f"{where} is a {type(obj).__name__}; client states hold only tensors, numbers, strings and "
                    "lists/dicts of them")


def encode(state: dict[str, Any]) -> tuple[list[memoryview | bytes], int, int]:
    """``(buffers, record length, state bytes)``: the record as buffers to write one after the other, and the
    state's size as :func:`cfl.tensors.nbytes` counts it (tensor bytes, 4 per plain number)."""
    tensors: list[torch.Tensor] = []
    offset = [0, 0]  # data bytes so far, bytes of plain numbers
    header = json.dumps(_tree(state, tensors, offset, "state"), separators=(",", ":")).encode()
    size = struct.pack("<I", len(header))
    head_len = _PREFIX.size + len(header)
    buffers: list[memoryview | bytes] = [b"", header, _ZEROS[: _pad(head_len)]]
    data = offset[1]
    for t in tensors:
        n = t.numel() * t.element_size()
        if n:
            buffers.append(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            buffers.append(_ZEROS[: _pad(n)])
        data += n
    crc = zlib.crc32(size)  # the bytes from _CHECKED on, buffer by buffer
    for b in buffers[1:]:
        crc = zlib.crc32(b, crc)
    buffers[0] = _PREFIX.pack(MAGIC, crc, len(header))
    return buffers, head_len + _pad(head_len) + offset[0], data


def _build(node: dict[str, Any], buf: bytearray, base: int, device: torch.device) -> Any:
    if "t" in node:
        dtype_name, shape, offset, nbytes = node["t"]
        dtype = getattr(torch, dtype_name)
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=device)
        t = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=base + offset).view(dtype).view(shape)
        return t if device.type == "cpu" else t.to(device)
    if "d" in node:
        return {k: _build(v, buf, base, device) for k, v in node["d"]}
    if "l" in node:
        return [_build(v, buf, base, device) for v in node["l"]]
    if "u" in node:
        return tuple(_build(v, buf, base, device) for v in node["u"])
    return node["v"]


def check(buf: bytearray | bytes) -> None:
    """Refuse (:class:`RecordDamaged`) a record whose magic or checksum is not the one :func:`encode` wrote."""
    if len(buf) < _PREFIX.size:
        raise RecordDamaged(f"record of {len(buf)} bytes is shorter than its {_PREFIX.size}-byte prefix")
    magic, stored, _ = _PREFIX.unpack_from(buf, 0)
    if magic != MAGIC:
        old = " (a record of an older cfl, without a checksum)" if magic == b"CFLS" else ""
        raise RecordDamaged(f"record starts with {bytes(magic)!r}, not {MAGIC!r}{old}")
    computed = zlib.crc32(memoryview(buf)[_CHECKED:])
    if computed != stored:
        raise RecordDamaged(f"checksum mismatch (CRC-32 stored 0x{stored:08x}, computed 0x{computed:08x})")


def decode(buf: bytearray, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The state a record encodes, once its checksum is checked; CPU tensors are views of ``buf``."""
    check(buf)
    _, _, length = _PREFIX.unpack_from(buf, 0)
    end = _PREFIX.size + length
    header = json.loads(bytes(buf[_PREFIX.size:end]))
    return _build(header, buf, end + _pad(end), torch.device(device))
