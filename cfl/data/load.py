"""Resolve the data root and build the configured stream (tensors on the run's device)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from cfl.config.schema import ConfigError
from cfl.data.class_subset import subset_per_class
from cfl.data.fingerprint import fingerprint
from cfl.data.request import StreamRequest
from cfl.data.stream import Stream
from cfl.data.stream_checks import check_stream
from cfl.data.stream_registry import STREAMS


def root_dir(data_root: str | None) -> Path:
    """The config's ``data_root``, else ``$CFL_DATA``, else the per-user cache (~/.cache/cfl); refused when it
    exists but is not a directory (a file given by mistake)."""
    if data_root:
        root, source = Path(data_root).expanduser(), "config key 'data_root'"
    elif os.environ.get("CFL_DATA"):
        root, source = Path(os.environ["CFL_DATA"]).expanduser(), "$CFL_DATA"
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root, source = Path(cache) / "cfl", "the user cache ($XDG_CACHE_HOME or ~/.cache, then cfl)"
    if root.exists() and not root.is_dir():
        raise ConfigError(f"the data root {root} (from {source}) is a file, not a directory; point data_root "
                          f"(--set data_root=DIR) or $CFL_DATA at the folder holding the datasets (docs/data.md)")
    return root


def load_stream(name: str, *, num_tasks: int | None, scenario: str, seed: int, data_root: str | None,
                download: bool, benchmark: str | None = None, args: dict[str, Any] | None = None,
                train_per_class: int | None = None, test_per_class: int | None = None,
                device: torch.device | str = "cpu") -> Stream:
    """Build registered stream ``name`` (the config's stream fields: ``Config.stream_fields()``): its first
    ``num_tasks`` tasks (None: all) under ``scenario`` (``auto``: the stream's default), checked against its
    registration and by :func:`cfl.data.stream_checks.check_stream`, cut to ``train_per_class`` /
    ``test_per_class`` samples of each class (:mod:`cfl.data.class_subset`; None: all), fingerprinted, then moved
    to ``device``."""
    from cfl.data.avalanche_route import ROUTE, converted, entry_of

    if name == ROUTE:  # stream.name: avalanche: the benchmark converted at validation (kept per process)
        entry = entry_of(converted(str(benchmark), dict(args or {}), scenario))
    else:
        entry = STREAMS[name]
    request = StreamRequest(
        num_tasks=num_tasks or entry.full_tasks,
        scenario=entry.scenarios[0] if scenario == "auto" else scenario,
        seed=seed,
        data_root=root_dir(data_root),
        download=download,
    )
    stream = entry.build(request)
    check_built(name, stream, request, entry.input_shape)
    check_stream(stream)  # dtypes, finiteness, label ranges: before any run file is written
    if train_per_class is not None or test_per_class is not None:
        subset_per_class(stream, train_per_class, test_per_class, seed)
    fingerprint(stream)  # on the CPU tensors, before they move to the device
    for task in stream.tasks:
        task.train_x, task.train_y = task.train_x.to(device), task.train_y.to(device)
        task.test_x, task.test_y = task.test_x.to(device), task.test_y.to(device)
    return stream


def check_built(name: str, stream: object, request: StreamRequest, input_shape: tuple[int, ...]) -> None:
    """Refuse a builder's result that is not what its registry entry promised (a registered stream)."""
    problem = None
    if not isinstance(stream, Stream):
        problem = f"returned {type(stream).__name__}, not a cfl Stream"
    elif stream.num_tasks != request.num_tasks:
        problem = f"returned {stream.num_tasks} tasks for num_tasks {request.num_tasks}"
    elif stream.scenario != request.scenario:
        problem = f"returned a {stream.scenario}-incremental stream for scenario {request.scenario}"
    elif tuple(stream.input_shape) != tuple(input_shape) or tuple(stream.tasks[0].train_x.shape[1:]) != input_shape:
        problem = (f"returned inputs of shape {tuple(stream.tasks[0].train_x.shape[1:])} (input_shape "
                   f"{tuple(stream.input_shape)}), registered as {input_shape}")
    if problem:
        raise ConfigError(f"stream '{name}': its builder {problem}; fix the builder or its registration")
