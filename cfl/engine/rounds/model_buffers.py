"""The global model's BatchNorm running statistics through a round (``model.buffers``, docs/concepts.md).

``averaged``: every sampled client starts from the global buffers (sent down with the parameters), its training
forwards update its copy, and the server replaces the global buffers by the kept clients' weighted mean (weights:
their sample counts, as the parameters'): running means and variances averaged in their dtype,
``num_batches_tracked`` the weighted mean rounded down (the official TARGET/MFCL code averages the whole state
dict and loads the mean back into the integer buffer, which truncates it; BatchNorm reads it only when its
``momentum`` is None). The buffers take no part in the server step of the parameters (no ``server_lr``, GMA mask,
server optimiser or FOT projection): they are statistics, not a descent direction.

``local`` (FedBN, Li et al. 2021): each client keeps its own buffers between its rounds (in ``ClientStates``,
checkpointed with the run) and starts from them, or from the model's initial statistics (BatchNorm's: mean 0,
variance 1, count 0) on its first round; nothing is sent down. cfl evaluates one global model, so the kept
clients upload their buffers and the global ones become their weighted mean as above: what evaluation and the
server hooks use (the upload bytes count them).
"""

from __future__ import annotations

import torch

from cfl.engine.local.jobs import ClientJob, ClientOutcome
from cfl.records.client_states import ClientStates
from cfl.tensors import Params, nbytes


def averaged(client_buffers: list[Params], weights: torch.Tensor) -> Params:
    """The weighted mean of the clients' buffers (``weights``: their sample counts); integer buffers
    (``num_batches_tracked``) get the weighted mean rounded down."""
    shares = (weights / weights.sum()).to(torch.float64)
    out: Params = {}
    for k, like in client_buffers[0].items():
        stacked = torch.stack([b[k] for b in client_buffers])
        if like.is_floating_point():
            out[k] = torch.tensordot(shares.to(like.dtype), stacked, dims=1)
        else:
            out[k] = torch.tensordot(shares, stacked.to(torch.float64), dims=1).floor().to(like.dtype)
    return out


def hand_out(jobs: list[ClientJob], global_buffers: Params, local: ClientStates | None, initial: Params) -> None:
    """Each job's starting buffers: the global ones, or under ``local`` the client's own, and on a client's first
    round the model's ``initial`` statistics (nothing comes from the server)."""
    if not global_buffers:
        return
    for job in jobs:
        job.buffers = global_buffers if local is None else (local.get(job.cid) or initial)


def collect(outcomes: list[ClientOutcome], weights: torch.Tensor, local: ClientStates | None) -> Params:
    """The new global buffers from the kept clients' ``outcomes``; under ``local`` each client's are kept too."""
    if local is not None:
        for o in outcomes:
            local.put(o.cid, {k: v.clone() for k, v in o.buffers.items()})
    return averaged([o.buffers for o in outcomes], weights)


def download_bytes(buffers: Params, local: ClientStates | None) -> int:
    """Bytes of the buffers sent down with the global model to one client (none under ``local``)."""
    return 0 if local is not None else nbytes(buffers)


def announcement(buffers: Params, setting: str) -> str:
    """The line a run with running statistics prints once: what happens to them."""
    what = f"model buffers: {len(buffers)} BatchNorm running-statistics tensors ({nbytes(buffers)} bytes)"
    if setting == "local":
        return (f"{what} kept by each client (model.buffers: local, FedBN); evaluation and the server hooks use their "
                "sample-weighted mean over the last round's clients, who upload them")
    return f"{what} averaged by the server, weighted by sample counts, and sent with the model (model.buffers: " \
        "averaged)"
