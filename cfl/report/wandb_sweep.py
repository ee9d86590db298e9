"""W&B sweeps drive ``cfl run``: the agent's parameters are applied like ``--set`` before any data loads.

``wandb agent`` starts each run's ``command`` with ``WANDB_SWEEP_ID``, ``WANDB_RUN_ID`` and
``WANDB_SWEEP_PARAM_PATH`` in the environment; the last names a YAML file the agent wrote, of the form::

    wandb_version: 1
    lr:
      value: 0.5
    method.mu:
      value: 0.01

Keys are cfl's dotted keys (a nested sweep parameter arrives as a mapping and is read as dotted keys).
The sweep's author is not the config file's: a ``stream.benchmark`` from the parameters must pass
:func:`cfl.data.benchmark_trust.check_foreign_benchmark`, and the sweep and run ids are checked
(:mod:`cfl.report.wandb_ids`) before they name a directory.
"""

from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cfl.config.keys import Config, ConfigError
from cfl.config.yaml_files import parse_overrides, parse_yaml, read_yaml, set_dotted
from cfl.data.benchmark_trust import check_foreign_benchmark, trusted_by_env
from cfl.report.wandb_ids import checked_id
from cfl.validation import from_dict

PARAM_PATH_ENV = "WANDB_SWEEP_PARAM_PATH"
SWEEP_ID_ENV = "WANDB_SWEEP_ID"
RUN_ID_ENV = "WANDB_RUN_ID"


@dataclass(frozen=True)
class RunSource:
    """Where a run's config came from, for its W&B group and config: the config file alone (``base``)
    and the sweep's parameters applied on top of it."""

    base: Config | None = None
    sweep_params: dict[str, Any] = field(default_factory=dict)


def sweep_param_path() -> Path | None:
    """The agent's parameter file of this run, or None outside a sweep."""
    value = os.environ.get(PARAM_PATH_ENV)
    return Path(value) if value else None


def _dotted(prefix: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        return [item for k, v in value.items() for item in _dotted(f"{prefix}.{k}", v)]
    return [(prefix, value)]


def read_sweep_params(path: Path) -> dict[str, Any]:
    """``{dotted key: value}`` from the agent's parameter file (:class:`ConfigError` when unreadable)."""
    where = f"W&B sweep parameter file '{path}' (${PARAM_PATH_ENV})"
    try:
        data = parse_yaml(path.read_text(encoding="utf-8")) or {}
    except ConfigError as err:  # a duplicate key, an alias bomb
        raise ConfigError(f"the {where}: {err}") from None
    except OSError as err:
        raise ConfigError(f"cannot read the {where}: {err.strerror}; run under `wandb agent` or unset "
                          f"{PARAM_PATH_ENV}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"the {where} is not UTF-8 text (byte {err.start} is 0x{err.object[err.start]:02x}; a "
                          f"binary file?); point {PARAM_PATH_ENV} at the YAML file the W&B agent wrote") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"the {where} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"the {where} must hold a mapping of parameters, got {type(data).__name__}")
    params: dict[str, Any] = {}
    for key, entry in data.items():
        if key == "wandb_version":
            continue
        if not isinstance(entry, dict) or "value" not in entry:
            raise ConfigError(f"the {where}: parameter '{key}' must be a mapping with a 'value', got {entry!r}")
        params.update(_dotted(str(key), entry["value"]))
    return params


def load_with_sweep(path: str | Path, overrides: list[str], trust_callables: bool = False) -> tuple[Config, RunSource]:
    """The config ``cfl run`` runs, and its :class:`RunSource`.

    Order: the YAML file, then the sweep's parameters, then ``--set``, validated together like ``--set``
    alone; a key set by both the sweep and ``--set`` is refused, as is any parameter that is not a cfl key or
    has a bad value (exit 2, naming it), and a ``stream.benchmark`` from the sweep that is not admitted
    (:func:`check_foreign_benchmark`) unless ``trust_callables`` (``--trust-callables``) or ``CFL_TRUST_CALLABLES=1``.
    """
    data = read_yaml(path)
    file_data = copy.deepcopy(data)
    params_file = sweep_param_path()
    if trust_callables and not params_file:
        raise ConfigError(f"--trust-callables is read only under a W&B sweep (${PARAM_PATH_ENV} set): a config file "
                          "and --set are your own and always trusted; drop --trust-callables")
    params = read_sweep_params(params_file) if params_file else {}
    if params_file:
        sweep_ids()
    sets = parse_overrides(overrides)
    both = sorted({key for key, _ in sets for p in params if _overlap(key, p)})
    if both:
        raise ConfigError(f"--set {', '.join(both)}: also set by the W&B sweep (${PARAM_PATH_ENV}); a run takes "
                          "each key from one place: drop it from --set or from the sweep's parameters")
    try:
        for key, value in [*params.items(), *sets]:
            set_dotted(data, key, value)
        if params and not (trust_callables or trusted_by_env()):
            _check_sweep_benchmark(data, file_data, sets, params_file)
        cfg = from_dict(data)
    except ConfigError as err:
        if not params:
            raise
        given = ", ".join(f"{k}={v!r}" for k, v in params.items())
        raise ConfigError(f"{err} (with the W&B sweep parameters {given} from {params_file})") from None
    if params and cfg.wandb.mode == "disabled":
        warnings.warn("running a W&B sweep's parameters with 'wandb.mode: disabled': the sweep gets no results; "
                      "set wandb.mode: online in the sweep's config file", stacklevel=2)
    named = cfg.wandb.group is None or cfg.wandb.name is None  # a default group or name names the differences
    return cfg, RunSource(_base(file_data) if cfg.wandb.mode != "disabled" and named else None, params)


def _benchmark(data: dict[str, Any]) -> Any:
    stream = data.get("stream")
    return stream.get("benchmark") if isinstance(stream, dict) else None


def _check_sweep_benchmark(data: dict[str, Any], file_data: dict[str, Any], sets: list[tuple[str, Any]],
                           params_file: Path | None) -> None:
    """A ``stream.benchmark`` other than the config file's (with ``--set``) came from the sweep: admit it only
    through :func:`check_foreign_benchmark`."""
    own = copy.deepcopy(file_data)
    for key, value in sets:
        set_dotted(own, key, value)
    if _benchmark(data) is not None and _benchmark(data) != _benchmark(own):
        check_foreign_benchmark(_benchmark(data), f"the W&B sweep parameter file {params_file} (${PARAM_PATH_ENV})")


def _base(data: dict[str, Any]) -> Config | None:
    """The config file alone, validated, for the differences that the default W&B group and name show (only
    where one of them is the default: validating it builds its stream's metadata, e.g. an Avalanche benchmark);
    None where it is valid only with its --set keys (the group and name then show the config hash instead)."""
    try:
        return from_dict(data)
    except ConfigError:
        return None


def _overlap(key: str, other: str) -> bool:
    """``method`` and ``method.mu`` set the same value; ``lr`` and ``lr_decay`` do not."""
    return key == other or key.startswith(f"{other}.") or other.startswith(f"{key}.")


def sweep_run_dir(cfg: Config) -> Path | None:
    """Under a sweep: ``runs/sweep-<id>/<stream>-<method>-<partition>-s<seed>-<run id>`` (one per agent run,
    so two parameter sets with the same seed never share a directory); None outside a sweep."""
    sweep_id, run_id = sweep_ids()
    if not (sweep_param_path() and sweep_id and run_id):
        return None
    label = f"{cfg.stream.name}-{cfg.method_label}-{cfg.partition.name}-s{cfg.seed}-{run_id}"
    return Path("runs") / f"sweep-{sweep_id}" / label


def sweep_ids() -> tuple[str | None, str | None]:
    """``$WANDB_SWEEP_ID`` and ``$WANDB_RUN_ID`` (None where unset), each refused unless a safe W&B id."""
    ids = os.environ.get(SWEEP_ID_ENV), os.environ.get(RUN_ID_ENV)
    for env, value in zip((SWEEP_ID_ENV, RUN_ID_ENV), ids, strict=True):
        if value:
            checked_id(value, f"${env}", "run under `wandb agent`, which sets it, or fix the value")
    return ids


def refuse_under_sweep(command: str, reason: str) -> None:
    """``command`` cannot take a W&B sweep's parameters: refuse rather than ignore them."""
    if sweep_param_path():
        raise ConfigError(f"{command} under a W&B sweep (${PARAM_PATH_ENV} is set): {reason}, so it cannot take "
                          f"the sweep's parameters; use `cfl run CONFIG` as the sweep's command, or unset "
                          f"{PARAM_PATH_ENV}")
