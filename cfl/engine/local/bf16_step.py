"""bf16-mixed's float32 master-weight step and the weight's bfloat16 copy in one pass (``Bf16Weights.step``).

Mixed precision keeps float32 master weights and multiplies bfloat16 copies of them (Micikevicius et al.,
2018). After a step's bfloat16 weight-gradient product ``low``, one elementwise pass reads the float32
weight and ``low`` and writes both the stepped weight and its bfloat16 copy for the next forward::

    w <- p * w + q * float(low);   copy <- bfloat16(w)

(12 bytes a weight), where eager torch takes three passes (``low`` into a float32 buffer, ``lerp_``, the
next forward's cast: 24 bytes a weight) and its mixed-dtype ``add_`` is not vectorised. The pass is
compiled by ``torch.compile`` (Inductor) on flat 1-D views with dynamic shapes: one compilation per
process and device type serves every layer and client count. It is checked once against the eager
formula on a small tensor before it is used.

Where it cannot be compiled (no C++ compiler, ``torch.compile`` raises or is disabled, the check fails)
:func:`step_cast` returns False and the caller takes the eager passes; a warning says so and why, once per
device type.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator

import torch

#: per device type: the compiled pass, or None where it could not be compiled (the eager passes run)
_kernels: dict[str, Callable | None] = {}


def _step_cast(w: torch.Tensor, low: torch.Tensor, copy: torch.Tensor, p: float, q: float) -> None:
    """``w <- p * w + q * low`` in float32 and ``copy <- bfloat16(w)``, in place (what Inductor compiles)."""
    new = w * p + low.float() * q
    w.copy_(new)
    copy.copy_(new)


def step_cast(weight: torch.Tensor, low: torch.Tensor, copy: torch.Tensor, p: float, q: float) -> bool:
    """``weight <- p * weight + q * low`` (float32 ``weight``, bfloat16 ``low``) and ``copy <-
    bfloat16(weight)`` in one compiled pass; all three contiguous and of one shape. False (nothing
    written): no compiled pass on this device, the caller takes the eager passes."""
    kernel = _kernel(weight.device)
    if kernel is None:
        return False
    with torch.no_grad():
        kernel(weight.view(-1), low.view(-1), copy.view(-1), p, q)
    return True


def _kernel(device: torch.device) -> Callable | None:
    """The compiled pass for ``device`` (compiled and checked on first use), or None with one warning."""
    if device.type in _kernels:
        return _kernels[device.type]
    kernel: Callable | None = None
    try:
        why = _refusal()
        if why is None:
            with _quiet_cuda_home():
                compiled = torch.compile(_step_cast, dynamic=True, fullgraph=True)
                why = _check(compiled, device)
            kernel = compiled if why is None else None
    except Exception as e:  # noqa: BLE001 - any compiler failure means the eager passes, said below
        why = f"torch.compile raised {_first_line(e)}"
    _kernels[device.type] = kernel
    if kernel is None:
        warnings.warn(f"precision: bf16-mixed on {device.type}: the fused float32 step and bfloat16 copy could not "
                      f"be compiled ({why}); the step runs as eager passes (about twice the memory traffic: slower, "
                      "the same numerics up to float32 rounding)", RuntimeWarning, stacklevel=2)
    return kernel


@contextlib.contextmanager
def _quiet_cuda_home() -> Iterator[None]:
    """Without torch's "No CUDA runtime is found, using CUDA_HOME=..." line, which a CUDA build of torch logs
    when Inductor first imports ``torch.utils.cpp_extension`` on a machine without a GPU: the pass compiles
    for the CPU and needs no CUDA."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _first_line(e: BaseException) -> str:
    """``Type: first line`` of ``e``, and of the error inside it where it wraps one (Inductor's
    ``BackendCompilerFailed`` says only which backend raised on its first line), at most 300 characters."""
    inner = getattr(e, "inner_exception", None) or e.__cause__
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    if inner is not None and inner is not e:
        text += f" ({_first_line(inner)})"
    return text[:300]


def _refusal() -> str | None:
    """Why torch.compile would run ``_step_cast`` eagerly here (None: it compiles): disabled, or no Dynamo."""
    import torch._dynamo  # here: importing it costs every process, bf16-mixed or not

    if torch._dynamo.config.disable:
        return "torch.compile is disabled (TORCH_COMPILE_DISABLE or torch._dynamo.config.disable)"
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile does not support this Python"
    return None


def _check(kernel: Callable, device: torch.device) -> str | None:
    """Why ``kernel`` cannot be trusted on ``device`` (None: it can): run on a small tensor, its step must
    match the eager formula to float32 rounding and its copy must be the stepped weight rounded to bfloat16."""
    n = 1000  # not 0 or 1, which torch.compile specialises: the compiled graph is the dynamic-shape one
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n, generator=g).to(device)
    low = torch.randn(n, generator=g).to(device, torch.bfloat16)
    copy = torch.empty(n, dtype=torch.bfloat16, device=device)
    expected = w * 0.75 + low.float() * 0.5
    with torch.no_grad():
        kernel(w, low, copy, 0.75, 0.5)
    if not torch.allclose(w, expected, rtol=1e-6, atol=1e-6):
        return f"its step differs from the eager one by {float((w - expected).abs().max()):.3g} on a check"
    if not torch.equal(copy, w.to(torch.bfloat16)):
        return "its bfloat16 copy differs from the stepped weight's on a check"
    return None
