"""The traffic and parameter-role hooks take one context each (cfl/methods/traffic_hooks.py): every field the old
arguments were, the old hook names gone from ``Method``, and ``count_bytes`` asked for exactly the kinds of
:data:`PayloadKind` by a run."""

from __future__ import annotations

import dataclasses
import inspect

import torch

from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import (
    PER_CLIENT_HOOKS,
    Method,
    ParamNames,
    ParamRoles,
    Payload,
    Sends,
    StackedUploads,
    TrainedClient,
)
from cfl.methods.traffic_hooks import PAYLOAD_KINDS
from tests.conftest import make_stream, tiny_config

#: each old hook -> its arguments then, and the context (and field) now carrying each
OLD = {
    "local_params": (ParamNames, {"names": "names"}),
    "frozen_params": (ParamNames, {"names": "names"}),
    "client_upload": (TrainedClient, {"params": "params", "state": "state"}),
    "server_aggregate": (StackedUploads, {"sent": "sent", "info": "info"}),
    "upload_bytes": (Payload, {"sent": "sent", "info": "info"}),
    "payload_bytes": (Payload, {"event": "kind", "payload": "payload"}),
    "client_state_bytes": (Payload, {"sizing": "sizing"}),
}


def test_a_context_carries_every_field_the_old_arguments_did():
    for old, (context, fields) in OLD.items():
        have = {f.name for f in dataclasses.fields(context)}
        assert set(fields.values()) <= have, (old, context, have)
    assert {f.name for f in dataclasses.fields(ParamRoles)} == {"local", "frozen"}  # local_params + frozen_params
    for hook in ("param_roles", "client_upload", "server_aggregate", "count_bytes"):
        assert list(inspect.signature(getattr(Method, hook)).parameters) == ["self", "ctx"], hook


def test_the_old_hook_names_are_gone_and_the_path_choice_reads_param_roles():
    for old in ("local_params", "frozen_params", "upload_bytes", "payload_bytes", "client_state_bytes"):
        assert not hasattr(Method, old), old
    assert PER_CLIENT_HOOKS == ("param_roles", "client_start", "client_upload", "server_aggregate")


def test_the_defaults_keep_the_old_ones():
    m = Method(None, None)
    assert m.param_roles(ParamNames(("a", "b"))) == ParamRoles((), ())
    assert m.client_upload(TrainedClient({}, {})) == ({}, {})
    sent = {"a": torch.tensor([[1.0, 2.0], [3.0, 6.0]])}
    assert torch.equal(m.server_aggregate(StackedUploads(sent, {}))["a"], torch.tensor([2.0, 4.0]))
    assert all(m.count_bytes(Payload(kind)) is None for kind in PAYLOAD_KINDS)


class EveryKind(Method):
    """Broadcasts at every event, uploads at rounds and task ends, sends its own parameter upload, and records each
    kind ``count_bytes`` is asked for."""

    name = "every-kind"
    sends = Sends(broadcast={"round": ("r",), "task_start": ("s",), "task_end": ("e",)}, server_events=("start",))
    kinds: set[str] = set()

    def server_event(self, ctx):
        ctx.server.update(r=torch.ones(1), s=torch.ones(2), e=torch.ones(3))

    def client_upload(self, ctx):
        return {"body.1.bias": ctx.params["body.1.bias"].detach().clone()}, {"n": torch.ones(1)}

    def server_aggregate(self, ctx):
        return {k: v.mean(0) for k, v in ctx.sent.items()}

    def client_end(self, ctx):
        ctx.state["seen"] = torch.ones(1)
        return {"u": torch.ones(4)}

    def count_bytes(self, ctx):
        EveryKind.kinds.add(ctx.kind)
        return 16 if ctx.kind == "client_state" else None


def test_the_engine_counts_exactly_the_kinds_of_payload_kind():
    EveryKind.kinds = set()
    with METHODS.temporarily(EveryKind.name, EveryKind):
        cfg = tiny_config(method={"name": EveryKind.name}, num_clients=3, clients_per_round=2, rounds_per_task=2)
        Runner(cfg, make_stream("task", num_tasks=2, dim=12)).run()
    assert EveryKind.kinds == set(PAYLOAD_KINDS)
