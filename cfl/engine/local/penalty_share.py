"""Each quadratic penalty's share of its clients' local loss, in ``method_stats``: a penalty too
weak to change anything (EWC at its default ``lam`` on split-fmnist gave FedAvg's accuracy matrix digit for digit)
shows as a share near 0.

Per round and per method giving ``round_terms``' ``penalty``, for each kept client: ``P / (L + P)``, with ``P`` the
quadratic terms of the penalty (a linear term, SCAFFOLD's and FedDyn's corrections ``<c, w>``, is a gradient shift
with no loss value of its own: left out; a method with linear terms only reports no share) at the client's
parameters after its local training (from the round's global model, its broadcast and its state, as its steps took
it) and ``L`` its task loss (the round's ``train_loss`` of the client: the mean over its steps of the weighted
cross-entropy, no penalty). The shares are summed on the device and read once per round and method (no per-step host
sync; the stacked path never forms a penalty's value in its steps). The method's server state ``stats`` keeps, per
task and over the run, the mean over the kept clients of every round.
"""

from __future__ import annotations

import torch

from cfl.engine.local import hooks
from cfl.engine.local.jobs import ClientOutcome
from cfl.methods.base import Method
from cfl.methods.declarations import gives
from cfl.records.client_states import MethodState
from cfl.tensors import Params, State


def client_shares(method: Method, state: MethodState, broadcast: State, global_params: Params, trained: Params,
                  outcomes: list[ClientOutcome], keep: list[bool]) -> tuple[torch.Tensor, int] | None:
    """The sum over the kept clients of ``P / (L + P)`` (a device scalar) and their count; None for none."""
    rows = [(c, o) for c, (o, ok) in enumerate(zip(outcomes, keep, strict=True)) if ok and o.finite]
    if not rows:
        return None
    values = [hooks.penalty_loss(method, {k: v[c] for k, v in trained.items()}, global_params, broadcast,
                                 state.clients.get(o.cid), linear_terms=False) for c, o in rows]
    if all(v is None for v in values):  # linear terms only (SCAFFOLD's correction): no loss value of their own
        return None
    device = next(iter(global_params.values())).device
    penalties = torch.stack([torch.zeros((), device=device) if v is None else v.detach().float() for v in values])
    losses = torch.tensor([o.mean_loss for _, o in rows], dtype=penalties.dtype, device=penalties.device)
    total = penalties + losses
    shares = torch.where(total > 0, penalties / total.clamp_min(torch.finfo(total.dtype).tiny), 0.0)
    return shares.sum(), len(rows)


def record_round(methods: list[Method], states: list[MethodState], broadcasts: list[State], global_params: Params,
                 trained: Params, outcomes: list[ClientOutcome], keep: list[bool], task: int) -> None:
    """Add the round's shares to each penalising method's ``stats`` (``penalty_share``, its mean over the run's
    kept clients and rounds; ``penalty_share_by_task``; the client-rounds each is over)."""
    with torch.no_grad():
        for method, state, broadcast in zip(methods, states, broadcasts, strict=True):
            if not gives(method, "penalty"):
                continue
            summed = client_shares(method, state, broadcast, global_params, trained, outcomes, keep)
            if summed is None:
                continue
            value, n = float(summed[0]), summed[1]  # the one read of the round
            stats = state.server.setdefault("stats", {})
            by_task = stats.setdefault("penalty_share_by_task", {})
            counts = stats.setdefault("penalty_share_client_rounds_by_task", {})
            key = str(task)
            done = counts.get(key, 0)
            by_task[key] = (by_task.get(key, 0.0) * done + value) / (done + n)
            counts[key] = done + n
            everything = sum(counts.values())
            stats["penalty_share"] = (stats.get("penalty_share", 0.0) * (everything - n) + value) / everything
