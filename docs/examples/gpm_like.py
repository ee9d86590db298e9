"""A GPM-like gradient projection as a cfl plugin (after Saha, Garg & Roy, ICLR 2021, arXiv 2103.09762).

At each task end a client keeps, per protected layer, the top eigenvectors of its layer inputs' Gram
matrix ``A A^T`` on the task's final global model (those holding ``energy`` of it), orthogonal to what it
already keeps. Later local steps project each protected weight's gradient off them (the engine applies
``g <- g - (g M) M^T``). The bases differ in width between clients: declared ``ragged``.

Run it with:  cfl run configs/quickstart.yaml --plugin docs/examples/gpm_like.py --set method.name=gpm-like
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.plugin import (
    ClientEndContext,
    ClientRound,
    Computes,
    Method,
    RoundTerms,
    Sends,
    field,
    layer_grams,
    register,
)


@dataclass(frozen=True)
class GPMLikeHyperparams:
    energy: float = field(0.95, "fraction of the new inputs' energy the kept directions hold", gt=0.0, max=1.0)


@register
class GPMLike(Method):
    name = "gpm-like"
    about = "GPM-like: project local gradients off each client's old-task input directions (example plugin)"
    Hyperparams = GPMLikeHyperparams
    computes = Computes(terms=("projection",), ragged={"bases": 1})  # (d, k): k differs between clients
    sends = Sends(client_events=("task_end",))  # nothing to do after rounds

    def round_terms(self, ctx: ClientRound) -> RoundTerms:
        return RoundTerms(projection=dict(ctx.state.get("bases", {})))

    def client_end(self, ctx: ClientEndContext) -> None:
        model, params, data, state = ctx.model, ctx.params, ctx.data, ctx.state
        if len(data.x) == 0:
            return
        bases = state.setdefault("bases", {})
        for name, gram in layer_grams(model, params, data.x, data.task, self.run_info.protected).items():
            old = bases.get(name)
            if old is not None:  # what the kept directions already explain is not new
                outside = torch.eye(len(gram), dtype=gram.dtype) - old.double() @ old.double().T
                gram = outside @ gram @ outside
            values, vectors = torch.linalg.eigh(gram)  # ascending
            values, vectors = values.flip(0).clamp_min(0), vectors.flip(1)
            share = values.cumsum(0) / values.sum().clamp_min(1e-30)
            room = len(gram) - (0 if old is None else old.shape[1])
            k = min(int((share < self.hparams.energy).sum()) + 1, room)
            if k == 0:
                continue
            new = vectors[:, :k].float()
            bases[name] = new if old is None else torch.linalg.qr(torch.cat([old, new], 1))[0]
