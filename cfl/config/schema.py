"""Build typed, frozen dataclasses from plain dicts, refusing anything unexpected.

Every config section (and every method's parameters) is a dataclass whose fields may carry
``metadata={"min": .., "max": .., "gt": .., "choices": (..), "doc": ".."}``. ``build`` checks unknown
keys, types and ranges and raises :class:`ConfigError` naming the dotted key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from typing import Any, Union

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
#: integers must fit a signed 64-bit value (numpy, torch and checkpoints store them as such)
INT_LIMIT = 2**63


class ConfigError(ValueError):
    """A configuration problem, reported before any data is loaded (exit code 2)."""


def field(default: Any, doc: str = "", **checks: Any) -> Any:
    """A dataclass field with a docstring and range/choice checks."""
    meta = {"doc": doc, **checks}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        args = typing.get_args(tp)
        return "mapping" if not args or args[1] is Any else f"mapping of {_type_name(args[0])} to {_type_name(args[1])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        errors = []
        for option in typing.get_args(tp):
            try:
                return _coerce(value, option, key)
            except ConfigError as err:
                if option is not type(None):
                    errors.append(err)
        if len(errors) == 1 and isinstance(value, (int, float)):  # Optional number: why (not finite, too large)
            raise errors[0]
        raise ConfigError(f"'{key}' must be {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"'{key}' must be null, got {value!r}")
    if tp is Any:
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"'{key}' must be a list, got {value!r}")
        (inner,) = typing.get_args(tp)
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a mapping, got {value!r}")
        args = typing.get_args(tp)
        if not args or args[1] is Any:
            return dict(value)
        # typed values (``lr_groups``): a nested mapping reads as its dotted keys, as ``--set a.b.c=v`` nests them
        return {k: _coerce(v, args[1], f"{key}.{k}") for k, v in _dotted_leaves(value, key).items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a mapping of keys {sorted(_names(tp))}, got {value!r}")
        return build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"'{key}' must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -INT_LIMIT <= value < INT_LIMIT:
                raise ConfigError(f"'{key}' must be a 64-bit integer (below 2**63 in size), got {value}")
            return value
        raise ConfigError(f"'{key}' must be an integer, got {value!r}")
    if tp is float:
        return _finite_float(value, key)
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"'{key}' must be a string, got {value!r}")
    raise TypeError(f"unsupported config type {tp!r} for {key}")


def _dotted_leaves(tree: dict, key: str, prefix: str = "") -> dict[str, Any]:
    """The leaves of a nested mapping at their dotted keys (``{body: {1: x}}`` -> ``{'body.1': x}``); a key must
    be a string or an integer (YAML reads ``0:`` as one)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if not isinstance(k, (str, int)) or isinstance(k, bool):
            raise ConfigError(f"'{key}' keys must be strings, got {k!r}")
        dotted = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_dotted_leaves(v, key, f"{dotted}."))
        else:
            out[dotted] = v
    return out


def _finite_float(value: Any, key: str) -> float:
    """A finite number; YAML 1.1 reads ``1e-3`` (no dot) as a string, which is accepted as 0.001.

    NaN and infinities are refused: they train to nothing, and a NaN config never equals itself on resume.
    """
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        value = float(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(f"'{key}' must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"'{key}' must be a finite number, got {value!r}; NaN and infinities are refused")
    return number


def refuse_nonfinite(value: Any, key: str, note: str = "") -> None:
    """Refuse NaN or an infinity anywhere in ``value`` (nested mappings and lists, e.g. ``stream.args`` or a
    method's parameters with their defaults), naming its dotted key; ``note`` says where the value came from."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"'{key}' is {value!r}{note}, not a finite number; NaN and infinities are refused (they "
                          "train to nothing, and a NaN config never equals itself, so its run could not resume)")
    if isinstance(value, dict):
        for k, v in value.items():
            refuse_nonfinite(v, f"{key}.{k}" if key else str(k), note)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            refuse_nonfinite(v, f"{key}[{i}]", note)


def _names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _check_range(value: Any, meta: typing.Mapping[str, Any], key: str) -> None:
    if value is None:
        return
    if isinstance(value, dict):  # a typed mapping's values (``lr_groups``), each named by its key
        for k, v in value.items():
            _check_range(v, meta, f"{key}.{k}")
        return
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"'{key}' must be one of {list(choices)}, got {value!r}")
    values = value if isinstance(value, list) else [value]
    for v in values:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        if "min" in meta and v < meta["min"]:
            raise ConfigError(f"'{key}' must be >= {meta['min']}, got {v!r}")
        if "gt" in meta and v <= meta["gt"]:
            raise ConfigError(f"'{key}' must be > {meta['gt']}, got {v!r}")
        if "max" in meta and v > meta["max"]:
            raise ConfigError(f"'{key}' must be <= {meta['max']}, got {v!r}")


def build(cls: type, data: dict | None, prefix: str = "") -> Any:
    """Instantiate dataclass ``cls`` from ``data``, refusing unknown keys and bad values."""
    data = dict(data or {})
    allowed = _names(cls)
    for key in data:
        if key not in allowed:
            where = f"{prefix}.{key}" if prefix else key
            raise ConfigError(f"unknown config key '{where}'; allowed keys here: {', '.join(allowed)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if f.name in data:
            value = _coerce(data[f.name], hints[f.name], key)
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise ConfigError(f"missing required config key '{key}'")
        _check_range(value, f.metadata, key)
        kwargs[f.name] = value
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Plain-data (YAML/JSON friendly) view of a config dataclass."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(key, type, default, doc) rows for the configuration reference."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, key))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append((key, _type_name(tp), default, f.metadata.get("doc", "")))
    return rows
