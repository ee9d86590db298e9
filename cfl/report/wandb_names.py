"""How a run is organised in W&B: its group (one per config up to the seed), name, tags.

Runs whose resolved configs are equal except for the seed and keys that cannot change results share a
group, so the W&B UI aggregates seeds; runs that differ in anything else never do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from cfl.config.keys import Config
from cfl.config.schema import ConfigError, build, to_dict
from cfl.records.run_dir import is_resume_safe

#: W&B refuses longer group names
GROUP_MAX = 128
#: keys that never change what a run computes (besides the result-neutral keys a resume may change)
NEUTRAL_KEYS = ("seed", "stream.download")


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and method mappings inside lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            out.update(flat(value, dotted))
        else:
            out[dotted] = value
    return out


def is_neutral(key: str) -> bool:
    return is_resume_safe(key) or any(key == k or key.startswith(f"{k}.") for k in NEUTRAL_KEYS)


def result_keys(cfg: Config) -> dict[str, Any]:
    """The resolved config without the seed and result-neutral keys (output places, threads, W&B, checkpoints)."""
    return {k: v for k, v in flat(cfg.to_dict()).items() if not is_neutral(k)}


def differences(cfg: Config, base: Config | None) -> list[str]:
    """``key=value`` for every result-relevant key where ``cfg`` differs from ``base`` (sorted by key), short:

    - not the names the group and run name start with (stream, partition, method, aggregator, loss);
    - not a parameter that ``base`` lacks (its method is another) and that ``cfg`` leaves at its method's default,
      nor one that ``cfg`` lacks (the method's name says it);
    - each key by its last part (``method.mu`` -> ``mu``) unless another key of either config ends the same.
    """
    if base is None:
        return []
    mine, theirs = result_keys(cfg), result_keys(base)
    defaults = method_defaults(cfg)
    named = [k for k in sorted(mine) if k not in HEAD_KEYS and mine[k] != theirs.get(k, defaults.get(k, _ABSENT))]
    leaves = [k.rsplit(".", 1)[-1] for k in {*flat(cfg.to_dict()), *flat(base.to_dict())}]
    return [f"{_key(k, leaves)}={_short(mine[k])}" for k in named]


#: keys that the head of a group or run name already shows (:meth:`Config.method_label` names the last two)
HEAD_KEYS = ("stream.name", "partition.name", "method.name", "aggregator.name", "loss")
_ABSENT = object()


def method_defaults(cfg: Config) -> dict[str, Any]:
    """``{"method.<param>": default}`` of the run's method (a method's own defaults are never differences)."""
    from cfl.methods import METHODS

    entry = METHODS.get(cfg.method["name"])
    if entry is None or not dataclasses.fields(entry.Hyperparams):
        return {}
    try:
        params = to_dict(build(entry.Hyperparams, {}, "method"))
    except ConfigError:  # a plugin method with a parameter that has no default: every value is named
        return {}
    return {f"method.{k}": v for k, v in params.items()}


def _key(key: str, leaves: list[str]) -> str:
    leaf = key.rsplit(".", 1)[-1]
    return leaf if leaves.count(leaf) == 1 else key


def _short(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def config_hash(cfg: Config) -> str:
    """Six hex digits of the result-relevant config: equal exactly when two runs differ only in the seed
    or in neutral keys (up to a 1 in 16 million collision)."""
    text = json.dumps(result_keys(cfg), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def _fitted(head: str, tail: str) -> str:
    """``head + tail`` within W&B's :data:`GROUP_MAX` characters: ``head`` cut and marked ``~`` where too long."""
    if len(head) + len(tail) > GROUP_MAX:
        head = head[:GROUP_MAX - len(tail) - 1] + "~"
    return head + tail


def default_group(cfg: Config, base: Config | None) -> str:
    """``stream/partition/method[/key=value,...]#hash`` (``label`` in place of ``method`` where the config sets
    one): readable, and equal only for seeds of one config."""
    parts = [cfg.stream.name, cfg.partition.name, shown_method(cfg)]
    diffs = differences(cfg, base)
    if diffs:
        parts.append(",".join(diffs))
    return _fitted("/".join(parts), f"#{config_hash(cfg)}")


def shown_method(cfg: Config) -> str:
    """The config's ``label`` (a sweep variant's), else its method label; "(random backbone)" appended for an
    untrained pretrained backbone (``model.weights: random``, or a file flagged as freshly initialised), the
    weights' origin in parentheses for a file given one (``model.weights_origin``)."""
    from cfl.pretrained.flags import RANDOM_SUFFIX, origin_suffix
    from cfl.pretrained.loaded import untrained

    suffix = RANDOM_SUFFIX if untrained(cfg) else origin_suffix(cfg.model.weights_origin)
    return (cfg.label or cfg.method_label) + suffix


def default_name(cfg: Config, base: Config | None) -> str:
    """``stream-method-partition[-key=value,...]-s<seed>``: the keys that differ from ``base`` (as in the group),
    so that the runs of one sweep that differ in anything but neutral keys never share a name; without a
    ``base``, the config hash instead of the keys."""
    diffs = differences(cfg, base) if base is not None else [config_hash(cfg)]
    head = "-".join([cfg.stream.name, shown_method(cfg), cfg.partition.name, *([",".join(diffs)] if diffs else [])])
    return _fitted(head, f"-s{cfg.seed}")


def default_tags(cfg: Config) -> list[str]:
    """The stream, partition, scenario and every method, plugin, aggregator and loss name, then ``wandb.tags``."""
    names = [cfg.stream.name, cfg.partition.name, *cfg.method_label.split("+")]
    if cfg.stream.scenario != "auto":
        names.append(f"{cfg.stream.scenario}-incremental")
    return list(dict.fromkeys([*names, *cfg.wandb.tags]))
