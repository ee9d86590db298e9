"""Runs and their groups, for ``cfl report`` tables and comparison figures.

A *group* holds the runs whose resolved configs are equal except for ``seed`` and the result-neutral keys
(``RESUME_SAFE_KEYS`` of :mod:`cfl.records.run_dir`, the keys a resumed run may change: ``threads``,
``checkpoint_every``, ``on_nonfinite``, ``data_root``, ``wandb.*``, ``label``; output paths are not config keys).
Every other key splits groups, ``device``, ``client_execution`` and ``backend`` included: they can change the
last bits of float results; a method parameter left out and the same parameter at its default do not, nor does
``stream.scenario: auto`` against the scenario it resolves to. Labels follow :mod:`cfl.report.labels`: the
stream column names the scenario, the partition column the partition's parameters, and a group's label is its
method label (or its config's ``label``) plus, as ``--set`` style ``key=value``, every method parameter away
from its default and every key that takes more than one value among the groups of its stream, partition and
``label`` that have it (``fedavg lr=0.05`` against ``fedavg lr=0.5``; ``fedprox`` against ``fedavg``, but
``fedprox method.mu=0.1`` against ``fedprox method.mu=0.01``).

A ``results.json`` that cannot be read, lacks a field the reports use, or has no config (neither its
``config`` field nor a ``config.yaml`` beside it) is skipped with a warning naming the file; so is an
incomplete run (stopped before its last task). Runs of one config with one seed count once
(:mod:`cfl.report.duplicates`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cfl.config.keys import ConfigError, ScheduleConfig
from cfl.config.schema import to_dict
from cfl.config.yaml_files import parse_yaml
from cfl.records.run_dir import is_resume_safe
from cfl.records.saved_configs import unread_model_keys, with_added_keys
from cfl.report.duplicates import one_per_seed
from cfl.report.labels import (
    MethodInfo,
    backbone_suffix,
    changed_method_keys,
    partition_label,
    row_label,
    show,
    stream_label,
    with_defaults,
)

TEXT_FIELDS = ("stream", "partition", "method")
NUMBER_FIELDS = ("acc", "fgt")
# In the method label already (cfl.config.keys.Config.method_label) or in a column of their own.
SHOWN_ELSEWHERE = ("stream.name", "stream.scenario", "method.name", "aggregator.name", "loss")


@dataclass(frozen=True)
class Run:
    """One finished run: its ``results.json`` (``path``), that document and its resolved config."""

    path: Path
    results: dict[str, Any]
    config: dict[str, Any]

    @property
    def seed(self) -> int:
        return int(self.results["seed"])

    @property
    def dir(self) -> Path:
        return self.path.parent

    @property
    def method_info(self) -> MethodInfo | None:
        """Its methods' display names and defaults as the run recorded them (None in older results)."""
        info = self.results.get("method_info")
        return info if isinstance(info, dict) else None


@dataclass
class Group:
    """Runs whose configs differ only in ``seed`` and result-neutral keys."""

    stream: str  # with its scenario: ``split-digits (class-IL)`` (cfl.report.labels.stream_label)
    partition: str  # with its parameters: ``dirichlet alpha=0.5`` (cfl.report.labels.partition_label)
    method: str  # the method label: method + plugins (+ aggregator, loss when not the defaults)
    differs: dict[str, Any]  # the keys that tell this group from the others, with this group's values
    runs: list[Run] = field(default_factory=list)
    #: the runs' config ``label`` (a sweep variant's), shown instead of the method label; flagged "(random
    #: backbone)" for an untrained backbone's runs, as their method is (:func:`row_name`)
    name: str | None = None
    recorded: MethodInfo | None = None  # the runs' ``method_info``: display names and defaults of their methods
    #: the seeds where its accuracy matrices equal FedAvg's under the same settings (cfl.report.same_as_fedavg)
    same_as_fedavg: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``method key=value ...``, e.g. ``fedavg lr=0.05`` (``name key=value ...`` for a labelled config)."""
        return row_label(self.method, self.differs, self.name)

    @property
    def seeds(self) -> list[int]:
        return sorted(r.seed for r in self.runs)

    def values(self, key: str) -> list[float]:
        """``results[key]`` of every run that has a finite number there (e.g. ``acc``, ``bwt``)."""
        return [float(r.results[key]) for r in self.runs if is_number(r.results.get(key))]


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def mean_std(values: list[float]) -> tuple[float, float] | None:
    """Mean and sample standard deviation (divisor n - 1; 0 for one value); None for no values."""
    if not values:
        return None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


# ---- loading ----
def find_results(paths: list[str | Path]) -> list[Path]:
    """``results.json`` files in the given run directories (searched recursively) or given directly,
    each once however often (and under whatever name) its directory is given."""
    found: dict[Path, Path] = {}
    for p in map(Path, paths):
        if p.is_file() and p.name == "results.json":
            files = [p]
        elif p.is_dir():
            files = sorted(p.rglob("results.json"))
        else:
            raise FileNotFoundError(f"no run directory or results.json at '{p}'")
        for f in files:
            found.setdefault(f.resolve(), f)
    return list(found.values())


def read_results(path: Path) -> dict[str, Any] | None:
    """One run's results, or None (with a warning naming the file) when it is damaged or incomplete."""
    try:
        results = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return _skip(path, f"unreadable ({type(err).__name__}: {err})")
    if not isinstance(results, dict):
        return _skip(path, "not a JSON object")
    bad = [k for k in TEXT_FIELDS if not isinstance(results.get(k), str)]
    bad += [k for k in ("seed",) if not isinstance(results.get(k), int) or isinstance(results.get(k), bool)]
    bad += [k for k in NUMBER_FIELDS if not is_number(results.get(k))]
    if bad:
        return _skip(path, f"missing or invalid {', '.join(repr(k) for k in bad)}")
    damaged = matrix_damage(results.get("acc_matrix"))
    if damaged:
        return _skip(path, f"'acc_matrix' {damaged}: cfl writes no such matrix, so the file was changed or damaged "
                     "(it is left out rather than averaged in)")
    if results.get("complete") is False:
        return _skip(path, f"incomplete run ({results.get('tasks_completed')} of {results.get('num_tasks')} tasks)")
    return results


def matrix_damage(matrix: Any) -> str:
    """What is wrong with an accuracy matrix (a list of rows of finite numbers, or null for tasks not yet
    evaluated), or ``""``; a missing matrix (older results) is no damage."""
    if matrix is None:
        return ""
    if not isinstance(matrix, list) or not all(isinstance(row, list) for row in matrix):
        return "is not a list of rows"
    for i, row in enumerate(matrix):
        for j, value in enumerate(row):
            if value is not None and not is_number(value):
                return f"holds {value!r} at row {i}, column {j} (after task {i}, on task {j}; 0-based)"
    return ""


def read_config(path: Path, results: dict[str, Any]) -> dict[str, Any] | None:
    """The run's resolved config: ``results['config']``, else the ``config.yaml`` beside ``path``."""
    if isinstance(results.get("config"), dict):
        return results["config"]
    beside = path.parent / "config.yaml"
    try:
        config = parse_yaml(beside.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ConfigError) as err:
        return _skip(path, f"no 'config' field and no readable {beside.name} beside it ({type(err).__name__})")
    if not isinstance(config, dict):
        return _skip(path, f"no 'config' field and {beside.name} beside it is not a mapping")
    return config


def load_runs(paths: list[str | Path]) -> list[Run]:
    """Every readable, complete run under ``paths``; FileNotFoundError when there is none."""
    files = find_results(paths)
    if not files:
        raise FileNotFoundError(f"no results.json under {', '.join(map(str, paths))}")
    runs = []
    for path in files:
        results = read_results(path)
        config = read_config(path, results) if results is not None else None
        if results is not None and config is not None:
            runs.append(Run(path, results, config))
    if not runs:
        raise FileNotFoundError(f"no readable results.json under {', '.join(map(str, paths))} (see the warnings)")
    return runs


def _skip(path: Path, why: str) -> None:
    print(f"cfl: warning: skipped {path}: {why}", file=sys.stderr)
    return None


# ---- grouping ----
def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a config, lists of sections by index: ``{'plugins.0.name': 'fedprox', 'lr': 0.05}``;
    an empty list has no keys (no plugins, no targets)."""
    if isinstance(tree, dict):
        items = [(str(k), v) for k, v in tree.items()]
    elif isinstance(tree, list) and all(isinstance(v, dict) for v in tree):
        items = [(str(i), v) for i, v in enumerate(tree)]
    else:
        return {prefix[:-1]: tree}
    out: dict[str, Any] = {}
    for key, value in items:
        out.update(flat(value, f"{prefix}{key}."))
    return out


def result_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a config that decide a run's results, less ``seed`` (what a group's runs share)."""
    return {k: v for k, v in flat(config).items() if k != "seed" and not is_resume_safe(k)}


def compared_keys(run: Run) -> dict[str, Any]:
    """:func:`result_keys` of the run's config as runs are compared: method and plugin parameters with their
    defaults filled in, keys added since the run read as the value it ran with (cfl/records/saved_configs.py),
    ``stream.scenario`` the scenario the run resolved it to (``results.json``)."""
    config = dict(run.config)
    if "schedule" not in config:  # a run from before schedules: the synchronous one, as a run at its default
        config["schedule"] = to_dict(ScheduleConfig())
    if isinstance(config["schedule"], dict) and "forgetting" not in config["schedule"]:
        # a run from before schedule.forgetting: a synchronous one reads as both (the default), another's FGT
        # counted from the first finisher
        sync = config["schedule"].get("name", "synchronous") == "synchronous"
        config["schedule"] = {**config["schedule"], "forgetting": "last_finisher" if sync else "first_finisher"}
    if isinstance(config.get("method"), dict):
        config["method"] = with_defaults(config["method"], run.method_info)
    if isinstance(config.get("plugins"), list):
        config["plugins"] = [with_defaults(p, run.method_info) if isinstance(p, dict) else p
                             for p in config["plugins"]]
    keys = result_keys(with_added_keys(config))  # a key added since the run: the value it ran with
    for key in unread_model_keys(keys):  # adapter keys its model.train does not read change nothing
        keys.pop(key, None)
    if isinstance(run.results.get("scenario"), str):
        keys["stream.scenario"] = run.results["scenario"]
    return keys


def config_label(run: Run) -> str | None:
    """The run's config ``label`` (set by a sweep's ``variant`` or by hand), if any."""
    label = run.config.get("label")
    return label if isinstance(label, str) and label else None


def row_name(run: Run) -> str | None:
    """The name a labelled run's row shows: its config ``label``, flagged like its method where its backbone
    was untrained (results.json's ``random_backbone``: ``l2p (random backbone)``) or its weights file has an
    origin (``backbone.origin``: ``l2p (in-house backbone, not ImageNet)``)."""
    label = config_label(run)
    suffix = backbone_suffix(run.results)
    if label is None or not suffix or label.endswith(suffix):
        return label
    return label + suffix


def shown_elsewhere(key: str) -> bool:
    """A key in a column of its own or in the method label (plugin names included)."""
    return (key in SHOWN_ELSEWHERE or key.startswith("partition.")
            or key.startswith("plugins.") and key.endswith(".name"))


def _frozen(keys: dict[str, Any]) -> str:
    return json.dumps(keys, sort_keys=True)


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs grouped by their configs less seed and result-neutral keys (and by their config ``label``), sorted
    by stream, partition and label; a label names the keys that differ among the groups of its stream,
    partition and config ``label``, and the method parameters away from their defaults."""
    members: dict[str, list[Run]] = {}
    for run in sorted(runs, key=lambda r: (r.seed, str(r.path))):
        members.setdefault(_frozen({"label": config_label(run), "keys": compared_keys(run)}), []).append(run)
    buckets: dict[tuple[str, str, str | None], list[dict[str, Any]]] = {}
    for frozen, same in members.items():
        buckets.setdefault(_bucket(same[0]), []).append(json.loads(frozen)["keys"])
    groups = []
    for frozen, same in members.items():
        first, keys, where = same[0], json.loads(frozen)["keys"], _bucket(same[0])
        named = set(differing_keys(buckets[where])) | set(changed_method_keys(first.config, first.method_info))
        groups.append(Group(where[0], where[1], first.results["method"],
                            {k: keys[k] for k in sorted(named) if k in keys}, same, row_name(first),
                            first.method_info))
        groups[-1].runs = one_per_seed(same, f"{where[0]} {where[1]} {groups[-1].label}")
        check_task_counts(groups[-1].runs, f"{where[0]} {where[1]} {groups[-1].label}")
    return sorted(groups, key=lambda g: (g.stream, g.partition, g.name or "", g.method,
                                         [_order(v) for v in g.differs.items()]))


def check_task_counts(runs: list[Run], name: str) -> None:
    """Refuse a row whose runs learned streams of different task counts (a key left at its default in one
    config, set in another): their ACC and FGT average over different tasks and are not one mean."""
    counts: dict[Any, list[str]] = {}
    for run in runs:
        counts.setdefault(run.results.get("num_tasks"), []).append(str(run.path.parent))
    if len(counts) > 1:
        found = "; ".join(f"{n} tasks: {', '.join(dirs)}" for n, dirs in sorted(counts.items(), key=str))
        raise ConfigError(f"{name}: one row would hold runs of different task counts ({found}); their ACC and FGT "
                          "average over different tasks: give them different config labels (label: ...) or set "
                          "stream.num_tasks in each config, or report their directories apart")


def _bucket(run: Run) -> tuple[str, str, str | None]:
    """The groups a label must tell apart: those of one stream (scenario), partition and config ``label``."""
    return stream_label(run.results), partition_label(run.results, run.config), config_label(run)


def differing_keys(configs: list[dict[str, Any]]) -> list[str]:
    """Keys (not shown elsewhere) that take more than one value among the ``configs`` that have them, a method
    parameter only among the configs of that method (``method.lam`` of EWC is not compared with MAS's):
    a parameter of one method is named in its label only when runs of that method differ in it. Should that
    leave two configs alike (a key only some have, e.g. results from before a key was added), keys that only
    some configs have are named too."""
    def varies(key: str) -> bool:
        seen: dict[Any, set[str]] = {}
        for c in configs:
            if key in c:
                seen.setdefault(c.get(_owner(key)), set()).add(json.dumps(c[key]))
        return any(len(v) > 1 for v in seen.values())

    def values(key: str) -> set[str | None]:
        return {json.dumps(c[key]) if key in c else None for c in configs}

    names = sorted({k for c in configs for k in c if not shown_elsewhere(k)})
    keys = [k for k in names if varies(k)]
    labels = {json.dumps({k: v for k, v in c.items() if k in keys or shown_elsewhere(k)}) for c in configs}
    if len(labels) < len(configs):
        keys = [k for k in names if len(values(k)) > 1]
    return keys


def _owner(key: str) -> str:
    """The key naming the method a parameter key belongs to (``method.name``, ``plugins.0.name``), or ``""``."""
    parts = key.split(".")
    if parts[0] == "method":
        return "method.name"
    return f"plugins.{parts[1]}.name" if parts[0] == "plugins" and len(parts) > 2 else ""


def _order(item: tuple[str, Any]) -> tuple[str, int, float, str]:
    """Sorts numbers as numbers (lr=2 before lr=10), then everything else by its text."""
    key, value = item
    return (key, 0, value, "") if is_number(value) else (key, 1, 0.0, show(value))

