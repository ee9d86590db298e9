"""Whether bfloat16 products beat float32 ones on this CPU: a short probe of both rates, cached per machine.

A CPU's flags do not settle it: an Intel Xeon listing ``avx512_bf16`` (no AMX exposed) multiplied 2048 x 2048
matrices at 176 GFLOP/s in bfloat16 against 347 in float32, so bf16-mixed ran 2-3x slower than float32. The
probe times a few batched products of the engine's shapes in both dtypes (tens of milliseconds; the figure
for one machine is in docs/performance.md) and keeps the rates in a JSON file keyed by the CPU model, the
torch version and the thread count: ``$CFL_PROBE_CACHE``, else ``$XDG_CACHE_HOME/cfl/bf16_probe.json``, else
``~/.cache/cfl/bf16_probe.json``. The file is written atomically (a temporary file, then a rename); one that
cannot be read or parsed is measured again and rewritten.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from cfl.engine.local.cpuinfo import cpu_model

#: batched products (count, rows, inner, columns): an MLP layer of 8 clients at batch 64 (784 -> 400), and a
#: convolution as its im2col product (4 clients, 1024 output pixels, 3x3x64 inputs -> 128 channels)
PROBE_SHAPES: tuple[tuple[int, int, int, int], ...] = ((8, 64, 784, 400), (4, 1024, 576, 128))
#: timings per shape and dtype (after one untimed warm-up); the best one counts
REPEATS = 3


@dataclass(frozen=True)
class ProductRates:
    """Measured product rates in GFLOP/s."""

    bf16_gflops: float
    fp32_gflops: float

    @property
    def ratio(self) -> float:
        """bfloat16's rate over float32's: below 1, bf16-mixed's products are slower than float32's."""
        return self.bf16_gflops / self.fp32_gflops

    def as_dict(self) -> dict[str, float]:
        return {"bf16_gflops": round(self.bf16_gflops, 2), "fp32_gflops": round(self.fp32_gflops, 2)}


def bf16_slower(rates: ProductRates) -> bool:
    """Whether bf16-mixed will train slower than float32: its bfloat16 products are no faster than float32's
    (it also casts weights and activations, so equal product rates already make it slower)."""
    return rates.bf16_gflops <= rates.fp32_gflops


def product_rate(dtype: torch.dtype, shapes: tuple[tuple[int, int, int, int], ...] = PROBE_SHAPES,
                 repeats: int = REPEATS) -> float:
    """GFLOP/s of ``torch.bmm`` on CPU in ``dtype`` over ``shapes`` (total work over the sum of best times)."""
    gen = torch.Generator().manual_seed(0)
    flops = seconds = 0.0
    for count, m, k, n in shapes:
        a = torch.randn(count, m, k, generator=gen).to(dtype)
        b = torch.randn(count, k, n, generator=gen).to(dtype)
        out = torch.empty(count, m, n, dtype=dtype)
        torch.bmm(a, b, out=out)  # warm-up: oneDNN's kernel choice and first-touch pages are not timed
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            torch.bmm(a, b, out=out)
            best = min(best, time.perf_counter() - start)
        flops += 2.0 * count * m * k * n
        seconds += max(best, 1e-9)
    return flops / seconds / 1e9


def measure_rates() -> ProductRates:
    """This process's bfloat16 and float32 product rates (at its current thread count)."""
    return ProductRates(product_rate(torch.bfloat16), product_rate(torch.float32))


def machine_key() -> str:
    """What the rates depend on: the CPU model, the torch version and the thread count."""
    return f"{cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def cache_path() -> Path:
    """Where the measured rates are kept (see the module's docstring)."""
    if os.environ.get("CFL_PROBE_CACHE"):
        return Path(os.environ["CFL_PROBE_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cfl" / "bf16_probe.json"


def read_cache(path: Path) -> dict[str, ProductRates] | None:
    """The rates kept in ``path`` per machine key: {} for no file, None for one that cannot be read or parsed
    (or holds anything but positive finite rates): it is then measured again and rewritten."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = {str(key): ProductRates(float(v["bf16_gflops"]), float(v["fp32_gflops"]))
                   for key, v in data.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if not all(math.isfinite(r.bf16_gflops) and math.isfinite(r.fp32_gflops) and r.bf16_gflops > 0
               and r.fp32_gflops > 0 for r in entries.values()):
        return None
    return entries


def write_cache(path: Path, entries: dict[str, ProductRates]) -> None:
    """``entries`` into ``path`` atomically: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps({k: r.as_dict() for k, r in entries.items()}, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class ProbeResult:
    rates: ProductRates
    key: str
    #: where the rates came from, for the message: "cached in <path>", "measured now, cached in <path>", ...
    source: str


def probed_rates(path: Path | None = None, measure: Callable[[], ProductRates] = measure_rates) -> ProbeResult:
    """This machine's rates: from the cache at ``path`` (default :func:`cache_path`), else measured and
    cached. A damaged cache is measured again and rewritten; one that cannot be written is said so in
    ``source`` (the probe then runs in each process)."""
    path = cache_path() if path is None else path
    key = machine_key()
    entries = read_cache(path)
    if entries is not None and key in entries:
        return ProbeResult(entries[key], key, f"cached in {path}; delete it to measure again")
    rates = measure()
    damaged = " (the old file could not be read and was replaced)" if entries is None else ""
    try:
        write_cache(path, {**(entries or {}), key: rates})
    except OSError as err:
        return ProbeResult(rates, key, f"measured now; could not cache them in {path}: {err}")
    return ProbeResult(rates, key, f"measured now, cached in {path}{damaged}")
