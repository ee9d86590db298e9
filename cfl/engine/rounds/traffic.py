"""The bytes a round and a task end send over the network, written to the run's ledger
(:class:`cfl.records.comm.CommLedger`, with its named lines for the tables): down, the global model and each
method's broadcasts (``"round"`` keys with every model, ``"task_start"`` keys once per client and task, a changed
shared backbone once per client); up, the kept clients' models (a method's own ``client_upload`` in place of the
dense bytes of what it sends) and each method's ``client_end`` uploads. Sizes are the tensors' own bytes or a
method's ``count_bytes``."""

from __future__ import annotations

from typing import Any

from cfl.engine.rounds.server_state import payload_size
from cfl.engine.rounds.shared_backbone import LINE as BACKBONE_LINE
from cfl.methods.base import Method
from cfl.records.comm import CommLedger, task_end_model_line, task_start_line
from cfl.tensors import Params, State, nbytes


def round_upload(methods: list[Method], kept: int, model_bytes: int, buffers: Params, params: Params,
                 combined: Params, sent_sizes: list[int], payloads: list[dict[int, Any]]) -> int:
    """Bytes the round's ``kept`` clients send: each its model (``model_bytes`` of parameters and its ``buffers``),
    less the dense bytes of the parameters a method ``combined`` from its own uploads (``sent_sizes``, counted in
    their place), and every method's ``client_end("round")`` uploads (``payloads``, one dict per method)."""
    sent_dense = nbytes({k: params[k] for k in combined})
    up = kept * (model_bytes + nbytes(buffers) - sent_dense) + sum(sent_sizes)
    return up + sum(payload_size(m, "round_upload", u) for m, pl in zip(methods, payloads, strict=True)
                    for u in pl.values())


def record_round(comm: CommLedger, methods: list[Method], clients: int, per_client: int, backbone: int,
                 task_start: list[State], newcomers: list[list[int]], up: int) -> int:
    """The round's bytes on ``comm``: ``per_client`` (the model and the ``"round"`` broadcasts) to each of its
    ``clients``, ``backbone`` (the changed backbone tensors its clients had not received), each method's
    ``task_start`` payload to its ``newcomers`` (on the method's line), and ``up``. Returns the round's download."""
    down = clients * per_client
    if backbone:  # a backbone changed since these clients' last round: the changed tensors, once each
        comm.down(backbone, line=BACKBONE_LINE)
        down += backbone
    comm.down(down)
    for m, payload, new in zip(methods, task_start, newcomers, strict=True):
        if m.sends.broadcast.get("task_start"):
            comm.down(len(new) * payload_size(m, "task_start", payload), line=task_start_line(m.name))
            down += len(new) * payload_size(m, "task_start", payload)
    comm.up(up)
    return down


def record_task_end(comm: CommLedger, method: Method, clients: int, model_download: int, broadcast: State,
                    uploads: dict[int, Any]) -> None:
    """A task end's bytes of ``method`` on ``comm``: the final global model (``model_download`` bytes, on the
    method's line, where it ``downloads_model_at_task_end``) and its ``"task_end"`` broadcast to each of its
    ``clients``, and their ``uploads``."""
    if method.sends.downloads_model_at_task_end:
        comm.down(clients * model_download, line=task_end_model_line(method.name))
    comm.down(clients * payload_size(method, "task_end", broadcast))
    comm.up(sum(payload_size(method, "task_end_upload", u) for u in uploads.values()))
