"""Bit for bit across two checkouts: the same configs run at both, their results.json compared to the last digit.

    python benchmarks/bit_for_bit.py --base DIR --branch DIR --out DIR  RUN [RUN ...]
    RUN:  CONFIG.yaml[::KEY=VALUE,KEY=VALUE...]       (e.g. configs/quickstart.yaml::method.name=ewc)
          record:PATH/results.json                     (a committed record's own resolved config)

Each run is made with ``python -m cfl run`` in each checkout (its own ``cfl`` on ``PYTHONPATH``, one thread), into
``OUT/base/<i>`` and ``OUT/branch/<i>``; the two results.json must be equal after dropping what measures the
machine and not the run (wall and train seconds, the record's provenance, the rounds a run was resumed after); of
``engine_path`` the path taken is compared, and a reason that reads differently (its prose names hooks) is said.
A record's config is written out from its results.json as today's cfl reads it (:func:`record_config`: keys added
since at the values it ran with, adapter keys its model does not read left out). ``--only-base`` makes the base's runs
alone, ``--reuse-base`` then compares a branch against them (the same OUT and RUN list); ``--reuse-branch`` takes the
branch's too (runs made by another call, e.g. two ``--only-base`` calls in parallel, one per checkout, whose
``OUT/base`` of the branch is moved to ``OUT/branch``): the comparison alone. Prints one line per run and
exits 1 if any differ (the differing keys named).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from cfl.config.adapter_keys import ADAPTER_KEYS
from cfl.pretrained.backbones import is_backbone
from cfl.records.saved_configs import unread_model_keys, with_added_keys

#: keys that measure the machine or the moment, not the run (``resumed_after_rounds``: where a run was resumed,
#: which a resumed run and an uninterrupted one differ in while every number agrees)
TIMING_KEYS = {"wall_seconds", "train_seconds", "task_end_seconds", "record", "wandb_run_id", "seconds",
               "resumed_after_rounds"}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_KEYS and "seconds" not in k}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _path_only(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` with ``engine_path`` reduced to the path taken: its ``reason`` is prose naming the hooks (said apart
    by :func:`reason_differs`)."""
    path = results.get("engine_path")
    return {**results, "engine_path": path.get("path")} if isinstance(path, dict) else results


def reason_differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether the engine path's stated reason reads differently (the same path taken)."""
    return (a.get("engine_path") or {}).get("reason") != (b.get("engine_path") or {}).get("reason")


def _without(results: dict[str, Any], dotted: str) -> dict[str, Any]:
    """``results`` less the key at the dotted path (``config.schedule.forgetting``), where it is."""
    head, _, rest = dotted.partition(".")
    if head not in results:
        return results
    if not rest:
        return {k: v for k, v in results.items() if k != head}
    inner = results[head]
    return {**results, head: _without(inner, rest)} if isinstance(inner, dict) else results


def differing_keys(a: dict[str, Any], b: dict[str, Any], allowed: tuple[str, ...] = ()) -> list[str]:
    """Top-level keys whose values differ once the timing keys are dropped (``engine_path``: the path taken), and the
    ``allowed`` dotted keys (a key the change adds or rewords on purpose, named by the caller)."""
    for key in allowed:
        a, b = _without(a, key), _without(b, key)
    a, b = _strip(_path_only(a)), _strip(_path_only(b))
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def record_config(saved: dict[str, Any]) -> dict[str, Any]:
    """A record's config as today's cfl reads it: the keys added since it ran at the values it ran with
    (cfl/records/saved_configs.py), and the model adapter keys its model does not read left out (an older cfl
    saved them at their resolved values; they change nothing, and today they are refused)."""
    config = with_added_keys({k: v for k, v in saved.items() if k != "out"})
    model = config.get("model")
    if isinstance(model, dict):
        unread = unread_model_keys({"model.train": model.get("train")}) if is_backbone(model.get("name")) else \
            {f"model.{k}" for keys in ADAPTER_KEYS.values() for k in keys}
        config["model"] = {k: v for k, v in model.items() if f"model.{k}" not in unread}
    return config


def _config_args(run: str, out: Path) -> list[str]:
    if run.startswith("record:"):
        config = record_config(json.loads(Path(run[len("record:"):]).read_text())["config"])
        path = out / "config.from-record.yaml"
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return [str(path.resolve())]
    config, _, sets = run.partition("::")
    args = [str(Path(config).resolve())]
    for item in filter(None, sets.split(",")):
        args += ["--set", item]
    return args


def run_at(checkout: Path, run: str, out: Path, reuse: bool = False) -> dict[str, Any]:
    """``run`` made at ``checkout`` into ``out`` (``reuse``: the results.json an earlier call left there, if any)."""
    if reuse and (out / "run" / "results.json").is_file():
        return json.loads((out / "run" / "results.json").read_text())
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "cfl", "run", *_config_args(run, out), "--out", str(out / "run"), "--overwrite",
           "--set", "wandb.mode=disabled"]
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{run} at {checkout}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads((out / "run" / "results.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--branch", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reuse-base", action="store_true",
                        help="take the base's results.json that an earlier call left under OUT/base (the base's "
                             "checkout unchanged), so a base run is made once for several branches")
    parser.add_argument("--reuse-branch", action="store_true",
                        help="take the branch's results.json left under OUT/branch as well (compare only)")
    parser.add_argument("--only-base", action="store_true", help="make the base's runs only (for a later --reuse-base)")
    parser.add_argument("--allow", action="append", default=[], metavar="DOTTED.KEY",
                        help="leave this key out of the comparison (a config key the change adds with its default, "
                             "a provenance field such as backbone.features.source); each is named in the output")
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args(argv)
    failed = 0
    for i, run in enumerate(args.runs):
        base = run_at(args.base.resolve(), run, args.out / "base" / str(i), args.reuse_base)
        if args.only_base:
            print(f"base  {run}  ACC {base.get('acc')}", flush=True)
            continue
        branch = run_at(args.branch.resolve(), run, args.out / "branch" / str(i), args.reuse_branch)
        keys = differing_keys(base, branch, tuple(args.allow))
        failed += bool(keys)
        print(f"{'DIFFERS' if keys else 'same'}  {run}  ACC {base.get('acc')} / {branch.get('acc')}"
              + (f"  keys: {', '.join(keys)}" if keys else "")
              + ("  (engine_path.reason reads differently)" if reason_differs(base, branch) else ""), flush=True)
    if not args.only_base:
        print(f"{len(args.runs) - failed} of {len(args.runs)} runs bit for bit"
              + (f" (left out: {', '.join(args.allow)})" if args.allow else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
