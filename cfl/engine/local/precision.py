"""Mixed precision training: bfloat16 matrix products over float32 master weights (``precision: bf16-mixed``).

Mixed precision (Micikevicius et al., 2018, "Mixed Precision Training", with bfloat16 as in Kalamkar et al.,
2019): the forward's and backward's matrix products and convolutions take bfloat16 operands and accumulate
in float32; the weights they read are bfloat16 copies of float32 master weights, and every step lands on
the float32 masters (a bfloat16 weight would drop any step below 2**-8 of its size). Losses and softmax,
penalties, the SGD step, aggregation, the methods' server-side algebra (GPSE, GPM, SVD) and every metric
stay float32. bfloat16 keeps float32's exponent range, so no loss scaling is needed.

- vmap and sequential trainers: the model's forward runs under :func:`autocast`: torch's own cast lists
  (products in bfloat16), and the linear layers and convolutions cast their operands to bfloat16
  explicitly (:class:`LowProducts`), since under ``vmap`` autocast does not reach a convolution; the
  logits come back as float32 for the loss.
- stacked trainer (:mod:`cfl.engine.local.stacked_net`): its hand-written products cast through
  :class:`Bf16Weights`, whose buffers a kept workspace holds across rounds; each step updates the float32
  weight and writes its bfloat16 copy in one compiled pass (:mod:`cfl.engine.local.bf16_step`).

Where bfloat16 products are no faster than float32 ones bf16-mixed still trains, but slower than float32, and
:func:`warn_if_slow` says so, with the figures, once per process and device: on a CPU it decides from measured
product rates (:mod:`cfl.engine.local.bf16_probe`), since flags do not settle it (a Xeon with ``avx512_bf16`` and no
AMX ran bfloat16 products at half float32's rate); on a GPU from ``torch.cuda.is_bf16_supported()``.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from cfl.config.precision import is_mixed
from cfl.engine.local import bf16_probe
from cfl.engine.local.bf16_step import step_cast
from cfl.engine.local.cpuinfo import cpu_flags

LOW = torch.bfloat16

#: /proc/cpuinfo flags of CPUs with bfloat16 products in hardware (x86: AVX-512 BF16, AMX; Arm: BF16)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


#: the layers' products whose operands bf16-mixed casts to bfloat16 itself, ahead of autocast: under ``vmap``
#: torch's autocast never sees a convolution (the batching rule turns ``conv2d`` into ``aten.convolution``,
#: which is on no CPU cast list), so the vmap path would convolve in float32
LOW_PRODUCTS = frozenset({F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d,
                          F.conv_transpose3d})


def _low(value: Any) -> Any:
    return value.to(LOW) if isinstance(value, torch.Tensor) and value.dtype == torch.float32 else value


class LowProducts(TorchFunctionMode):
    """Calls of :data:`LOW_PRODUCTS` take their float32 tensor operands as bfloat16 (what autocast does to
    them where it reaches them: the same products, bit for bit); every other call passes unchanged."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in LOW_PRODUCTS:
            args, kwargs = tuple(_low(a) for a in args), {k: _low(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


@contextlib.contextmanager
def autocast(precision: int | str, device: torch.device) -> Iterator[None]:
    """In bf16-mixed, torch's autocast to bfloat16 on ``device`` with the layers' products cast explicitly
    (:class:`LowProducts`, which autocast misses under ``vmap``); nothing in float32."""
    if not is_mixed(precision):
        yield
        return
    with torch.autocast(device.type, dtype=LOW), LowProducts():
        yield


def to_float(t: torch.Tensor) -> torch.Tensor:
    """``t`` as float32 when it came out of a bfloat16 product (logits before the loss), else ``t``."""
    return t.float() if t.dtype == LOW else t


def has_bf16_units(device: torch.device) -> bool | None:
    """Whether ``device`` multiplies bfloat16 in hardware by its flags (None: cannot tell). On a CPU the flags
    are only a hint (see :mod:`cfl.engine.local.bf16_probe`); :func:`warn_if_slow` decides from measured rates."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    flags = cpu_flags()
    if flags is None:
        return None
    return any(f in flags for f in BF16_CPU_FLAGS)


_warned: set[str] = set()


def warn_if_slow(precision: int | str, device: torch.device) -> None:
    """Warn once per device type when bf16-mixed will run slower than float32: on a CPU whose measured
    bfloat16 product rate is no better than its float32 one (:mod:`cfl.engine.local.bf16_probe`: a probe of tens
    of milliseconds, cached per machine), on a GPU for which ``torch.cuda.is_bf16_supported()`` is false."""
    if not is_mixed(precision) or device.type in _warned:
        return
    _warned.add(device.type)
    why = slow_reason(device)
    if why is not None:
        warnings.warn(why, RuntimeWarning, stacklevel=3)


def slow_reason(device: torch.device) -> str | None:
    """Why bf16-mixed will be slower than float32 on ``device``, with the figures, or None."""
    if device.type == "cuda":
        if _units("cuda"):
            return None
        return ("precision: bf16-mixed on cuda: torch.cuda.is_bf16_supported() is false; torch then emulates the "
                "bfloat16 products and the run will be slower than with precision: 32 (the results are still "
                "bf16-mixed's)")
    if device.type != "cpu":
        return None
    probe = bf16_probe.probed_rates()
    if not bf16_probe.bf16_slower(probe.rates):
        return None
    return slow_cpu_message(probe)


def slow_cpu_message(probe: bf16_probe.ProbeResult) -> str:
    """The warning for a CPU whose bfloat16 products measured no faster than its float32 ones."""
    rates, flags = probe.rates, cpu_flags()
    listed = "unreadable" if flags is None else ", ".join(f for f in BF16_CPU_FLAGS if f in flags) or "none"
    return (f"precision: bf16-mixed will be SLOWER than precision: 32 on this CPU: bfloat16 matrix products "
            f"measured {rates.bf16_gflops:.1f} GFLOP/s against {rates.fp32_gflops:.1f} GFLOP/s in float32 "
            f"({rates.ratio:.2f}x; {probe.key}; bfloat16 CPU flags: {listed}; {probe.source}). "
            "For speed set precision: 32 (--set precision=32); bf16-mixed's results stay its own, only slower")


@functools.cache
def _units(device_type: str) -> bool | None:
    return has_bf16_units(torch.device(device_type))


class Bf16Weights:
    """bfloat16 copies of stacked float32 weights, and the float32 step from a bfloat16 product, in buffers
    kept in ``workspace`` (a dict the caller keeps across rounds: no fresh pages each step).

    A buffer is sized for the most clients it has served; a step of fewer clients (a prefix of the stack)
    uses a prefix of it. A step writes the stepped weight's bfloat16 copy too (:mod:`cfl.engine.local.bf16_step`),
    which the next :meth:`cast` of that weight returns as it is, unless the weight changed since.
    """

    def __init__(self, workspace: dict[str, torch.Tensor]) -> None:
        self.workspace = workspace
        #: per key, the weight whose copy a step wrote: (data_ptr, clients, trailing shape, version), and
        #: the copy's version; a weight of that storage, at most that many clients and unchanged, has it
        self._fresh: dict[str, tuple[tuple[int, int, torch.Size, int], int]] = {}

    def _buffer(self, key: str, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        buf = self.workspace.get(key)
        if buf is None or buf.shape[1:] != like.shape[1:] or buf.shape[0] < like.shape[0] or buf.dtype != dtype \
                or buf.device != like.device:
            buf = self.workspace[key] = torch.empty(like.shape, dtype=dtype, device=like.device)
        return buf[: like.shape[0]]

    def cast(self, key: str, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` (float32, contiguous) rounded to bfloat16, in the buffer ``key``: copied, unless the last
        :meth:`step` of ``key`` wrote it and neither the weight nor the copy changed since."""
        buf = self._buffer(f"bf16:{key}", weight, LOW)
        fresh = self._fresh.pop(key, None)
        if fresh is not None:
            (ptr, clients, trailing, version), copy_version = fresh
            if weight.data_ptr() == ptr and weight.shape[0] <= clients and weight.shape[1:] == trailing \
                    and weight._version == version and buf._version == copy_version:
                self._fresh[key] = fresh
                return buf
        return buf.copy_(weight)

    def step(self, key: str, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, decay: float,
             alpha: float) -> None:
        """``weight <- decay * weight + alpha * a @ b`` in place on the float32 ``weight`` (what
        ``weight.baddbmm_(a, b, beta=decay, alpha=alpha)`` does in float32), and its bfloat16 copy for the
        next :meth:`cast`. The product is taken from bfloat16 ``a``, ``b`` with float32 accumulation as
        ``scale * a @ b`` and rounded once to bfloat16; the step is float32 master-weight math on it:
        ``decay * w + (1 - decay) * product`` with ``scale = alpha / (1 - decay)`` (decay folded into the
        product), or ``decay * w + product`` with ``scale = alpha`` where ``1 - decay`` is 0 or below 1e-8.
        One compiled pass (:func:`cfl.engine.local.bf16_step.step_cast`) writes the weight and its copy; where it
        cannot be compiled, eager passes (the product into a float32 buffer, ``lerp_``; the next
        :meth:`cast` copies), equal to float32 rounding."""
        low = self._buffer(f"bf16-grad:{key}", weight, LOW)
        fold = decay != 1.0 and 1.0 - decay >= 1e-8  # smaller: alpha / (1 - decay) could overflow
        scale = alpha / (1.0 - decay) if fold else alpha
        torch.baddbmm(low, a, b, beta=0.0, alpha=scale, out=low)
        self._fresh.pop(key, None)
        copy = self._buffer(f"bf16:{key}", weight, LOW)
        if step_cast(weight, low, copy, decay, 1.0 - decay if fold else 1.0):
            self._fresh[key] = ((weight.data_ptr(), weight.shape[0], weight.shape[1:], weight._version),
                                copy._version)
            return
        full = self._buffer(f"bf16-grad-full:{key}", weight, weight.dtype).copy_(low)
        if fold:  # decay * w + (1 - decay) * (alpha / (1 - decay)) * ab: one pass
            weight.lerp_(full, 1.0 - decay)
        else:
            weight.mul_(decay).add_(full) if decay != 1.0 else weight.add_(full)
