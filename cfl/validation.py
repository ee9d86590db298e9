"""Configs checked against the registries: a raw mapping -> a validated :class:`Config` whose names exist
(stream, model, partitioner, methods, aggregator, loss), whose method parameters fill their defaults and whose
keys agree with each other (:mod:`cfl.cross_checks`). Every run, sweep combination and resume is built here,
before any file is written or any data is loaded."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from cfl.config.keys import Config
from cfl.config.precision import parse_precision
from cfl.config.schema import ConfigError, build, refuse_nonfinite, to_dict
from cfl.config.yaml_files import parse_overrides, read_yaml, set_dotted
from cfl.cross_checks import (
    check_backbone_changes,
    check_client_params,
    check_methods,
    check_model_buffers,
    check_model_family,
    check_model_fits,
    check_optimizer,
    check_task_losses,
    check_threads,
    resolve_model,
)
from cfl.data.partition import PARTITIONERS
from cfl.data.stream_registry import STREAMS
from cfl.drawable import check_label
from cfl.ignored_keys import check_ignored_keys
from cfl.methods import METHODS
from cfl.models import MODELS
from cfl.ops.aggregate import AGGREGATORS
from cfl.ops.losses import LOSSES
from cfl.pretrained.loaded import check_backbone, resolved_prompt_length
from cfl.schedule_checks import check_methods_schedule, check_plan, check_schedule_keys
from cfl.schedules import build_plan

__all__ = ["from_dict", "load_config", "resolve_saved_model", "validate_names"]


def from_dict(data: dict[str, Any], read_weights: bool = True) -> Config:
    """Validate a raw mapping into a :class:`Config`, including names and method parameters. ``read_weights``
    False: a ``model.weights`` file is neither opened nor required to exist (every other key is checked), for
    planning runs and checking records where the file is absent (a clean clone: weights are not committed); a run
    always validates with it."""
    cfg = build(Config, data)
    return validate_names(cfg, read_weights)


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """A YAML file (None: every default) with ``key=value`` overrides, validated."""
    data = read_yaml(path) if path is not None else {}
    for key, value in parse_overrides(overrides or []):
        set_dotted(data, key, value)
    return from_dict(data)


def _check_method_spec(spec: dict[str, Any], key: str) -> dict[str, Any]:
    name = spec.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"'{key}.name' is required; available methods: {', '.join(METHODS)}")
    if name not in METHODS:
        raise METHODS.unknown(name, f"{key}.name")
    given = {k: v for k, v in spec.items() if k != "name"}
    if given and not dataclasses.fields(METHODS[name].Hyperparams):
        keys = ", ".join(f"'{key}.{k}'" for k in sorted(given))
        raise ConfigError(f"unknown config key {keys}: method '{name}' takes no parameters; remove it")
    params = to_dict(build(METHODS[name].Hyperparams, given, key))
    for param, value in params.items():  # given values are checked by build; defaults (a plugin's) here
        origin = f" (the default in the Hyperparams of method '{name}'; fix that default, or set {key}.{param})"
        refuse_nonfinite(value, f"{key}.{param}", "" if param in given else origin)
    return {"name": name, **params}


def _check_registered(cfg: Config) -> None:
    """Every name a registry holds, refused with the config key and the names it could be."""
    if cfg.model.name != "auto" and cfg.model.name not in MODELS:
        raise MODELS.unknown(cfg.model.name, "model.name", also=("auto",))
    for registry, key, name in ((PARTITIONERS, "partition.name", cfg.partition.name),
                                (AGGREGATORS, "aggregator.name", cfg.aggregator.name), (LOSSES, "loss", cfg.loss)):
        if name not in registry:
            raise registry.unknown(name, key)


def validate_names(cfg: Config, read_weights: bool = True) -> Config:
    """Check names against the registries and cross-key constraints; fill method defaults. A config of
    ``stream.name: avalanche`` has its benchmark imported, built and converted here (once per process)."""
    from cfl.data.avalanche_route import ROUTE, route_stream

    refuse_nonfinite(to_dict(cfg), "")  # the keys typed Any (stream.args, method parameters), nested
    if cfg.label is not None:  # drawn in the run's figures at its end: refused now, not after training
        check_label(cfg.label, "'label'")
    stream = route_stream(cfg.stream)
    if stream is None:
        return _validate_names(cfg, read_weights)
    from cfl.streams import lent

    with lent(stream, ROUTE):  # registered as stream 'avalanche' while the config is checked against it
        return _validate_names(cfg, read_weights)


def check_joining(cfg: Config, num_tasks: int) -> None:
    """``clients_join_per_task``: the first task must still hold a round's clients."""
    first = cfg.clients_joined(0, num_tasks)
    needed = cfg.clients_per_round + cfg.clients_join_per_task * (num_tasks - 1)
    if cfg.clients_join_per_task and first < cfg.clients_per_round:
        raise ConfigError(f"'clients_join_per_task: {cfg.clients_join_per_task}' over {num_tasks} tasks leaves "
                          f"num_clients={cfg.num_clients} - {cfg.clients_join_per_task} x {num_tasks - 1} = {first} "
                          f"clients in the first task, fewer than clients_per_round={cfg.clients_per_round}; raise "
                          f"num_clients to at least {needed} or lower clients_join_per_task")


def check_schedule(cfg: Config, num_tasks: int) -> None:
    """The ``schedule`` section: its keys, its grid (no task and no round without a client) and what runs under a
    schedule other than the synchronous one (cfl/schedules.py)."""
    check_schedule_keys(cfg)
    plan = build_plan(cfg, num_tasks)
    check_plan(plan, cfg.clients_per_round)
    if plan.synchronous:
        return
    if cfg.client_forgetting_clients:
        raise ConfigError(f"'client_forgetting_clients' measures F_k on one task's clients; under 'schedule.name: "
                          f"{plan.name}' a round's clients train on different tasks: set it to 0, or use "
                          "schedule.name: synchronous")
    if cfg.target_accuracies:
        raise ConfigError(f"'target_accuracies' counts rounds from a task's start, which differs between clients "
                          f"under 'schedule.name: {plan.name}': remove it, or use schedule.name: synchronous")


def _validate_names(cfg: Config, read_weights: bool = True) -> Config:
    if cfg.stream.name not in STREAMS:
        raise STREAMS.unknown(cfg.stream.name, "stream.name",
                              also=("avalanche (an Avalanche benchmark named by stream.benchmark)",))
    entry = STREAMS[cfg.stream.name]
    if cfg.stream.scenario != "auto" and cfg.stream.scenario not in entry.scenarios:
        raise ConfigError(f"'stream.scenario: {cfg.stream.scenario}' is not supported by stream "
                          f"'{cfg.stream.name}'; allowed: auto, {', '.join(entry.scenarios)}")
    if cfg.stream.num_tasks is not None and cfg.stream.num_tasks > entry.full_tasks:
        raise ConfigError(f"'stream.num_tasks' is {cfg.stream.num_tasks} but stream '{cfg.stream.name}' "
                          f"has {entry.full_tasks} tasks")
    _check_registered(cfg)
    if cfg.clients_per_round > cfg.num_clients:
        raise ConfigError(f"'clients_per_round' ({cfg.clients_per_round}) exceeds 'num_clients' "
                          f"({cfg.num_clients}); lower clients_per_round or raise num_clients")
    check_joining(cfg, cfg.stream.num_tasks or entry.full_tasks)
    check_schedule(cfg, cfg.stream.num_tasks or entry.full_tasks)
    if cfg.client_forgetting_clients > cfg.clients_per_round:
        raise ConfigError(f"'client_forgetting_clients' ({cfg.client_forgetting_clients}) exceeds "
                          f"'clients_per_round' ({cfg.clients_per_round}): it measures that many of each round's "
                          "clients; lower it")
    if cfg.client_forgetting_clients == 1:
        raise ConfigError("'client_forgetting_clients' is 1, but F_k averages over the other measured clients; "
                          "use 0 (off) or at least 2")
    if cfg.backend == "ray":
        from cfl.ray_support import require_ray

        require_ray("'backend: ray'")
        if cfg.device != "cpu":
            raise ConfigError(f"'backend: ray' trains clients on CPU Ray workers, but 'device: {cfg.device}'; use "
                              "device: cpu, or backend: local on a GPU")
    if not (cfg.device == "cpu" or cfg.device == "cuda" or cfg.device.startswith("cuda:")):
        raise ConfigError(f"'device' must be cpu, cuda or cuda:N, got {cfg.device!r}")
    method = _check_method_spec(cfg.method, "method")
    plugins = [_check_method_spec(p, f"plugins[{i}]") if isinstance(p, dict) else
               _raise(f"'plugins[{i}]' must be a mapping with a name") for i, p in enumerate(cfg.plugins)]
    names = [method["name"]] + [p["name"] for p in plugins]
    if len(set(names)) != len(names):
        raise ConfigError(f"a method appears twice in method + plugins: {names}")
    check_methods(cfg, [method, *plugins])
    check_methods_schedule(cfg.schedule.name, [METHODS[n] for n in names], [method, *plugins])
    check_ignored_keys(cfg, [method, *plugins])
    check_threads(cfg.threads)
    check_optimizer(cfg, [method, *plugins])
    check_task_losses(cfg, [method, *plugins])
    check_client_params(cfg, [method, *plugins])
    cfg = dataclasses.replace(cfg, method=method, plugins=plugins, precision=parse_precision(cfg.precision),
                              model=dataclasses.replace(cfg.model, name=resolve_model(cfg.stream.name, cfg.model.name,
                                                                                      method["name"]),
                                                        prompt_length=resolved_prompt_length(cfg.model)))
    check_model_family(cfg)
    check_model_fits(cfg)
    check_model_buffers(cfg)
    trains = {s["name"]: METHODS[s["name"]].requires.model_train for s in [method, *plugins] if s["name"] in METHODS}
    check_backbone_changes(cfg, [METHODS[s["name"]] for s in [method, *plugins] if s["name"] in METHODS])
    check_backbone(cfg, trains, read_weights)  # a weights file checked and loaded (model.weights), before any data
    return cfg


def resolve_saved_model(saved: dict[str, Any]) -> dict[str, Any]:
    """A config mapping saved before ``model: auto`` was resolved at validation, with the model it ran."""
    model = saved.get("model") or {}
    if model.get("name") != "auto" or saved.get("stream", {}).get("name") not in STREAMS:
        return saved
    method = (saved.get("method") or {}).get("name", "")
    return {**saved, "model": {**model, "name": resolve_model(saved["stream"]["name"], "auto", method)}}


def _raise(message: str) -> Any:
    raise ConfigError(message)
