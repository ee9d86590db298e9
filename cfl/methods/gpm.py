"""GPM+FL: Gradient Projection Memory (Saha, Garg, Roy; ICLR 2021, arXiv 2103.09762) run by each client.

At each task end every client holding data of the task collects the layer inputs of the global model on
its local data, keeps the top directions of their residual (outside its basis) by GPM's energy criterion
(``eps``, plus ``eps_inc`` per task) and extends its *own* basis ``M``. Every later local step projects
the gradient off it: ``g <- g - (g M) M^T`` (conv weights in im2col order). Nothing is sent: the "local
knowledge only" baseline FOT improves on. See docs/methods/gpm.md.

Reference thresholds as for FOT: Permuted MNIST 0.96 IID / 0.94 non-IID, inc 0; Split CIFAR-100 0.87,
+0.001; 5-Datasets 0.95, +0.001; Mini-ImageNet 0.90, +0.001.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cfl.methods.base import ClientData, Method, MethodState, Params, State
from cfl.metrics.comm import nbytes
from cfl.ops.layer_inputs import layer_grams
from cfl.ops.subspace import energy_rank, extend_basis, gram_spectrum, project_out
from cfl.schema import field


@dataclass(frozen=True)
class GPMParams:
    eps: float = field(0.96, "GPM energy threshold (0.96 PMNIST IID, 0.94 non-IID; see docs)", gt=0.0, max=1.0)
    eps_inc: float = field(0.0, "added to eps for each later task", min=0.0)
    chunk: int = field(256, "samples per forward pass when collecting layer inputs (bounds memory)", min=1)


def extend_from_gram(gram: torch.Tensor, basis: torch.Tensor | None, eps: float) -> torch.Tensor:
    """GPM step for one layer from ``A A^T``: keep the residual's top directions by the energy criterion."""
    d = gram.shape[0]
    gram = gram.double()
    total = float(gram.trace())
    if basis is not None and basis.shape[1] > 0:
        outside = torch.eye(d, dtype=gram.dtype, device=gram.device) - basis.double() @ basis.double().T
        gram = outside @ gram @ outside
    ratio = float(gram.trace()) / total if total > 0 else 0.0
    vectors, svals = gram_spectrum(gram)
    have = 0 if basis is None else basis.shape[1]
    k = min(energy_rank(svals, eps, ratio), d - have)
    return extend_basis(basis, vectors[:, :k]).float()


class GPM(Method):
    name = "gpm"
    about = "GPM+FL: each client projects its local gradients off its own old-task input bases"
    Params = GPMParams
    has_grad_transform = True

    def transform_grads(self, grads: Params, state: State) -> Params:
        return {k: project_out(g, state[k]) if k in state else g for k, g in grads.items()}

    def stack_states(self, states: list[State]) -> State:
        """Stack client bases, zero-padded to the widest (zero columns project nothing)."""
        out = {}
        for name in self.run.protected:
            present = [s[name] for s in states if name in s]
            if not present:
                continue
            d, width = present[0].shape[0], max(b.shape[1] for b in present)
            padded = []
            for s in states:
                b = s.get(name, present[0].new_zeros(d, 0))
                padded.append(torch.cat([b, b.new_zeros(d, width - b.shape[1])], 1))
            out[name] = torch.stack(padded)
        return out

    def task_end_client(self, model: nn.Module, params: Params, data: ClientData, state: State,
                        broadcast: State, generator: torch.Generator) -> None:
        if len(data.x) == 0:
            return None
        eps = min(1.0, self.p.eps + data.task * self.p.eps_inc)
        grams = layer_grams(model, params, data.x, data.task, self.run.protected, self.p.chunk)
        for name, gram in grams.items():
            state[name] = extend_from_gram(gram, state.get(name), eps)
        return None

    def stats(self, state: MethodState) -> dict[str, Any]:
        sizes = [nbytes(s) for s in state.clients.values()]
        fractions: dict[str, list[float]] = {}
        for s in state.clients.values():
            for name, b in s.items():
                fractions.setdefault(name, []).append(b.shape[1] / b.shape[0])
        return {
            "clients_with_state": len(sizes),
            "client_state_bytes_mean": sum(sizes) / len(sizes) if sizes else 0.0,
            "client_state_bytes_max": max(sizes, default=0),
            "basis_fraction_mean": {n: sum(f) / len(f) for n, f in fractions.items()},
            "basis_fraction_max": {n: max(f) for n, f in fractions.items()},
        }
