"""The one registry type: mapping reads, refused duplicates, errors that list the names, temporary entries
restored even on error."""

from __future__ import annotations

import pytest

from cfl.config.schema import ConfigError
from cfl.registry import Registry, UnknownName


def _colours() -> Registry[int]:
    reg: Registry[int] = Registry("colour")
    reg.register("red", 1, about="the first")
    reg.register("green", 2)
    return reg


def test_reads_like_a_mapping_in_registration_order():
    reg = _colours()
    assert reg["red"] == 1 and "green" in reg and "blue" not in reg and len(reg) == 2
    assert list(reg) == reg.names() == ["red", "green"] and dict(reg.items()) == {"red": 1, "green": 2}
    assert reg.about("red") == "the first" and reg.about("green") == "" and reg.get("blue") is None


def test_unknown_name_lists_the_names_and_is_a_config_and_key_error():
    reg = _colours()
    with pytest.raises(UnknownName) as err:
        reg["blue"]
    assert str(err.value) == "unknown colour 'blue'; available: red, green"
    assert isinstance(err.value, ConfigError) and isinstance(err.value, KeyError)
    assert str(reg.unknown("blue", "paint.name", also=("auto",))) == ("unknown colour 'paint.name: blue'; "
                                                                     "available: auto, red, green")
    with pytest.raises(UnknownName, match="unknown colour 'blue'"):
        reg.about("blue")
    with pytest.raises(UnknownName, match="colour 'blue' is not registered \\(registered: red, green\\)"):
        reg.unregister("blue")


def test_duplicate_refused_unless_replace():
    reg = _colours()
    with pytest.raises(ConfigError, match="colour 'red' is already registered; choose another name "
                                          "\\(registered: red, green\\)"):
        reg.register("red", 9)
    assert reg["red"] == 1
    assert reg.register("red", 9, about="replaced", replace=True) == 9
    assert reg["red"] == 9 and reg.about("red") == "replaced" and list(reg) == ["red", "green"]
    with pytest.raises(ConfigError, match="must be letters, digits"):
        reg.register("", 3)


def test_decorator_registers_what_it_decorates():
    reg: Registry[object] = Registry("rule")

    @reg.register("halve", about="x / 2")
    def halve(x: float) -> float:
        return x / 2

    assert reg["halve"] is halve and halve(3.0) == 1.5 and reg.about("halve") == "x / 2"


def test_unregister_removes():
    reg = _colours()
    reg.unregister("red")
    assert list(reg) == ["green"]


def test_temporarily_restores_absence_and_the_previous_entry_even_on_error():
    reg = _colours()
    with pytest.raises(RuntimeError, match="boom"), reg.temporarily("blue", 3, about="new") as entry:
        assert entry == 3 and reg["blue"] == 3
        raise RuntimeError("boom")
    assert "blue" not in reg
    with pytest.raises(RuntimeError, match="boom"), reg.temporarily("red", 7, replace=True):
        assert reg["red"] == 7 and reg.about("red") == ""
        raise RuntimeError("boom")
    assert reg["red"] == 1 and reg.about("red") == "the first" and list(reg) == ["red", "green"]


def test_temporarily_refuses_a_taken_name_and_leaves_it():
    reg = _colours()
    with pytest.raises(ConfigError, match="'red' is already registered"), reg.temporarily("red", 5):
        pytest.fail("entered the block")
    assert reg["red"] == 1


def test_preserved_restores_everything_even_on_error():
    reg = _colours()
    with pytest.raises(RuntimeError), reg.preserved():
        reg.register("blue", 3)
        reg.unregister("red")
        reg.register("green", 0, replace=True)
        raise RuntimeError
    assert dict(reg.items()) == {"red": 1, "green": 2} and reg.about("red") == "the first"


REGISTRIES = ["cfl.data.stream_registry:STREAMS", "cfl.models:MODELS", "cfl.data.partition:PARTITIONERS",
              "cfl.methods:METHODS", "cfl.ops.aggregate:AGGREGATORS", "cfl.ops.losses:LOSSES"]
BAD_NAMES = ["", "../evil", "x/y", "x/../../../escaped", ".hidden", "a..b", "a b", "m" * 101, 3]


@pytest.mark.parametrize("where", REGISTRIES)
@pytest.mark.parametrize("name", BAD_NAMES, ids=[repr(n)[:12] for n in BAD_NAMES])
def test_every_registry_refuses_a_name_that_cannot_be_part_of_a_file_name(where, name):
    import importlib

    module, attr = where.split(":")
    registry = getattr(importlib.import_module(module), attr)
    with pytest.raises(ConfigError, match="must be letters, digits|at most 100 are allowed"), registry.preserved():
        registry.register(name, None)
    assert name not in registry


def test_names_as_long_as_allowed_and_every_built_in_name_pass():
    reg: Registry[int] = Registry("colour")
    assert reg.register("m" * 100, 1) == 1 and reg.register("a-b_c.d9", 2) == 2
