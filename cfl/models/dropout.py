"""Dropout (Srivastava et al., 2014) whose mask comes from raw random bits rather than one float per element.

torch's CPU generator (mt19937) is slow per element: ``torch.rand_like`` costs ~15 ms per 64x64x400 tensor
and ``nn.Dropout``'s Bernoulli three times that, which made dropout the largest cost of a batched round
after the matrix products. Here one full-range 64-bit draw (``random_(-2**63, None)``, no modulo) gives
the mask of 8 elements (8-bit noise, when ``p`` is a multiple of 1/256, e.g. 0.5) or 4 elements (16-bit
noise otherwise); comparing with a threshold and one float multiply make the mask (``torch.where`` is far
slower on CPU than a multiply). The draw comes from torch's global generator, so masks are reproducible
from the seed and checkpointed with torch's RNG state, and it runs under ``vmap(randomness="different")``.

With 16-bit noise the drop probability is ``p`` rounded to a multiple of 2**-16 (0.2 -> 0.19999695);
the kept units are scaled by the inverse of the exact keep probability, so the layer stays unbiased.
"""

from __future__ import annotations

import functools

import torch
from torch import nn


@functools.cache
def _vmap_can_view_dtype() -> bool:
    """Whether this torch's ``vmap`` reinterprets int64 words as int8/int16 (``Tensor.view(dtype)``).

    torch 2.14 does; torch 2.11 raises "Batching rule not implemented for aten::view.dtype".
    """
    try:
        torch.func.vmap(lambda w: w.view(torch.int8))(torch.zeros(2, 1, dtype=torch.int64))
    except RuntimeError:
        return False
    return True


def split_words(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The signed ``bits``-bit fields of int64 ``words``, lowest first: ``words.view(int8/int16)`` on a
    little-endian machine, by shifts and masks (for a ``vmap`` without a batching rule for ``view``)."""
    shifts = torch.arange(0, 64, bits, device=words.device)
    fields = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return (fields - (fields >= (1 << (bits - 1))).long() * (1 << bits)).flatten(-2)


def _stored_channels_last(x: torch.Tensor) -> bool:
    """Whether ``x`` is a 4-d tensor stored channels-last and not contiguous (the stacked engine path's
    grouped activations on CPU). Inside a ``torch.func`` transform (the vmap path) the answer is False
    without asking: ``vmap`` cannot tell the memory format of a non-contiguous tensor ("NYI: querying
    is_contiguous inside of vmap"), so there the noise is drawn in the logical (contiguous) order, as it
    is for every tensor a transform can tell apart (a contiguous one)."""
    if x.dim() != 4 or x.is_contiguous() or torch._C._functorch.maybe_current_level() is not None:
        return False
    return x.is_contiguous(memory_format=torch.channels_last)


def _noise_bits(p: float) -> int:
    return 8 if float(p * 256).is_integer() else 16


def keep_threshold(p: float, bits: int) -> tuple[int, float]:
    """Signed threshold ``t`` (keep where noise >= t) and the exact keep probability for ``bits``-bit noise."""
    half = 1 << (bits - 1)
    t = min(round(p * (1 << bits)) - half, half - 1)  # at least one code point kept
    return t, (half - t) / (1 << bits)


class Dropout(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.bits = _noise_bits(p)
        self.threshold, self.keep_prob = keep_threshold(p, self.bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        mask = (self._noise(x) >= self.threshold).to(x.dtype).mul_(1.0 / self.keep_prob)
        return x * mask

    def keep_mask(self, x: torch.Tensor, out: torch.Tensor | None = None, words: torch.Tensor | None = None,
                  drawn: bool = False) -> torch.Tensor:
        """The 0/1 keep mask of ``x`` in its dtype, from the same draw ``forward`` makes (unscaled).

        The comparison writes floats directly (``out=``: ~5x faster than a bool mask then a cast), which
        ``vmap`` does not support: for the stacked engine path, which runs outside vmap. ``out`` (like ``x``)
        and ``words`` (``noise_words(x.numel())`` int64): buffers to draw and write into instead of fresh
        ones, the same values; ``drawn``: ``words`` already hold the draw (made for several masks at once).
        """
        return torch.ge(self._noise(x, words, drawn), self.threshold, out=torch.empty_like(x) if out is None else out)

    def noise_words(self, numel: int) -> int:
        """How many int64 words of noise a mask of ``numel`` elements draws."""
        per_word = 64 // self.bits
        return (numel + per_word - 1) // per_word

    def _noise(self, x: torch.Tensor, words: torch.Tensor | None = None, drawn: bool = False) -> torch.Tensor:
        """Signed integer noise of ``x``'s shape, drawn in ``x``'s memory order (contiguous or channels-last,
        so the mask needs no layout change; under ``vmap``: in its logical order, :func:`_stored_channels_last`);
        into ``words`` when given."""
        n = x.numel()
        channels_last = _stored_channels_last(x)
        flat = x.permute(0, 2, 3, 1).reshape(-1) if channels_last else x.reshape(-1)  # views, no copies
        # empty_like of a slice stays batched under vmap, so each client gets its own draw
        if words is None:
            words = torch.empty_like(flat[: self.noise_words(n)], dtype=torch.int64)
        if not drawn:
            words = words.random_(-(2**63), None)
        if _vmap_can_view_dtype():
            noise = words.view(torch.int8 if self.bits == 8 else torch.int16)[:n]
        else:
            noise = split_words(words, self.bits)[:n]
        if channels_last:
            b, c, h, w = x.shape
            return noise.view(b, h, w, c).permute(0, 3, 1, 2)
        return noise.view_as(x)

    def extra_repr(self) -> str:
        return f"p={self.p}"
