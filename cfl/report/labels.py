"""What a run or a group of runs is called in report tables, figure legends and per-run figure titles.

One set of rules for all three:

- the stream with its resolved scenario (``split-digits (class-IL)``; ``results.json`` names the scenario);
- the partition with the parameters its partitioner reads (``dirichlet alpha=0.5``; ``shards
  shards_per_client=2``; ``min_samples`` only away from its default);
- the method label (method + plugins, aggregator and loss when not the defaults) with every method
  parameter set away from the method's default (``fedprox method.mu=1.0``), or the config's ``label``
  where one is set (a sweep's ``variant`` sets it);
- among groups, every other result-affecting key that differs between them (``lr=0.05``;
  :func:`cfl.report.groups.differing_keys`).

Tables name keys as ``--set`` would (``method.mu=1.0``); legends use display names (``FedProx``, the part
of a method's ``about`` before its colon) and the last part of each key (``mu=1``) unless two keys share it.

A run records, in ``results.json``'s ``method_info``, each of its methods' display name and parameter defaults
(:func:`cfl.methods.display.method_info`), so a report labels a plugin's runs without the plugin file; the
recorded values come first, the registry of this process serves ``results.json`` files written before cfl
recorded them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from cfl.methods.display import MethodInfo, registered_defaults, registered_display
from cfl.pretrained.flags import RANDOM_SUFFIX, origin_suffix

#: how a table row, figure legend and W&B name flag a run on an untrained backbone (results.json's
#: ``random_backbone``; cfl.pretrained): its numbers must never pass for a pretrained backbone's
RANDOM_BACKBONE = RANDOM_SUFFIX


def backbone_suffix(results: dict[str, Any]) -> str:
    """What a run's row and legend names are suffixed with: :data:`RANDOM_BACKBONE` for an untrained backbone,
    the weights file's origin in parentheses (results.json's ``backbone.origin``), else ""."""
    if results.get("random_backbone") is True:
        return RANDOM_BACKBONE
    backbone = results.get("backbone")
    origin = backbone.get("origin") if isinstance(backbone, dict) else None
    return origin_suffix(origin if isinstance(origin, str) else None)
#: partition parameters always named (each partitioner's own skew parameter); others only away from default
PARTITION_MAIN = ("alpha", "beta", "shards_per_client")


def show(value: Any) -> str:
    """A value as a table label shows it: text as it is, anything else as JSON (``1.0``, ``[0.9, 0.999]``)."""
    return value if isinstance(value, str) else json.dumps(value)


def _recorded(name: str, recorded: MethodInfo | None) -> dict[str, Any] | None:
    entry = (recorded or {}).get(name)
    return entry if isinstance(entry, dict) else None


def method_defaults(name: str, recorded: MethodInfo | None = None) -> dict[str, Any]:
    """The parameters of a method with their defaults: those ``recorded`` by the run (``method_info``), else
    those of the method registered in this process ({} for neither)."""
    entry = _recorded(name, recorded)
    if entry is not None and isinstance(entry.get("defaults"), dict):
        return dict(entry["defaults"])
    return registered_defaults(name)


def with_defaults(spec: dict[str, Any], recorded: MethodInfo | None = None) -> dict[str, Any]:
    """A method spec (``{name: fedprox}``) with every parameter the method has, defaults filled in."""
    return {"name": spec.get("name"), **method_defaults(str(spec.get("name", "")), recorded),
            **{k: v for k, v in spec.items() if k != "name"}}


def changed_params(spec: dict[str, Any], recorded: MethodInfo | None = None) -> dict[str, Any]:
    """The parameters of a method spec away from the method's defaults (all of them for an unknown method)."""
    defaults = method_defaults(str(spec.get("name", "")), recorded)
    return {k: v for k, v in spec.items() if k != "name" and (k not in defaults or defaults[k] != v)}


def method_specs(config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(dotted prefix, spec)`` of the method and each plugin: ``("method", {...}), ("plugins.0", {...})``."""
    method = config.get("method") if isinstance(config.get("method"), dict) else {}
    plugins = [p for p in config.get("plugins") or [] if isinstance(p, dict)]
    return [("method", method), *((f"plugins.{i}", p) for i, p in enumerate(plugins))]


def changed_method_keys(config: dict[str, Any], recorded: MethodInfo | None = None) -> dict[str, Any]:
    """Dotted keys of method and plugin parameters set away from their defaults: ``{"method.mu": 1.0}``."""
    return {f"{prefix}.{k}": v for prefix, spec in method_specs(config)
            for k, v in changed_params(spec, recorded).items()}


def display_name(method_label: str, recorded: MethodInfo | None = None) -> str:
    """``ewc+fedprox`` -> ``EWC+FL + FedProx``: each method's display name (its ``about`` up to the colon, as
    ``recorded`` by the run or registered here), other parts (aggregator, loss, unknown methods) as they are."""
    def one(name: str) -> str:
        entry = _recorded(name, recorded)
        if entry is not None and isinstance(entry.get("display"), str):
            return entry["display"]
        return registered_display(name)
    return " + ".join(one(part) for part in method_label.split("+"))


def stream_label(results: dict[str, Any]) -> str:
    """``split-digits (class-IL)``: the stream and its resolved scenario (just the stream in an older
    ``results.json`` without one)."""
    scenario = results.get("scenario")
    return f"{results['stream']} ({scenario}-IL)" if isinstance(scenario, str) else str(results["stream"])


def partition_label(results: dict[str, Any], config: dict[str, Any]) -> str:
    """``dirichlet alpha=0.5``: the partition and the parameters its partitioner reads."""
    name = str(results["partition"])
    section = config.get("partition") if isinstance(config.get("partition"), dict) else {}
    reads, defaults = partition_reads(name)
    named = [f"{k}={show(section[k])}" for k in reads
             if k in section and (k in PARTITION_MAIN or section[k] != defaults.get(k))]
    return " ".join([name, *named])


def partition_reads(name: str) -> tuple[list[str], dict[str, Any]]:
    """The partition keys the registered partitioner ``name`` reads, and their config defaults."""
    from cfl.config.keys import PartitionConfig
    from cfl.data.partition import PARTITIONERS
    from cfl.ignored_keys import parameter_names

    fields = {f.name: f.default for f in dataclasses.fields(PartitionConfig)}
    if name not in PARTITIONERS:
        return [], fields
    reads = parameter_names(PARTITIONERS[name])
    return [k for k in fields if k in reads], fields


def setting(key: str, value: Any, short: bool = False) -> str:
    """``method.mu=1.0``, or with ``short`` ``mu=1``."""
    if not short:
        return f"{key}={show(value)}"
    text = f"{value:g}" if isinstance(value, float) else show(value)
    return f"{key}={text}"


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted key's last part, or the whole key where two keys share the last part."""
    last = [k.split(".")[-1] for k in keys]
    return {k: (tail if last.count(tail) == 1 else k) for k, tail in zip(keys, last, strict=True)}


def row_label(method: str, differs: dict[str, Any], name: str | None = None, display: bool = False,
              shortened: dict[str, str] | None = None, recorded: MethodInfo | None = None) -> str:
    """A group's label: ``name`` (a config's ``label``) or the method label, then ``key=value`` for each of
    ``differs`` (but those ``name`` spells already, e.g. ``mu=1`` in ``FedProx mu=1``). ``display``: display
    names (``recorded`` by the runs, else registered) and short keys (``shortened`` maps each key to its
    short form)."""
    head = name if name is not None else display_name(method, recorded) if display else method
    differs = {k: v for k, v in differs.items() if name is None or not spelled_in(name, k, v)}
    if not display:
        return " ".join([head, *(setting(k, v) for k, v in differs.items())])
    short = shortened or short_keys(list(differs))
    return " ".join([head, *(setting(short.get(k, k), v, short=True) for k, v in differs.items())])


def spelled_in(name: str, key: str, value: Any) -> bool:
    """Whether ``name`` holds the setting as a word: ``mu=1`` or ``method.mu=1.0`` for ``method.mu: 1.0``."""
    words = set(re.split(r"[\s,;()]+", name))
    tail = key.split(".")[-1]
    return bool(words & {setting(key, value), setting(tail, value), setting(key, value, short=True),
                         setting(tail, value, short=True)})


def display_label(method: str, config: dict[str, Any], recorded: MethodInfo | None = None) -> str:
    """A run's method as a legend shows it alone: ``FedProx mu=1`` (display name and the parameters away from
    their defaults), or the config's ``label`` with those it does not spell."""
    name = config.get("label")
    return row_label(method, changed_method_keys(config, recorded), name if isinstance(name, str) else None,
                     display=True, recorded=recorded)


def run_title(results: dict[str, Any]) -> str:
    """One line naming a run: ``stream (scenario) · method (params) · partition params · seed N``."""
    config = results.get("config") or {}
    recorded = results.get("method_info") if isinstance(results.get("method_info"), dict) else None
    method = display_label(str(results["method"]), config, recorded)
    return (f"{stream_label(results)} · {method} · {partition_label(results, config)} · seed {results['seed']}")
