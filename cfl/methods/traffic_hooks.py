"""The contexts of the traffic and parameter-role hooks (``Method.param_roles``, ``client_upload``,
``server_aggregate``, ``count_bytes``): one frozen dataclass each, so a new field needs no new argument, and
:data:`PayloadKind`, the kinds of payload the engine counts (shared by the engine, the docs and the tests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from cfl.methods.hook_types import StateSizing
from cfl.tensors import Params, State

#: what ``count_bytes`` is asked to count: ``client_upload`` one client's ``client_upload`` (``sent`` and
#: ``info``); ``round_upload`` / ``task_end_upload`` one client's ``client_end`` upload of a round / a task end;
#: ``round`` / ``task_start`` / ``task_end`` one client's copy of the broadcast of that event (``sends.broadcast``);
#: ``client_state`` the estimate of all clients' state (``sizing``)
PayloadKind = Literal["client_upload", "round_upload", "task_end_upload", "round", "task_start", "task_end",
                      "client_state"]
PAYLOAD_KINDS: tuple[PayloadKind, ...] = get_args(PayloadKind)


@dataclass(frozen=True)
class ParamNames:
    """What ``param_roles`` sees: the model's parameter names."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class ParamRoles:
    """What ``param_roles`` returns: the parameters each client keeps as its own (``local``) and those no optimiser
    step moves (``frozen``), each some of ``ParamNames.names``."""

    local: tuple[str, ...] | list[str] = ()
    frozen: tuple[str, ...] | list[str] = ()


@dataclass(frozen=True)
class TrainedClient:
    """What ``client_upload`` sees: one kept client's trained model (``params``) and its state (may be updated in
    place)."""

    params: Params
    state: State


@dataclass(frozen=True)
class StackedUploads:
    """What ``server_aggregate`` sees: the round's kept clients' ``client_upload`` results, stacked ``(C, ...)``."""

    sent: Params
    info: Params


@dataclass(frozen=True)
class Payload:
    """What ``count_bytes`` sees: the ``kind`` counted and its tensors: ``payload`` (a ``client_end`` upload or a
    broadcast), ``sent`` and ``info`` (``client_upload``), or ``sizing`` (``client_state``)."""

    kind: PayloadKind
    payload: State = field(default_factory=dict)
    sent: Params = field(default_factory=dict)
    info: Params = field(default_factory=dict)
    sizing: StateSizing | None = None
