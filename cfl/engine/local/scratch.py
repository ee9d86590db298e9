"""Buffers a stacked step writes into, allocated once and kept across steps and rounds.

A step of the stacked path (:mod:`cfl.engine.local.stacked_net`) makes the same activation-, gradient- and
mask-sized tensors every step; allocating each afresh is one more dispatched operator per tensor (on a GPU an
allocator call in the launch queue's way, on the CPU fresh pages: :mod:`cfl.engine.local.heap`). :class:`Scratch`
hands out prefixes of buffers kept in the trainer's workspace: clients train sorted by step count, so a
later step's clients are a prefix of the first step's and their tensors a prefix of its buffers (views, no
copies). A buffer's contents are whatever the last step left: every user overwrites it (``out=``).
"""

from __future__ import annotations

import torch

from cfl.tensors import Params

PREFIX = "scratch:"


class Scratch:
    """Prefix views of buffers kept in ``store`` (the trainer's workspace), keyed by name."""

    def __init__(self, store: Params) -> None:
        self.store = store
        #: the step's dropout noise drawn ahead, per layer name
        #: (:meth:`cfl.engine.local.stacked_net.StackedNet.forward`)
        self.drawn: dict[str, torch.Tensor] = {}

    def get(self, key: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
            fill: float | None = None) -> torch.Tensor:
        """A ``shape`` tensor: the first ``shape[0]`` rows of the buffer ``key`` (made anew when its trailing
        shape, dtype or device differ, or it has fewer rows). ``fill``: a new buffer's value (its rows are
        then never written by the step: ones for a product that sums, kept across rounds)."""
        name = PREFIX + key
        buf = self.store.get(name)
        if buf is None or buf.shape[1:] != shape[1:] or buf.shape[0] < shape[0] or buf.dtype != dtype \
                or buf.device != device:
            buf = torch.empty(shape, dtype=dtype, device=device) if fill is None else \
                torch.full(shape, fill, dtype=dtype, device=device)
            self.store[name] = buf
        return buf if buf.shape[0] == shape[0] else buf[: shape[0]]
