"""Reader for the IDX format of MNIST and Fashion-MNIST (LeCun et al. 1998), gzipped or not."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
             0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: Path) -> torch.Tensor:
    """Decode one IDX file: 2 zero bytes, a type code, the number of dims, big-endian int32 sizes, data.

    A ``.gz`` suffix (or the gzip magic bytes) means gzip-compressed. Raises ``ValueError`` on a bad file.
    """
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise ValueError(f"{path}: damaged gzip data ({err})") from err
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4).astype(int).tolist()
    dtype = np.dtype(IDX_TYPES[raw[2]])
    count = int(np.prod(dims)) if dims else 1
    start = 4 + 4 * ndim
    if len(raw) - start != count * dtype.itemsize:
        raise ValueError(f"{path}: IDX header says {dims} items of {dtype.itemsize} bytes but the file holds "
                         f"{len(raw) - start} bytes (truncated?)")
    data = np.frombuffer(raw, dtype=dtype, count=count, offset=start).reshape(dims)
    return torch.from_numpy(data.astype(dtype.newbyteorder("=")))
