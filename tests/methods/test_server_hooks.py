"""The server side's hook contexts (cfl/methods/server_hooks.py): each carries every argument of the hooks it
replaced, and the declarations the engine reads are checked when a class is made."""

from __future__ import annotations

import dataclasses

import pytest

from cfl.methods.base import Method, Sends
from cfl.methods.server_hooks import SERVER_EVENTS, ServerChange, ServerEvent, ServerUpdate, TransformUpdate

#: the old hooks' arguments -> the context that carries them now
OLD = {ServerEvent: {"server_start": ("server", "global_params"),
                     "before_task_end": ("model", "classes", "server", "task"),
                     "server_end": ("event", "uploads", "server", "task"),
                     "after_server_step": ("model", "global_params", "server", "task"),
                     "backbone_update": ("model", "global_params", "server", "task")},
       ServerUpdate: {"server_update": ("global_params", "delta", "server", "server_lr")},
       TransformUpdate: {"transform_update": ("delta", "server", "task")}}


@pytest.mark.parametrize("context", list(OLD))
def test_a_context_carries_every_argument_of_the_hooks_it_replaced(context):
    fields = {f.name for f in dataclasses.fields(context)}
    for hook, arguments in OLD[context].items():
        assert set(arguments) <= fields, hook
        assert context is not ServerEvent or not hasattr(Method, hook), hook  # no compatibility layer


def test_the_moments_and_the_change():
    assert SERVER_EVENTS == ("start", "round", "before_task_end", "task_end")
    assert ServerChange().params == {} and ServerChange().backbone is None
    with pytest.raises(TypeError, match=r"Sends.server_events names the moment\(s\) \['server_end'\]"):
        Sends(server_events=("server_end",))
