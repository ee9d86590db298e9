"""bf16-mixed's master-weight step, compiled pass against eager passes (docs/performance.md, "Mixed precision").

For one fused layer's stack (default the Permuted-MNIST MLP's first layer at 64 clients: 64 x 400 x 784
weights, batch 64), times a step and the next forward's cast: :meth:`cfl.engine.local.precision.Bf16Weights.step`
then ``cast``, with the compiled pass (:mod:`cfl.engine.local.bf16_step`) and with the eager passes, their repeats
interleaved so that both see the same load, and the elementwise part alone (the step and cast without the
product). Also the first call's time, which compiles the pass (Inductor's on-disk cache makes a later
process's first call shorter; ``TORCHINDUCTOR_CACHE_DIR`` set to an empty folder times a cold compile).
Prints a JSON object.

    python benchmarks/bf16_step.py [--clients 64] [--shape 400 784] [--batch 64] [--threads 2] [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from cfl.engine.local import bf16_step
from cfl.engine.local.precision import Bf16Weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--shape", type=int, nargs=2, default=[400, 784], metavar=("OUT", "IN"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    (rows, cols), c = args.shape, args.clients
    w = torch.randn(c, rows, cols)
    a = torch.randn(c, rows, args.batch).bfloat16()
    b = torch.randn(c, args.batch, cols).bfloat16()
    kernels = dict(bf16_step._kernels)

    start = time.perf_counter()
    fused = Bf16Weights({})
    fused.step("fc", w, a, b, 0.999, -1e-3)
    first_call = time.perf_counter() - start
    kernel = bf16_step._kernels.get(w.device.type)
    eager = Bf16Weights({})

    def timed(weights: Bf16Weights, eager_passes: bool) -> tuple[float, float]:
        bf16_step._kernels[w.device.type] = None if eager_passes else kernel
        t0 = time.perf_counter()
        weights.step("fc", w, a, b, 0.999, -1e-3)
        weights.cast("fc", w)
        t1 = time.perf_counter()
        low, copy = weights.workspace["bf16-grad:fc"], weights.workspace["bf16:fc"]
        if eager_passes:  # what the eager step does after its product
            weights.workspace["bf16-grad-full:fc"].copy_(low)
            w.lerp_(weights.workspace["bf16-grad-full:fc"], 1e-3)
            copy.copy_(w)
        else:
            bf16_step.step_cast(w, low, copy, 0.999, 1e-3)
        return t1 - t0, time.perf_counter() - t1

    timed(eager, True)  # warm-up: the eager buffers' first pages
    times = {"fused": [], "eager": []}
    for _ in range(args.repeats):
        times["fused"].append(timed(fused, False))
        times["eager"].append(timed(eager, True))
    bf16_step._kernels.clear()
    bf16_step._kernels.update(kernels)

    def ms(name: str, i: int) -> float:
        return round(1e3 * sorted(t[i] for t in times[name])[len(times[name]) // 2], 2)

    print(json.dumps({
        "torch": torch.__version__, "threads": args.threads, "weights": [c, rows, cols], "batch": args.batch,
        "compiled": kernel is not None, "first_call_sec": round(first_call, 3),
        "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "fused_step_and_cast_ms": ms("fused", 0), "eager_step_and_cast_ms": ms("eager", 0),
        "fused_elementwise_ms": ms("fused", 1), "eager_elementwise_ms": ms("eager", 1),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
