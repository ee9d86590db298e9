"""Random numbers for the step hooks that run under ``torch.func.vmap`` (where a ``torch.Generator`` cannot be used):
a counter-based generator, each number a hash of the client's key and the number's position, in integer tensor
ops only. It keeps no state, so a client's numbers depend only on (run seed, task, round, client) through its
key and on (method, hook, step, call, position): the same on the batched and sequential engines, and again on a
resumed run. The hash is Chris Wellons' ``lowbias32`` (two multiply-xorshift rounds on 32 bits), computed in
int64 without overflow (products split in 16-bit halves)."""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for ``0 <= x < 2**32`` (int64), every intermediate below ``2**63``."""
    low = (x & 0xFFFF) * c
    high = (((x >> 16) * c) & 0xFFFF) << 16
    return (low + high) & _MASK32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """``lowbias32`` of the int64 tensor ``x`` (its low 32 bits): a well-mixed value in ``[0, 2**32)``."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def key_of(seed: int) -> int:
    """A 32-bit key from a 63-bit seed (:func:`cfl.engine.local.jobs.derive_seed`)."""
    return (seed ^ (seed >> 32)) & _MASK32


class StepRandom:
    """One client's random numbers in one hook call: ``key`` a 0-dim int64 tensor (one client's, batched under
    ``vmap``), ``stream`` an int naming the call (method, hook, step). Each call of :meth:`uniform` or
    :meth:`integers` takes fresh numbers (a call counter, the same for every client: the hook's code is)."""

    def __init__(self, key: torch.Tensor, stream: int) -> None:
        self.key, self.stream, self.calls = key, stream, 0

    def _bits(self, n: int) -> torch.Tensor:
        self.calls += 1
        base = hash32(hash32(self.key + self.stream) + self.calls)
        return hash32(base + torch.arange(n, device=self.key.device) * 0x9E3779B9)

    def uniform(self, n: int) -> torch.Tensor:
        """``n`` float32 numbers uniform in ``[0, 1)`` (the top 24 of 32 random bits each: exact in float32)."""
        return (self._bits(n) >> 8).float() / 2.0**24

    def integers(self, high: torch.Tensor | int, n: int) -> torch.Tensor:
        """``n`` int64 numbers uniform in ``[0, high)`` (``high >= 1``, a number or a tensor broadcasting to
        ``(n,)``, e.g. per sample), from 32 random bits each (``high`` far below ``2**32``)."""
        u = self._bits(n).double() / 2.0**32
        high = torch.as_tensor(high, device=self.key.device)
        return torch.minimum((u * high).long(), high - 1)
