"""Every numeric parameter of every registered method has finite bounds, and a value beyond them is refused when
the config is validated (exit code 2), naming the key (cfl/methods/bounds.py)."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
import yaml

from cfl.app.cli import main
from cfl.config.schema import ConfigError
from cfl.methods import METHODS
from cfl.validation import from_dict

BASE = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 6, "clients_per_round": 3,
        "rounds_per_task": 1, "wandb": {"mode": "disabled"}}
NUMBERS = (int, float)


def numeric_kind(tp: typing.Any) -> type | None:
    """int or float for a field typed int, float, optional either, or a list of either; None otherwise."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list:
        return numeric_kind(args[0])
    if args:
        kinds = [a for a in args if a is not type(None)]
        return numeric_kind(kinds[0]) if len(kinds) == 1 else None
    return tp if tp in NUMBERS else None


def numeric_fields() -> list[tuple[str, str, type, bool, dict[str, typing.Any]]]:
    """(method, parameter, int or float, whether a list, metadata) of every built-in method's numeric parameter."""
    rows = []
    for name in METHODS:
        cls = METHODS[name].Hyperparams
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = numeric_kind(hints[f.name])
            if kind is not None:
                rows.append((name, f.name, kind, typing.get_origin(hints[f.name]) is list, dict(f.metadata)))
    return rows


FIELDS = numeric_fields()
IDS = [f"{m}.{p}" for m, p, *_ in FIELDS]


def test_the_audit_covers_every_method_with_numbers() -> None:
    assert len(FIELDS) >= 87 and {"gem", "fedlwf", "target", "mfcl", "ewc", "glfc"} <= {m for m, *_ in FIELDS}


@pytest.mark.parametrize(("method", "param", "meta"), [(m, p, meta) for m, p, _, _, meta in FIELDS], ids=IDS)
def test_every_numeric_parameter_has_finite_bounds(method: str, param: str, meta: dict[str, typing.Any]) -> None:
    low = meta.get("min", meta.get("gt"))
    assert low is not None and math.isfinite(low), f"{method}.{param} has no lower bound"
    if "bounded_by" in meta:  # bounded by another key, refused by the method's check (a documented reason)
        assert len(meta["bounded_by"]) > 20
        return
    assert "max" in meta and math.isfinite(meta["max"]), f"{method}.{param} has no upper bound"


@pytest.mark.parametrize(("method", "param", "kind", "listed", "meta"), FIELDS, ids=IDS)
def test_a_value_beyond_the_bounds_is_refused_naming_the_key(method: str, param: str, kind: type, listed: bool,
                                                             meta: dict[str, typing.Any]) -> None:
    outside = []
    if "max" in meta:
        outside.append((kind(meta["max"] + 1) if kind is int else meta["max"] * 1.001 + 1e-9, f"<= {meta['max']}"))
    if "min" in meta:
        outside.append((kind(meta["min"] - 1) if kind is int else meta["min"] - 1e-3, f">= {meta['min']}"))
    if "gt" in meta:
        outside.append((kind(meta["gt"]), f"> {meta['gt']}"))
    for value, rule in outside:
        given = [value] if listed else value
        with pytest.raises(ConfigError) as err:
            from_dict({**BASE, "method": {"name": method, param: given}})
        assert f"'method.{param}'" in str(err.value) and rule in str(err.value), str(err.value)


@pytest.mark.parametrize(("setting", "words"), [
    ("method={name: gem, margin: 1e300}", ["'method.margin'", "<= 10.0"]),
    ("method={name: fedlwf, temperature: 1e300}", ["'method.temperature'", "<= 100.0"]),
    ("method={name: target, nz: 1000000000000}", ["'method.nz'", "<= 4096"]),
    ("method={name: mfcl, generator_width: 1000000000000}", ["'method.generator_width'", "<= 512"]),
])
def test_the_reported_cases_exit_2_before_any_work(setting: str, words: list[str], tmp_path, capsys) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(BASE))
    code = main(["run", str(cfg), "--set", setting, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and all(w in err for w in words), err
    assert not (tmp_path / "run").exists()
