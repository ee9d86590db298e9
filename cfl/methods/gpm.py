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

import math
from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.base import ClientEndContext, ClientRound, Computes, Method, Payload, RoundTerms, Sends
from cfl.methods.bounds import SAMPLES_MAX
from cfl.ops.layer_inputs import HeldInputs, layer_inputs_or_grams
from cfl.ops.subspace import energy_rank, extend_basis, gram_residual_spectrum, thin_residual_spectrum


@dataclass(frozen=True)
class GPMHyperparams:
    eps: float = field(0.96, "GPM energy threshold (0.96 PMNIST IID, 0.94 non-IID; see docs)", gt=0.0, max=1.0)
    eps_inc: float = field(0.0, "added to eps for each later task (at most 1: eps above 1 keeps every "
                           "direction)", min=0.0, max=1.0)
    chunk: int = field(256, "samples per forward pass when collecting layer inputs (bounds memory)",
                       min=1, max=SAMPLES_MAX)


def extend_from_gram(gram: torch.Tensor, basis: torch.Tensor | None, eps: float) -> torch.Tensor:
    """GPM step for one layer from ``A A^T``: keep the residual's top directions by the energy criterion."""
    return _extend(gram_residual_spectrum(gram, basis), basis, eps)


def extend_from_inputs(inputs: torch.Tensor, basis: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The same GPM step from ``A`` itself (d x n), through the residual's n x n Gram, for clients with ``n < d``."""
    return _extend(thin_residual_spectrum(inputs, basis), basis, eps)


def extend_from_held(held: HeldInputs, basis: torch.Tensor | None, eps: float) -> torch.Tensor:
    """GPM step on one layer's inputs as the client holds them: thin (``n < d``) or as their Gram."""
    return (extend_from_gram if held.is_gram else extend_from_inputs)(held.matrix, basis, eps)


def _extend(spectrum: tuple[torch.Tensor, torch.Tensor, float], basis: torch.Tensor | None,
            eps: float) -> torch.Tensor:
    vectors, svals, ratio = spectrum
    have = 0 if basis is None else basis.shape[1]
    k = min(energy_rank(svals, eps, ratio), vectors.shape[0] - have)
    return extend_basis(basis, vectors[:, :k]).float()


class GPM(Method):
    name = "gpm"
    about = "GPM+FL: each client projects its local gradients off its own old-task input bases"
    Hyperparams = GPMHyperparams
    computes = Computes(terms=("projection",), ragged={"bases": 1})  # k differs between clients
    sends = Sends(client_events=("task_end",))

    def round_terms(self, ctx: ClientRound) -> RoundTerms:
        return RoundTerms(projection=dict(ctx.state.get("bases", {})))

    def count_bytes(self, ctx: Payload) -> int | None:
        """A float32 basis ``(d, k)`` per protected layer, ``k <= d``; for a linear layer ``k`` is also at most the
        client's samples over all tasks (the rank of its layer inputs). With the clients' mean samples this
        bounds the total, as ``min(d, n)`` is concave in ``n``."""
        return None if (s := ctx.sizing) is None else s.num_clients * 4 * sum(
            d * (min(d, math.ceil(s.samples_per_client * s.num_tasks)) if kind == "linear" else d)
            for kind, d in s.protected.values())

    def client_end(self, ctx: ClientEndContext) -> None:
        model, params, data, state = ctx.model, ctx.params, ctx.data, ctx.state
        if len(data.x) == 0:
            return
        eps = min(1.0, self.hparams.eps + data.task * self.hparams.eps_inc)
        held = layer_inputs_or_grams(model, params, data.x, data.task, self.run_info.protected, self.hparams.chunk)
        bases = state.setdefault("bases", {})
        for name, inputs in held.items():
            bases[name] = extend_from_held(inputs, bases.get(name), eps)
