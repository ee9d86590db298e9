"""A change's speed against its base: one benchmark run at two checkouts in turn, base and branch alternated, so
both see the same load; the median of each side's per-round seconds and the median of the pairs' ratios.

    python benchmarks/speed_pairs.py --base DIR --branch DIR [--pairs 5] [--timeout S] -- SCRIPT [ARG ...]
    e.g. ... -- benchmarks/perf_engine.py --method ewc --rounds 3 --naive-rounds 0 --threads 1

``SCRIPT`` (a path inside the checkouts) runs with each checkout's own ``cfl`` on ``PYTHONPATH`` and must print a JSON
object as its last line; the per-round key read is the first of ``engine_sec_per_round`` (benchmarks/perf_engine.py)
and ``cfl_sec_per_round`` (benchmarks/perf_pretrained.py) that it has. Prints one line per pair and a JSON summary
(``ratio`` = branch / base: below 1 the branch is faster); exits 2 naming the key when a run prints none of them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

#: the per-round seconds of the benchmarks this compares, in the order they are looked for
KEYS = ("engine_sec_per_round", "cfl_sec_per_round")


def seconds_per_round(checkout: Path, script: list[str], timeout: float) -> float:
    """One run of ``script`` at ``checkout``: the per-round seconds its last output line reports."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, str(checkout / script[0]), *script[1:]], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"speed_pairs: {script[0]} at {checkout} exited {done.returncode}:\n{done.stderr[-2000:]}")
    last = json.loads(done.stdout.strip().splitlines()[-1])
    for key in KEYS:
        if last.get(key) is not None:
            return float(last[key])
    print(f"speed_pairs: {script[0]} printed none of {list(KEYS)}: give a benchmark that reports one", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--branch", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for one run")
    parser.add_argument("script", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("give the benchmark after --, e.g. -- benchmarks/perf_engine.py --method ewc")
    for checkout in (args.base, args.branch):
        if not (checkout / script[0]).is_file():
            parser.error(f"{checkout / script[0]} does not exist: --base and --branch are checkouts holding it")
    base, branch = [], []
    for i in range(args.pairs):
        first, second = (args.base, args.branch) if i % 2 == 0 else (args.branch, args.base)  # who goes first swaps
        a = seconds_per_round(first, script, args.timeout)
        b = seconds_per_round(second, script, args.timeout)
        base_s, branch_s = (a, b) if first == args.base else (b, a)
        base.append(base_s)
        branch.append(branch_s)
        print(f"pair {i + 1}: base {base_s:.4f} s/round, branch {branch_s:.4f} s/round, ratio {branch_s / base_s:.3f}")
    ratios = [b / a for a, b in zip(base, branch, strict=True)]
    print(json.dumps({"script": " ".join(script), "pairs": args.pairs,
                      "base_median_sec_per_round": round(statistics.median(base), 4),
                      "branch_median_sec_per_round": round(statistics.median(branch), 4),
                      "ratio_median": round(statistics.median(ratios), 3),
                      "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
