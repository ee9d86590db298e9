"""What a stream builder is asked for (:class:`StreamRequest`): the built-in builders
(cfl/data/stream_registry.py, cfl/data/benchmarks.py) and a user's registered ones take it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StreamRequest:
    """What a builder gets: prefix length, scenario, permutation seed, data location."""

    num_tasks: int
    scenario: str
    seed: int
    data_root: Path
    download: bool
