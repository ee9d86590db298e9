"""One run per seed in a group: runs of one config with one seed (e.g. from two sweeps over the same grid) are
the same experiment, not more seeds. Counting them twice would shrink the standard deviation (pseudo-replication).

Duplicates whose results agree (the keys in :data:`OUTCOME_KEYS`, exactly) count once: the first by directory
is kept and the others are named on stderr. Duplicates whose results differ are refused (exit 2): which of them
is right is for the user to say (remove one, or report the directories apart), not for the table to pick.
Timings (``wall_seconds`` ...) are not compared: they differ between any two runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from cfl.config.keys import ConfigError

#: the results a run of a config and a seed must reproduce; duplicates that differ in any of them are refused
OUTCOME_KEYS = ("acc_matrix", "acc", "fgt", "bwt", "aia", "fwt", "class_acc", "rounds_to_target", "upload_bytes",
                "download_bytes", "rounds")


class SeededRun(Protocol):
    @property
    def seed(self) -> int: ...
    @property
    def dir(self) -> Path: ...
    @property
    def results(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=SeededRun)


def differing_outcomes(runs: Sequence[SeededRun]) -> list[str]:
    """The :data:`OUTCOME_KEYS` whose values are not the same in all ``runs``."""
    return [k for k in OUTCOME_KEYS if len({json.dumps(r.results.get(k), sort_keys=True) for r in runs}) > 1]


def one_per_seed(runs: Sequence[R], name: str) -> list[R]:
    """The first run of each seed in ``runs`` (in their order); the others named on stderr, or ConfigError when
    their results differ. ``name`` names the group in the messages."""
    by_seed: dict[int, list[R]] = {}
    for run in runs:
        by_seed.setdefault(run.seed, []).append(run)
    for seed, same in by_seed.items():
        if len(same) < 2:
            continue
        dirs = ", ".join(str(r.dir) for r in same)
        differ = differing_outcomes(same)
        if differ:
            raise ConfigError(f"{name}: seed {seed} has {len(same)} runs of the same config whose results differ "
                              f"({', '.join(differ)}): {dirs}; a seed counts once, so say which is right: remove "
                              f"the others or report their directories apart")
        print(f"cfl: warning: {name}: seed {seed} has {len(same)} runs of the same config with the same results "
              f"({dirs}); counted once (kept {same[0].dir})", file=sys.stderr)
    return [same[0] for same in by_seed.values()]
