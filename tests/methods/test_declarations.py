"""The method declarations (cfl/methods/declarations.py): ``Method`` declares at most three, each a
frozen dataclass; they check themselves, stay frozen (their mappings too) and pickle; a class of the old interface
is refused, naming each old name and what replaces it."""

import copy
import dataclasses
import inspect
import pickle

import pytest

from cfl.config.schema import ConfigError
from cfl.methods import METHODS
from cfl.methods.base import Method
from cfl.methods.declarations import DECLARATIONS, Computes, Requires, Sends
from cfl.methods.old_interface import OLD_DECLARATIONS


def test_method_declares_at_most_three_frozen_dataclasses_beside_its_identity():
    public = {name: value for name, value in vars(Method).items() if not name.startswith("_")
              and not callable(value) and not isinstance(value, (classmethod, staticmethod, property))}
    declarations = {k: v for k, v in public.items() if k not in ("name", "about", "Hyperparams")}
    assert len(declarations) <= 3, sorted(declarations)
    assert declarations.keys() == DECLARATIONS.keys()
    for value in declarations.values():
        assert dataclasses.is_dataclass(value) and not inspect.isclass(value)
        assert type(value).__dataclass_params__.frozen


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_declares_through_the_three(name):
    cls = METHODS[name]
    assert not [old for old in OLD_DECLARATIONS if hasattr(cls, old)]
    for attr, kind in DECLARATIONS.items():
        assert isinstance(getattr(cls, attr), kind)
    assert cls.requires.backbone_only == bool(cls.requires.model_train)


def test_the_declarations_are_frozen_through_and_through_and_pickle():
    sends = Sends(broadcast={"round": ["u", "v"]}, client_events=["round"])
    assert sends.broadcast["round"] == ("u", "v") and sends.client_events == ("round",)
    with pytest.raises(TypeError):
        sends.broadcast["task_end"] = ("w",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sends.client_events = ()
    requires = Requires(unread_keys={"server_lr": "own"}, model_train="lora")
    with pytest.raises(TypeError):
        requires.unread_keys["lr"] = "x"
    assert requires.backbone_only and not Requires().backbone_only
    for value in (sends, requires, Computes(ragged={"bases": 1})):
        assert pickle.loads(pickle.dumps(value)) == value == copy.deepcopy(value)


@pytest.mark.parametrize(("make", "words"), [
    (lambda: Sends(client_events=("epoch",)), "Sends.client_events names the event(s) ['epoch']"),
    (lambda: Sends(broadcast={"task_begin": ()}), "Sends.broadcast names the event(s) ['task_begin']"),
    (lambda: Sends(broadcast={"round": ("a",), "task_start": ("a",)}), "under both 'round' and 'task_start'"),
    (lambda: Sends(server_task_end="never"), "Sends.server_task_end names the value ['never']"),
    (lambda: Requires(scenarios=("online",)), "Requires.scenarios names the scenario(s) ['online']"),
    (lambda: Requires(model_train="adapters"), "Requires.model_train names the training mode ['adapters']"),
    (lambda: Computes(ragged={"bases": "1"}), "Computes.ragged maps ['bases'] to no dimension"),
])
def test_a_bad_declaration_is_refused_when_made(make, words):
    with pytest.raises(TypeError) as err:
        make()
    assert words in str(err.value)


def test_a_declaration_of_another_type_is_refused_when_the_class_is_defined():
    with pytest.raises(TypeError, match=r"Bad.sends is \{'broadcast': \{\}\}; declare sends = Sends\(...\)"):
        type("Bad", (Method,), {"name": "bad", "sends": {"broadcast": {}}})


def test_a_class_of_the_old_interface_is_refused_naming_each_old_name_and_its_replacement():
    with pytest.raises(ConfigError) as err:
        type("Old", (Method,), {"name": "old", "client_events": ("task_end",), "ragged": {"b": 1}, "models": ()})
    message = str(err.value)
    for old in ("client_events", "ragged", "models"):
        assert f"{old} -> {OLD_DECLARATIONS[old]}" in message
    assert "broadcast ->" not in message and 'docs/plugins.md, "Declarations"' in message
    with pytest.raises(ConfigError, match="scenarios -> requires=Requires"):  # inherited from a mixin too
        type("Mixed", (type("Mixin", (), {"scenarios": ("class",)}), Method), {"name": "mixed"})
