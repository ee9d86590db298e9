"""Sweeps: a base config plus a grid of dotted keys, one run directory per combination.

A sweep file::

    base: configs/quickstart.yaml        # a path (relative to the sweep file) or an inline mapping
    out: runs/sweep                      # where the run directories go (default: runs/<sweep file stem>)
    set: {rounds_per_task: 10}           # optional overrides applied to every run
    grid:
      method.name: [fedavg, fedprox]
      seed: [0, 1, 2]
      # or keys set together, one run directory per label:
      # variant: [{label: gma, aggregator.name: gma}, {label: fot, method: {name: fot, eps: 0.96}}]

Every combination is validated before the first run starts; runs whose ``results.json`` is complete
are skipped, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfl.config import Config, ConfigError, _set_dotted, from_dict, read_yaml


@dataclass(frozen=True)
class SweepRun:
    name: str
    config: Config
    out: Path


def _slug(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_") or "x"


def _variant_items(value: Any, path: Path) -> list[tuple[str, Any]]:
    """A ``variant`` grid entry: several dotted keys set together, named by its ``label``."""
    if not isinstance(value, dict) or "label" not in value:
        raise ConfigError(f"each 'variant' in '{path}' must be a mapping with a 'label' and dotted keys, got {value!r}")
    return [(k, v) for k, v in value.items() if k != "label"]


def _name_part(key: str, value: Any) -> str:
    if key == "variant":
        return _slug(value["label"])
    short = key.split(".")[-2] if key.endswith(".name") else key.split(".")[-1]
    return f"{short}={_slug(value)}"


def load_sweep(path: str | Path, out: str | Path | None = None) -> list[SweepRun]:
    path = Path(path)
    spec = read_yaml(path)
    unknown = set(spec) - {"base", "grid", "out", "set"}
    if unknown:
        raise ConfigError(f"unknown sweep key(s) {sorted(unknown)} in '{path}'; allowed: base, grid, out, set")
    base = spec.get("base", {})
    if isinstance(base, str):
        base_path = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        if not base_path.is_file() and Path(base).is_file():
            base_path = Path(base)
        base = read_yaml(base_path)
    if not isinstance(base, dict):
        raise ConfigError(f"sweep 'base' in '{path}' must be a config path or a mapping")
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(f"sweep 'grid' in '{path}' must map dotted keys to non-empty lists of values")
    fixed = spec.get("set") or {}
    if not isinstance(fixed, dict):
        raise ConfigError(f"sweep 'set' in '{path}' must be a mapping of dotted keys to values")
    root = Path(out or spec.get("out") or Path("runs") / path.stem)
    runs = []
    keys = list(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        data = json.loads(json.dumps(base))
        settings = list(fixed.items())
        for key, value in zip(keys, values, strict=True):
            settings.extend(_variant_items(value, path) if key == "variant" else [(key, value)])
        for key, value in settings:
            _set_dotted(data, key, value)
        name = "__".join(_name_part(k, v) for k, v in zip(keys, values, strict=True)) or "run"
        try:
            cfg = from_dict(data)
        except ConfigError as err:
            raise ConfigError(f"sweep combination {name}: {err}") from None
        runs.append(SweepRun(name, cfg, root / name))
    return runs


def is_complete(run_dir: Path) -> bool:
    results = run_dir / "results.json"
    if not results.is_file():
        return False
    try:
        return bool(json.loads(results.read_text()).get("complete"))
    except (OSError, json.JSONDecodeError):
        return False


def run_local(runs: list[SweepRun], quiet: bool = True) -> list[dict[str, Any]]:
    """Run every incomplete combination one after another in this process."""
    from cfl.run import execute

    finished = []
    for i, run in enumerate(runs, 1):
        if is_complete(run.out):
            print(f"[{i}/{len(runs)}] {run.name}: already complete, skipped", flush=True)
            continue
        results = execute(run.config, run.out, overwrite=True, quiet=quiet)
        finished.append(results)
        print(f"[{i}/{len(runs)}] {run.name}: ACC {results['acc']:.2f}  FGT {results['fgt']:.2f}  "
              f"({results['wall_seconds']:.0f}s)", flush=True)
    return finished
