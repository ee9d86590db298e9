"""The runs of a sweep file read with its backbone's weights replaced (``model.weights``, with the hash check and
origin that name that file dropped): how the backbone scripts read a table's sweep before its weights file exists
(benchmarks/pretrain_backbone.py) or to probe another backbone on its streams (benchmarks/probe_backbone.py); and
one config per distinct stream of those runs (one per seed)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cfl.app.sweep import load_sweep  # noqa: E402
from cfl.config.yaml_files import read_yaml  # noqa: E402


def sweep_configs(path: Path, weights: str | None = None) -> list[Any]:
    """Every run's config of sweep ``path``; ``weights`` given: the base's ``model.weights`` replaced by it (the
    sweep is read from a copy beside it, so its relative paths resolve as the original's)."""
    data = read_yaml(path)
    if weights is not None:
        model = data.setdefault("base", {}).setdefault("model", {})
        model["weights"] = weights
        for key in ("weights_sha256", "weights_origin"):
            model.pop(key, None)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=path.parent) as copy:
        copy.write(yaml.safe_dump(data, sort_keys=False))
        copy.flush()
        return [run.config for run in load_sweep(copy.name)]


def per_stream(configs: list[Any]) -> list[Any]:
    """The first config of each distinct stream (``Config.stream_fields``), in the sweep's order."""
    first: dict[str, Any] = {}
    for cfg in configs:
        first.setdefault(json.dumps(cfg.stream_fields(), sort_keys=True, default=str), cfg)
    return list(first.values())
