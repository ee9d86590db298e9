"""The Python API: ``cfl.run`` and ``cfl.resume``, the ``cfl run`` command as functions (docs/python-api.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cfl.app.run_result import RunResult
from cfl.config.keys import Config, ConfigError
from cfl.config.yaml_files import read_yaml, set_dotted
from cfl.data.stream import Stream
from cfl.validation import from_dict


def run(config: str | Path | Mapping[str, Any] | Config, *, overrides: Mapping[str, Any] | None = None,
        out: str | Path | None = None, stream: Stream | None = None, overwrite: bool = False,
        quiet: bool = True, plugins: list[str] | tuple[str, ...] = ()) -> RunResult:
    """Run one experiment as ``cfl run`` does; return its results: the content of ``results.json`` as a dict,
    with the run directory (``.run_dir``) and the accuracy curves (``.curves``) as attributes.

    ``config``: a YAML path, a mapping of config keys or a :class:`Config`; ``overrides``: dotted keys to
    values, as ``--set`` (``{"method.name": "fot", "rounds_per_task": 5}``). Validated as the CLI validates
    (raises :class:`ConfigError` before any file is written). ``out``: the run directory (default
    ``runs/<stream>-<method>-<partition>-s<seed>``). ``stream``: a built :class:`Stream` that replaces the
    data loading: ``stream.name`` is set to its name, ``stream.num_tasks`` takes its first tasks,
    ``model: auto`` is its ``default_model``. ``plugins``: files as ``--plugin``; a file imported before is
    imported again if its text changed, its classes replacing their earlier selves (with a warning).
    """
    from cfl.app.single_run import default_run_dir, execute
    from cfl.plugin_files import load_plugins

    _check_path("out", out, none=True)
    load_plugins(_plugin_files(plugins))
    data = _mapping(config)
    for key, value in _pairs(overrides):
        set_dotted(data, key, value)
    with _lent(stream) as name:
        if name is not None:
            data.setdefault("stream", {})
            if not isinstance(data["stream"], dict):
                raise ConfigError(f"'stream' must be a mapping, got {data['stream']!r}")
            data["stream"] = {**data["stream"], "name": name}
        cfg = from_dict(data)
        run_dir = Path(out) if out is not None else default_run_dir(cfg)
        return RunResult(execute(cfg, run_dir, overwrite=overwrite, quiet=quiet), run_dir)


def resume(run_dir: str | Path, *, overrides: Mapping[str, Any] | None = None, stream: Stream | None = None,
           quiet: bool = True, plugins: list[str] | tuple[str, ...] = ()) -> RunResult:
    """Continue the run in ``run_dir`` from its last checkpoint, as ``cfl run --resume``; its results, as
    :func:`run` returns them.

    A run given ``stream=`` needs the same stream again (its data fingerprint is checked against the
    checkpoint's); ``overrides`` may only hold result-neutral keys, as with ``--set``.
    """
    from cfl.app.single_run import execute, resume_config
    from cfl.plugin_files import load_plugins

    _check_path("run_dir", run_dir)
    load_plugins(_plugin_files(plugins))
    saved = Path(run_dir) / "config.yaml"
    if stream is not None and saved.is_file():
        trained_on = (read_yaml(saved).get("stream") or {}).get("name")
        if trained_on != getattr(stream, "name", None):
            raise ConfigError(f"resume {run_dir}: the run was trained on stream '{trained_on}', but stream= is "
                              f"'{getattr(stream, 'name', stream)}'; pass the stream the run started with")
    with _lent(stream):
        cfg = resume_config(Path(run_dir), _pairs(overrides))
        try:
            return RunResult(execute(cfg, Path(run_dir), quiet=quiet, resume=True), Path(run_dir))
        except ConfigError as err:
            if stream is None or "not the data this run was trained on" not in str(err):
                raise
            raise ConfigError(f"{err}. With stream=: pass the Stream object the run started with (same tasks "
                              "and tensors)") from None


def _check_path(argument: str, value: Any, none: bool = False) -> None:
    """Refuse a path argument of another type (``out=5``) before any work (TypeError naming it)."""
    if isinstance(value, (str, Path)) or (none and value is None):
        return
    allowed = "a str or pathlib.Path" + (" (or None)" if none else "")
    raise TypeError(f"{argument} must be {allowed}, got {type(value).__name__} {value!r}")


def _plugin_files(plugins: Any) -> list[str]:
    """``plugins`` as a list of file names: a list or tuple of paths; a lone path is refused ("pass a list")."""
    if isinstance(plugins, (str, Path)):
        raise TypeError(f"plugins must be a list of plugin file paths, got the {type(plugins).__name__} "
                        f"{str(plugins)!r}; pass a list: plugins=[{str(plugins)!r}]")
    if not isinstance(plugins, (list, tuple)):
        raise TypeError(f"plugins must be a list of plugin file paths (str or pathlib.Path), got "
                        f"{type(plugins).__name__} {plugins!r}")
    for item in plugins:
        if not isinstance(item, (str, Path)):
            raise TypeError(f"plugins must be a list of plugin file paths (str or pathlib.Path); it holds "
                            f"{type(item).__name__} {item!r}")
    return [str(p) for p in plugins]


@contextlib.contextmanager
def _lent(stream: Stream | None) -> Iterator[str | None]:
    if stream is None:
        yield None
        return
    from cfl.streams import lent

    with lent(stream) as name:
        yield name


def _mapping(config: str | Path | Mapping[str, Any] | Config) -> dict[str, Any]:
    """A fresh, mutable mapping of config keys (the caller's mapping is not changed)."""
    if isinstance(config, (str, Path)):
        return read_yaml(config)
    if isinstance(config, Config):
        return config.to_dict()
    if isinstance(config, Mapping):
        return _copy(config)
    raise ConfigError(f"config must be a YAML path, a mapping or a cfl Config, got {type(config).__name__}")


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _pairs(overrides: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    if overrides is None:
        return []
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"overrides must be a mapping of dotted keys to values, e.g. {{'lr': 0.05}}, "
                          f"got {type(overrides).__name__}")
    pairs = []
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"malformed override key {key!r}: expected a dotted key, e.g. 'method.name'")
        pairs.append((key, _copy(value)))
    return pairs


__all__ = ["run", "resume", "Config", "ConfigError"]
