"""Parameters kept per client (``Method.param_roles``), each client's starting parameters (``client_start``) and
a method's own upload and aggregation of the shared parameters (``client_upload``, ``server_aggregate``).

A method's local parameters live in its client state under ``state["local"]`` (so they are checkpointed, kept
in the client-state store and sized by ``count_bytes("client_state")``): loaded into the client's starting parameters at
each of its rounds (the global model's values, i.e. the template's, before its first), written back after
training, left out of the aggregation (the global model keeps the template's values) and out of the model bytes
sent each way. Only the sequential trainer starts clients from their own parameters (:mod:`cfl.engine.local.path`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from cfl.config.schema import ConfigError
from cfl.engine.hook_call import call
from cfl.engine.hook_rules import (
    check_client_start,
    check_client_upload,
    check_roles,
    check_server_aggregate,
)
from cfl.engine.local import hooks
from cfl.engine.local.jobs import ClientJob
from cfl.engine.rounds.server_state import counted
from cfl.methods.base import Method, overrides
from cfl.methods.declarations import gives
from cfl.methods.traffic_hooks import ParamNames, Payload, StackedUploads, TrainedClient
from cfl.records.client_states import MethodState
from cfl.tensors import Params, State, nbytes

#: the client-state key of a method's local parameters
LOCAL = "local"


class ClientParams:
    """The run's per-client parameters: which are local (per method), which frozen, who starts and uploads."""

    def __init__(self, methods: list[Method], names: list[str]) -> None:
        self.methods = methods
        roles = [call(m, "param_roles", ParamNames(tuple(names)), use=lambda roles: check_roles(roles, names))
                 for m in methods]
        self.local: list[list[str]] = [own for own, _ in roles]
        self.frozen: frozenset[str] = frozenset(n for _, frozen in roles for n in frozen)
        taken: dict[str, str] = {}
        for m, own in zip(methods, self.local, strict=True):
            for n in own:
                if n in taken:
                    raise ConfigError(f"methods {taken[n]} and {m.name} both keep parameter {n!r} per client; a "
                                      "parameter has one owner: drop one from method/plugins")
                taken[n] = m.name
        self.local_names = frozenset(taken)
        self.starting = [i for i, m in enumerate(methods) if gives(m, "params")]
        self.uploading = [i for i, m in enumerate(methods) if overrides(m, "client_upload")]

    @property
    def active(self) -> bool:
        """Whether clients start from anything but the global model."""
        return bool(self.local_names or self.starting)

    def shared(self, params: Params) -> Params:
        """The parameters the server holds for every client (those sent each way)."""
        return {k: v for k, v in params.items() if k not in self.local_names}

    def starts(self, jobs: list[ClientJob], params: Params, states: list[MethodState], servers: list[State],
               task: int) -> dict[int, Params]:
        """Each sampled client's starting parameters: the global model with its local parameters, then every
        ``client_start`` (whose state changes are written back)."""
        out = {}
        for job in jobs:
            start = dict(params)
            client = [st.clients.get(job.cid) for st in states]
            for own, state in zip(self.local, client, strict=True):
                start.update({k: state[LOCAL][k] for k in own if k in state.get(LOCAL, {})})
            for i in self.starting:
                start = hooks.client_start(self.methods[i], "params", lambda new, old=start: check_client_start(
                    old if new is None else new, params), server=servers[i], state=client[i], params=start, task=task)
            for i in sorted({*self.starting, *(i for i, own in enumerate(self.local) if own)}):
                if self.local[i]:
                    client[i][LOCAL] = {k: start[k].detach().clone() for k in self.local[i]}
                states[i].clients.put(job.cid, client[i])
            out[job.cid] = start
        return out

    def keep_trained(self, trained: Params, jobs: list[ClientJob], keep: torch.Tensor,
                     states: list[MethodState]) -> None:
        """The kept clients' trained local parameters into their states (a dropped client's stay its start's,
        written by :meth:`starts`)."""
        rows = keep.nonzero().flatten().tolist()
        kept = [j for j, ok in zip(jobs, keep.tolist(), strict=True) if ok]
        for i, own in enumerate(self.local):
            if own:
                clients = states[i].clients
                for job, row in zip(kept, rows, strict=True):
                    state = clients.get(job.cid)
                    state[LOCAL] = {k: trained[k][row].detach().clone() for k in own}
                    clients.put(job.cid, state)

    def uploads(self, trained: Params, jobs: list[ClientJob], keep: torch.Tensor, params: Params,
                states: list[MethodState]) -> tuple[Params, list[int]]:
        """The uploading method's ``client_upload`` on each kept client, combined by its ``server_aggregate``:
        the new global values of the parameters it sends, and each client's bytes (``count_bytes``)."""
        if not self.uploading:
            return {}, []
        i = self.uploading[0]
        method, clients = self.methods[i], states[i].clients
        rows = keep.nonzero().flatten().tolist()
        kept = [j for j, ok in zip(jobs, keep.tolist(), strict=True) if ok]
        sent, info, sizes = [], [], []
        for job, row in zip(kept, rows, strict=True):
            state = clients.get(job.cid)
            s, n = call(method, "client_upload", TrainedClient({k: v[row] for k, v in trained.items()}, state),
                        use=lambda upload: check_client_upload(upload, params, self.local_names))
            size = counted(method, Payload("client_upload", sent=s, info=n))
            sizes.append(nbytes(s) if size is None else size)
            clients.put(job.cid, state)
            sent.append(s)
            info.append(n)
        stacked_sent = {k: torch.stack([s[k] for s in sent]) for k in sent[0]}
        stacked_info = {k: torch.stack([n[k] for n in info]) for k in info[0]}
        combined = call(method, "server_aggregate", StackedUploads(stacked_sent, stacked_info),
                        use=lambda combined: check_server_aggregate(combined, sent[0], params))
        return combined, sizes

    def evaluated(self, params: Params, states: list[MethodState]) -> Iterator[Params]:
        """The models evaluation averages over: each client's own (the global model with its local parameters),
        for the clients holding local parameters; the global model alone where none does."""
        owners = [i for i, own in enumerate(self.local) if own]
        cids = sorted({c for i in owners for c in states[i].clients.ids()})
        found = False
        for c in cids:
            held = [states[i].clients.get(c).get(LOCAL) for i in owners]
            if not any(held):  # a state written by a hook of a client that has not trained yet
                continue
            model = dict(params)
            for own in held:
                model.update(own or {})
            found = True
            yield model
        if not found:
            yield params


