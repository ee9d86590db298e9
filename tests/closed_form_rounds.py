"""Rounds of a closed-form classifier (cfl/methods/closed_form.py) driven by hand: each task's samples dealt at random
to three clients, which send their statistics over two rounds, the server summing and solving after each."""

from __future__ import annotations

import torch

from cfl.methods.base import ClientData, RunInfo
from cfl.methods.closed_form import ClosedFormHead
from cfl.methods.server_hooks import ServerEvent
from cfl.methods.training_hooks import ClientEndContext


def federated(method: ClosedFormHead, info: RunInfo, tasks: list, split: int) -> tuple[dict, dict]:
    """``tasks`` in the stream's order, each one's samples dealt at random (``split``) to 3 clients, a random
    subset of which sends at the task's first round and the rest at its second: the final global head and the
    server's sums."""
    g = torch.Generator().manual_seed(split)
    server, states = {}, [{} for _ in range(3)]
    params = {k: v.detach().clone() for k, v in info.model.named_parameters()}
    for task, (x, y) in enumerate(tasks):
        owner = torch.randint(0, 3, (len(y),), generator=g)
        first = set(torch.randperm(3, generator=g)[: 1 + split % 2].tolist())
        for rnd in range(2):
            uploads = {}
            for c in range(3) if rnd else sorted(first):
                data = ClientData(x[owner == c], y[owner == c], task)
                up = method.client_end(ClientEndContext("round", info.model, params, data, states[c], {}, None))
                if up is not None:
                    uploads[c] = up
            assert len(uploads) == (len(first) if rnd == 0 else 3 - len(first))  # once per client and task
            change = method.server_event(ServerEvent("round", server, task, params, uploads, info.model))
            params.update(change.params if change is not None else {})
    return params, server
