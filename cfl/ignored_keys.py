"""One rule for keys the chosen components do not read: set to anything but its default, such a key is refused.

A key has no effect when the component chosen by another key does not read it: ``partition.alpha`` with
``partition.name: iid``, ``aggregator.tau`` with ``aggregator.name: mean``, ``ray_workers`` with ``backend:
local``, ``client_block`` with ``client_execution: sequential``, ``momentum`` with ``optimizer.name: adam``
(and ``optimizer.betas``, ``optimizer.eps`` with ``sgd``), ``wandb.log_checkpoint`` without
``wandb.log_artifacts``, ``stream.seed`` or ``stream.download`` for a stream that does not read it
(``StreamEntry.reads``), the top-level ``server_lr`` with an adaptive server (FedAdam, FedYogi). Left at its
default (as every resolved ``config.yaml`` holds it) such a key is accepted; set to another value it is refused
(exit 2), naming the key, the component that ignores it and the fix, just as an unknown method parameter is.
What a partitioner or aggregator reads is the keys its function names as parameters; what a method makes
unread, its ``Method.requires.unread_keys``. ``wandb.*`` under ``wandb.mode: disabled`` is exempt: that one switch turns
W&B off and on without editing the rest (docs/configuration.md).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from cfl.config.keys import Config
from cfl.config.schema import ConfigError

#: within :func:`tolerated`: an ignored key is printed, not refused
_TOLERATED: ContextVar[bool] = ContextVar("cfl_ignored_keys_tolerated", default=False)


@contextmanager
def tolerated() -> Iterator[None]:
    """Within the block, a key that has no effect is printed to stderr instead of refused: a resumed run keeps
    the config it started with (a cfl before this rule may have accepted it; the key changes no result)."""
    token = _TOLERATED.set(True)
    try:
        yield
    finally:
        _TOLERATED.reset(token)


class IgnoredKey(ConfigError):
    """A key set away from its default that the component chosen by ``chooser`` does not read."""

    def __init__(self, key: str, value: Any, chooser: str, chosen: str, why: str, fix: str,
                 reader: str | None = None) -> None:
        super().__init__(f"'{key}: {_shown(value)}' has no effect with '{chooser}: {_shown(chosen)}' ({why}); {fix}")
        self.key, self.value, self.chooser, self.chosen, self.reader = key, value, chooser, chosen, reader

    def sweep_advice(self) -> str:
        """How a sweep sets the key only where it is read: a ``variant`` grid entry (cfl/app/sweep.py)."""
        other = f"{self.chooser}: {self.reader}, " if self.reader else ""
        return (f"a sweep sets '{self.key}' on every combination, so set it only on those that read it, with a "
                f"'variant' grid entry, e.g. variant: [{{label: a, {self.chooser}: {self.chosen}}}, "
                f"{{label: b, {other}{self.key}: {_shown(self.value)}}}]")


def _shown(value: Any) -> str:
    """A value as YAML writes it (true, null, 0.3)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def _default(section: Any, name: str) -> Any:
    f = next(f for f in dataclasses.fields(section) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def _changed(section: Any, name: str) -> bool:
    return getattr(section, name) != _default(section, name)


def parameter_names(fn: Callable[..., Any]) -> set[str]:
    """The keyword arguments a registered function reads by name (``**_`` swallows the others)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds}


def _check_named_readers(section: Any, prefix: str, registry: Any) -> None:
    """Each key of section ``prefix`` but its name: read by the registered function of ``prefix.name`` if that
    function names it as a parameter."""
    chosen = section.name
    for name in (f.name for f in dataclasses.fields(section) if f.name != "name"):
        if not _changed(section, name) or name in parameter_names(registry[chosen]):
            continue
        readers = [n for n in registry if name in parameter_names(registry[n])]
        key = f"{prefix}.{name}"
        why = f"only {', '.join(readers)} read{'s' if len(readers) == 1 else ''} it" if readers else "nothing reads it"
        fix = f"remove {key}" + (f", or set {prefix}.name: {readers[0]}" if readers else "")
        reader = readers[0] if readers else None
        raise IgnoredKey(key, getattr(section, name), f"{prefix}.name", chosen, why, fix, reader)


def _check_choice(cfg: Config, key: str, chooser: str, reader: str) -> None:
    """Top-level ``key`` is read only when top-level ``chooser`` is ``reader``."""
    chosen = getattr(cfg, chooser)
    if chosen != reader and _changed(cfg, key):
        raise IgnoredKey(key, getattr(cfg, key), chooser, chosen, f"read only with {chooser}: {reader}",
                         f"remove {key}, or set {chooser}: {reader}", reader)


def _check_methods(cfg: Config, specs: list[dict[str, Any]]) -> None:
    from cfl.methods import METHODS

    for i, spec in enumerate(specs):
        for key, why in METHODS[spec["name"]].requires.unread_keys.items():
            if key not in (f.name for f in dataclasses.fields(cfg)):
                raise ConfigError(f"method '{spec['name']}' declares requires.unread_keys '{key}', which is not a "
                                  "top-level config key (cfl config-reference lists them); fix the method's "
                                  "requires.unread_keys")
            if _changed(cfg, key):
                chooser = "method.name" if i == 0 else f"plugins[{i - 1}].name"
                default = _shown(_default(cfg, key))  # what a command line sets over a config file's value
                raise IgnoredKey(key, getattr(cfg, key), chooser, spec["name"], why,
                                 f"remove {key}, or set it to its default ({key}: {default}, --set {key}={default})")


def _check_stream(stream: Any) -> None:
    """``stream.seed`` / ``stream.download`` set for a registered stream whose builder does not read it (a
    stream that declares nothing, such as a plugin's, reads them all; the Avalanche route checks its own)."""
    from cfl.data.stream_registry import OPTIONAL_FIELDS, STREAMS

    entry = STREAMS.get(stream.name)
    reads = getattr(entry, "reads", None)
    if reads is None:
        return
    for name in OPTIONAL_FIELDS:
        if name not in reads and _changed(stream, name):
            readers = [n for n, e in STREAMS.items() if name in (getattr(e, "reads", None) or ())]
            raise IgnoredKey(f"stream.{name}", getattr(stream, name), "stream.name", stream.name,
                             f"stream '{stream.name}' does not read it; {', '.join(readers)} do",
                             f"remove stream.{name}", readers[0] if readers else None)


def _check_optimizer(cfg: Config) -> None:
    """``momentum`` is SGD's; ``optimizer.betas`` and ``optimizer.eps`` are Adam's and AdamW's."""
    name = cfg.optimizer.name
    if name != "sgd" and _changed(cfg, "momentum"):
        raise IgnoredKey("momentum", cfg.momentum, "optimizer.name", name, "read only with optimizer.name: sgd; "
                         f"{name}'s first moment decays by optimizer.betas[0]", "remove momentum, or set "
                         "optimizer.name: sgd", "sgd")
    for key in ("betas", "eps"):
        if name == "sgd" and _changed(cfg.optimizer, key):
            raise IgnoredKey(f"optimizer.{key}", getattr(cfg.optimizer, key), "optimizer.name", name,
                             "only adam, adamw read it", f"remove optimizer.{key}, or set optimizer.name: adam",
                             "adam")


def _check_wandb(wandb: Any) -> None:
    if wandb.mode != "disabled" and wandb.log_checkpoint and not wandb.log_artifacts:
        raise IgnoredKey("wandb.log_checkpoint", True, "wandb.log_artifacts", False,
                         "the checkpoint goes into the run's artifact, and no artifact is logged",
                         "remove wandb.log_checkpoint, or set wandb.log_artifacts: true", "true")


def check_ignored_keys(cfg: Config, specs: list[dict[str, Any]]) -> None:
    """Refuse a key of ``cfg`` (method + plugins ``specs``) that is set but not read (module docstring); within
    :func:`tolerated`, print it."""
    try:
        _check_all(cfg, specs)
    except IgnoredKey as err:
        if not _TOLERATED.get():
            raise
        print(f"cfl: warning: {err}. Resumed with the config the run started with", file=sys.stderr)


def _check_all(cfg: Config, specs: list[dict[str, Any]]) -> None:
    from cfl.data.partition import PARTITIONERS
    from cfl.ops.aggregate import AGGREGATORS

    _check_named_readers(cfg.partition, "partition", PARTITIONERS)
    _check_named_readers(cfg.aggregator, "aggregator", AGGREGATORS)
    for key in ("ray_workers", "ray_address"):
        _check_choice(cfg, key, "backend", "ray")
    _check_choice(cfg, "client_block", "client_execution", "batched")
    _check_methods(cfg, specs)
    _check_stream(cfg.stream)
    _check_optimizer(cfg)
    _check_wandb(cfg.wandb)
